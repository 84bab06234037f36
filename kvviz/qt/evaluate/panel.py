"""The Evaluate mode's list of strategies to evaluate (its document is kvviz.qt.panels.document's).

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
    QGroupBox,
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from kvviz.present import strategy_label
from kvviz.qt import theme

DEFAULT_TOKENS = 600
LIST_ROWS = 8  # the strategy list grows up to this many entries, then scrolls


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
            item.setText(strategy_label(strategy, self._defaults))
            item.setToolTip(strategy_label(strategy) if self._defaults else item.text())
            pixmap = QPixmap(12, 12)
            pixmap.fill(QColor(theme.run_colour(i + 1)))
            item.setIcon(QIcon(pixmap))
        self._update_buttons()

    def _update_buttons(self) -> None:
        self.remove_button.setEnabled(self._editable and bool(self.list.selectedItems()))
