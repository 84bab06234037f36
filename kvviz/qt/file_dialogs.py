"""File dialogs that open where the user last was, for each kind of file.

Every open, save and folder dialog of the window names the kind of file it asks for (`KINDS`); it starts in the
folder the last file (or folder) of that kind was chosen in, kept in the window's QSettings under
"folders/<kind>" between sessions. A kind never chosen yet, or whose folder is gone, starts where Qt starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QFileDialog, QWidget

KINDS = {
    "kept": "kvviz files: traces, evaluations and server sessions (opened and saved)",
    "prompts": "prompt text files",
    "documents": "documents to evaluate on (.txt, .md)",
    "tables": "CSV exports",
    "evaluations": "folders evaluations are saved into",
    "sweeps": "folders sweeps are saved into",
    "questions": "question files a sweep asks (JSONL, kept conversations)",
    "images": "window pictures",
    "recordings": "recordings of the window",
    "models": "model folders and GGUF files (local and served)",
}


class FileDialogs:
    """QFileDialog's open, save and folder dialogs, each starting in the folder last used for its kind."""

    def __init__(self, settings: QSettings, parent: QWidget):
        self.settings = settings
        self.parent = parent

    def start(self, kind: str) -> str:
        """The folder a dialog for `kind` starts in: the last one used, if it still exists; else "" (Qt's own)."""
        folder = str(self.settings.value(_key(kind), "") or "")
        return folder if folder and Path(folder).is_dir() else ""

    def remember(self, kind: str, path: str) -> None:
        """A file of `kind` was chosen at `path` (a file, or a folder chosen as such): its folder is where the next
        dialog for `kind` starts."""
        if path:
            self.settings.setValue(_key(kind), str(Path(path).resolve().parent))

    def open_file(self, kind: str, caption: str, filters: str) -> str:
        """The file chosen to open ("" when cancelled)."""
        path, _ = QFileDialog.getOpenFileName(self.parent, caption, self.start(kind), filters)
        self.remember(kind, path)
        return path

    def save_file(self, kind: str, caption: str, name: str, filters: str) -> str:
        """Where to save a file first named `name` ("" when cancelled)."""
        start = self.start(kind)
        path, _ = QFileDialog.getSaveFileName(self.parent, caption, os.path.join(start, name) if start else name,
                                              filters)
        self.remember(kind, path)
        return path

    def folder(self, kind: str, caption: str) -> str:
        """The folder chosen ("" when cancelled); the next dialog starts beside it, in its parent."""
        path = QFileDialog.getExistingDirectory(self.parent, caption, self.start(kind))
        self.remember(kind, path)
        return path


def _key(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"no kind of file {kind!r}; one of {', '.join(KINDS)}")
    return f"folders/{kind}"
