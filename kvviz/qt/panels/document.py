"""Which document a mode reads (a text shipped with kvviz or the user's own .txt/.md file), and how many of its
tokens: the Evaluate and Choose modes' first group of controls."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QLabel, QSpinBox, QVBoxLayout, QWidget

from kvviz.files import documents
from kvviz.files.documents import Document

OPEN_ITEM = "Open text file…"
MAX_TOKENS = 10**7  # as the engine's own limit; a model's context cuts far earlier


class DocumentPanel(QGroupBox):
    """Which document, and how many of its tokens (the whole of it, cut at the model's context, at 0)."""

    sigOpenRequested = Signal()  # "Open text file…" was chosen

    def __init__(self, default_tokens: int, parent: QWidget | None = None):
        super().__init__("Document", parent)
        self.combo = QComboBox()
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(8)  # a long file name must not widen the Controls
        self.combo.setToolTip("A text shipped with kvviz, or your own UTF-8 .txt or .md file")
        self._documents: list[Document] = []
        self._shown = -1
        for name in documents.builtin_names():
            self._add(documents.builtin(name))
        self.combo.addItem(OPEN_ITEM)
        self.combo.activated.connect(self._picked)
        self.tokens = QSpinBox()
        self.tokens.setRange(0, MAX_TOKENS)
        self.tokens.setSingleStep(100)
        self.tokens.setGroupSeparatorShown(True)
        self.tokens.setSpecialValueText("whole document")
        self.tokens.setValue(default_tokens)
        self.tokens.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.tokens.setToolTip(
            "Read the document's first N tokens; 0 for all of it. A document longer than the model's "
            "context is cut at it, and the view says so."
        )
        self.about = QLabel()
        self.about.setObjectName("muted")
        self.about.setWordWrap(True)
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("tokens", self.tokens)
        layout = QVBoxLayout(self)
        layout.addWidget(self.combo)
        layout.addWidget(self.about)
        layout.addLayout(form)
        self.select(0)

    def _add(self, document: Document) -> int:
        shown = document.title or document.name
        self.combo.insertItem(len(self._documents), shown)
        self.combo.setItemData(len(self._documents), document.source, Qt.ItemDataRole.ToolTipRole)
        self._documents.append(document)
        return len(self._documents) - 1

    def _picked(self, index: int) -> None:
        if index >= len(self._documents):  # "Open text file…": the choice stays where it was until a file opens
            self.combo.setCurrentIndex(self._shown)
            self.sigOpenRequested.emit()
            return
        self.select(index)

    def ask(self, dialogs, title: str, show_error, refusal: str) -> None:
        """Ask for a user's .txt or .md file (`dialogs`: the window's file dialogs) and add it (`open_path`)."""
        path = dialogs.open_file("documents", title, "Text and Markdown (*.txt *.md);;All files (*)")
        if path:
            self.open_path(path, show_error, refusal)

    def open_path(self, path, show_error, refusal: str) -> bool:
        """Add a user's .txt or .md file as the text; False, and `show_error` with `refusal` and why, when it cannot
        be used (nothing on screen changes then)."""
        try:
            document = documents.from_file(path)
        except documents.DocumentError as exc:
            show_error(f"{refusal}: {exc}")
            return False
        self.add_document(document)
        return True

    def add_document(self, document: Document) -> None:
        """A user's file, chosen at once (opened again: the list's entry is refreshed)."""
        same = next((i for i, d in enumerate(self._documents) if d.source == document.source), None)
        if same is None:
            same = self._add(document)
        else:
            self._documents[same] = document
        self.select(same)

    def select(self, index: int) -> None:
        self._shown = index
        self.combo.setCurrentIndex(index)
        document = self._documents[index]
        if not document.source.startswith("builtin:"):
            where = "your file"  # its path is the tooltip: a long path would widen the Controls
        elif document.author:
            where = f"by {document.author}, shipped with kvviz"
        else:
            where = "shipped with kvviz"
        # the whole title again, wrapped: the combo box elides it when the Controls are narrow (a scroll bar)
        self.about.setText(f"{document.title or document.name}, {where}; {len(document.text):,} characters")
        self.about.setToolTip(document.source)
        self.combo.setToolTip(f"{document.title or document.name}: a text shipped with kvviz, or your own UTF-8 "
                              ".txt or .md file")

    def show_record(self, record: dict[str, Any], what: str) -> None:
        """The text a kept sweep or evaluation read (its file's document record) chosen here, and its token count:
        a text shipped with kvviz, or a file that still reads as it did. A file that no longer reads leaves the
        choice as it was, and the line under it says which text `what` read and why it is not chosen."""
        source = str(record.get("source") or "")
        if isinstance(record.get("tokens"), int):
            self.tokens.setValue(record["tokens"])
        try:
            self._choose(source)
        except documents.DocumentError as exc:
            name = record.get("title") or record.get("name") or source or "?"
            self.about.setText(f"{what} read {name}, which is not here ({exc}); the text above is the one read next")
            self.about.setToolTip(source)

    def _choose(self, source: str) -> None:
        """The document of `source` chosen: the one listed, else its file read again (DocumentError where it cannot
        be)."""
        known = next((i for i, d in enumerate(self._documents) if d.source == source), None)
        if known is None:
            self.add_document(documents.from_file(source))
        else:
            self.select(known)

    def document(self) -> Document:
        return self._documents[self._shown]

    def token_count(self) -> int | None:
        """The tokens asked for; None for the whole document."""
        return self.tokens.value() or None

    def state(self) -> dict[str, Any]:
        """What the settings keep: the document's source (built in or a file's path) and the token count."""
        return {"source": self.document().source, "tokens": self.tokens.value()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore `state` (a file that cannot be read any more is left out, silently: it was the last session's)."""
        if isinstance(state.get("tokens"), int):
            self.tokens.setValue(state["tokens"])
        source = state.get("source")
        if not isinstance(source, str):
            return
        try:
            self._choose(source)
        except documents.DocumentError:
            pass
