"""The Evaluate mode's controls: the document and how many of its tokens, and the strategies to evaluate.

The strategies are chosen with the window's own strategy picker (between the two groups here): "Add"
puts the strategy and options chosen there into the list; each entry is named like `kvviz eval
--strategies` names it (the options set away from their defaults), in the colour its curves will have.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kvviz.files import documents
from kvviz.files.documents import Document
from kvviz.qt import theme
from kvviz.qt.evaluate.series import compact_label, full_label

OPEN_ITEM = "Open text file…"
DEFAULT_TOKENS = 600
LIST_ROWS = 8  # the strategy list grows up to this many entries, then scrolls
MAX_TOKENS = 10**7  # as the engine's own limit; a model's context cuts far earlier


class DocumentPanel(QGroupBox):
    """Which document, and how many of its tokens (the whole of it, cut at the model's context, at 0)."""

    sigOpenRequested = Signal()  # "Open text file…" was chosen

    def __init__(self, parent: QWidget | None = None):
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
        self.tokens.setValue(DEFAULT_TOKENS)
        self.tokens.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.tokens.setToolTip(
            "Evaluate the document's first N tokens; 0 for all of it. A document longer than the model's "
            "context is cut at it, and the Evaluate tab says so."
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
        known = next((i for i, d in enumerate(self._documents) if d.source == source), None)
        if known is not None:
            self.select(known)
            return
        try:
            self.add_document(documents.from_file(source))
        except documents.DocumentError:
            pass


class StrategyListPanel(QGroupBox):
    """The strategies an evaluation runs, in order; each in the colour of its curves."""

    sigChanged = Signal()
    sigAddRequested = Signal()  # "Add": the strategy chosen in the picker above

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Strategies to evaluate", parent)
        self.list = QListWidget()
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.list.setToolTip("Evaluated one after another, top to bottom")
        self.list.itemSelectionChanged.connect(self._update_buttons)
        row = self.list.fontMetrics().height() + 4
        self.list.setMinimumHeight(3 * row + 6)  # three entries, and up to LIST_ROWS before it scrolls
        self.list.setMaximumHeight(LIST_ROWS * row + 6)
        self.add_button = QPushButton("Add")
        self.add_button.setToolTip("Add the strategy and options chosen in Cache strategy above")
        self.add_button.clicked.connect(lambda *_: self.sigAddRequested.emit())
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Remove the strategies selected in the list")
        self.remove_button.clicked.connect(lambda *_: self.remove_selected())
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_button, 1)
        buttons.addWidget(self.remove_button, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.list)
        layout.addLayout(buttons)
        # no taller than its list and buttons: a tall screen's spare room stays below the controls
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self._defaults: dict[str, dict[str, Any]] | None = None
        self._update_buttons()

    def entries(self) -> list[tuple[str, dict[str, Any]]]:
        """(strategy, options) of every entry, in order."""
        return [self.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.list.count())]

    def add(self, name: str, options: dict[str, Any]) -> bool:
        """Add an entry; False (and the entry already there selected) when the list has it."""
        entry = (name, dict(options))
        for i, (other, other_options) in enumerate(self.entries()):
            if other == name and self._same(name, other_options, entry[1]):
                self.list.setCurrentRow(i)
                return False
        item = QListWidgetItem()
        item.setData(Qt.ItemDataRole.UserRole, entry)
        self.list.addItem(item)
        self._name_items()
        self.sigChanged.emit()
        return True

    def set_entries(self, entries: list[tuple[str, dict[str, Any]]]) -> None:
        self.list.clear()
        for name, options in entries:
            self.add(name, options)
        self.sigChanged.emit()

    def remove_selected(self) -> None:
        for item in self.list.selectedItems():
            self.list.takeItem(self.list.row(item))
        self._name_items()
        self.sigChanged.emit()

    def set_defaults(self, defaults: dict[str, dict[str, Any]]) -> None:
        """Every strategy's option defaults (from the engine's listing): entries name only what differs."""
        self._defaults = defaults
        self._name_items()

    def set_enabled(self, editable: bool) -> None:
        """Add and Remove only while nothing is evaluated (the list keeps its colours: the curves' key)."""
        self._editable = editable
        self.add_button.setEnabled(editable)
        self._update_buttons()

    _editable = True

    def restyle(self) -> None:
        """The entries' colours again (after a theme change)."""
        self._name_items()

    def _same(self, name: str, a: dict[str, Any], b: dict[str, Any]) -> bool:
        """Two option sets that make the same strategy (an option left out is at its default)."""
        defaults = (self._defaults or {}).get(name, {})
        return {**defaults, **a} == {**defaults, **b}

    def _name_items(self) -> None:
        for i in range(self.list.count()):
            item = self.list.item(i)
            name, options = item.data(Qt.ItemDataRole.UserRole)
            strategy = {"name": name, "options": {**(self._defaults or {}).get(name, {}), **options}}
            item.setText(compact_label(strategy, self._defaults))
            item.setToolTip(full_label(strategy) if self._defaults else item.text())
            pixmap = QPixmap(12, 12)
            pixmap.fill(QColor(theme.run_colour(i + 1)))
            item.setIcon(QIcon(pixmap))
        self._update_buttons()

    def _update_buttons(self) -> None:
        self.remove_button.setEnabled(self._editable and bool(self.list.selectedItems()))
