"""The errors kvviz reports to its users; every message says what is wrong and what is accepted.

A leaf module (stdlib only), so that the CLI, the engine and the window can all raise and catch these
without importing each other or torch. `failure` turns any exception into the one line a user sees and
keeps its traceback in kvviz's log (the logger "kvviz": `--debug` prints it, the window writes a file).
"""

from __future__ import annotations

import logging

log = logging.getLogger("kvviz")


class UsageError(Exception):
    """A mistake in how kvviz was called (exit status 2)."""


class OptionError(ValueError):
    """A strategy, option or setting the user asked for that cannot be accepted (exit status 2)."""


class ModelError(RuntimeError):
    """A model spec that cannot be loaded or used (exit status 1)."""


def failure(what: str, exc: BaseException) -> str:
    """The one line a user sees about `exc`, which stopped `what` ("h2o (budget=64) in the evaluation"): kvviz's
    own errors as written, anything else with its type; the full traceback goes to the log."""
    if isinstance(exc, (UsageError, OptionError, ModelError)):
        log.info("%s refused: %s", what, exc)
        return str(exc)
    log.error("%s failed", what, exc_info=exc)
    return f"{type(exc).__name__}: {exc}"
