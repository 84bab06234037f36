"""The window's log file: each failure's traceback (kvviz.errors.failure), where a user or a bug report finds it."""

from __future__ import annotations

import logging
import os
from logging.handlers import RotatingFileHandler
from pathlib import Path

import platformdirs


def log_path() -> Path:
    """kvviz.log in the user's log folder (KVVIZ_LOG_DIR overrides it)."""
    return Path(os.environ.get("KVVIZ_LOG_DIR") or platformdirs.user_log_dir("kvviz")) / "kvviz.log"


def keep_log() -> None:
    """Write kvviz's log to `log_path()`, rotated at 1 MB; where that folder cannot be written, it is not kept."""
    path = log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(path, maxBytes=1_000_000, backupCount=2, encoding="utf-8")
    except OSError:
        return
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("kvviz")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
