"""The Choose mode's controls (beside the document panel, kvviz.qt.panels.document): the question (the context each
sequence reaches, how many sequences at once, the memory budget and the quality tolerance) and the configurations
to try (the default grid for the loaded model, each one ticked or not).

The budget and tolerance are the user's words, read by kvviz.files.frontier as `kvviz choose` reads them;
`problem()` says what is wrong with them (with the accepted forms) before a sweep starts.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kvviz.errors import OptionError
from kvviz.files.frontier import BUDGET_FORMS, TOLERANCE_FORMS, parse_budget, parse_tolerance
from kvviz.files.sweep import Question
from kvviz.present import size, strategy_label

DEFAULT_TOKENS = 2000
COVERS = (("cache", "the caches"), ("process", "the whole process"))  # what a budget bounds, as the panel says it
MAX_CONTEXT = 10**8
LIST_ROWS = 10


class QuestionPanel(QGroupBox):
    """Where the cache must serve: the target context, the sequences at once, the budget and the tolerance."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Your question", parent)
        self.context = QSpinBox()
        self.context.setRange(0, MAX_CONTEXT)
        self.context.setSingleStep(1024)
        self.context.setGroupSeparatorShown(True)
        self.context.setSpecialValueText("the model's maximum")
        self.context.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.context.setToolTip("The context length each sequence reaches; memory is given there. 0: the model's "
                                "maximum")
        self.sequences = QSpinBox()
        self.sequences.setRange(1, 1_000_000)
        self.sequences.setGroupSeparatorShown(True)
        self.sequences.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.sequences.setToolTip("How many sequences of that length are served at once")
        self.budget = QLineEdit("free")
        self.budget.setToolTip(f"The memory the caches (or the whole process) may take: {BUDGET_FORMS}")
        self.covers = QComboBox()
        for key, text in COVERS:
            self.covers.addItem(text, key)
        self.covers.setToolTip("What the budget bounds: the sequences' caches, or the whole process serving them (the "
                               "weights, one request's prefill at its peak and the other sequences' caches)")
        self.tolerance = QLineEdit("5%")
        self.tolerance.setToolTip(f"The quality you accept losing: {TOLERANCE_FORMS}")
        form = QFormLayout(self)
        form.addRow("target context", self.context)
        form.addRow("sequences", self.sequences)
        form.addRow("budget", self.budget)
        form.addRow("budget covers", self.covers)
        form.addRow("tolerance", self.tolerance)

    def problem(self) -> str | None:
        """What is wrong with the budget or the tolerance, with the forms accepted; None when both read."""
        try:
            if self.budget.text().strip().lower() != "free":
                parse_budget(self.budget.text())
            parse_tolerance(self.tolerance.text())
        except OptionError as exc:
            return str(exc)
        return None

    def show_question(self, question: Question) -> None:
        """An opened sweep's question, as it was asked (its budget as its bytes, or "free" where it had none)."""
        self.context.setValue(question.context)
        self.sequences.setValue(question.sequences)
        self.budget.setText("free" if question.budget_bytes is None else size(question.budget_bytes).replace(" ", ""))
        self.covers.setCurrentIndex(self.covers.findData(question.budget_covers))
        tolerance = question.tolerance
        self.tolerance.setText(f"{100 * tolerance.value:g}%" if tolerance.kind == "perplexity" else
                               f"kl={tolerance.value:g}")

    def question(self) -> dict[str, Any]:
        """The runner's request fields: context (None: the model's maximum), sequences, budget, what it covers,
        tolerance."""
        return {"context": self.context.value() or None, "sequences": self.sequences.value(),
                "budget": self.budget.text().strip(), "budget_covers": self.covers.currentData(),
                "tolerance": self.tolerance.text().strip()}


class ConfigurationsPanel(QGroupBox):
    """The configurations a sweep tries: the default grid for the loaded model and the tokens measured, each
    ticked (tried) or not; the exact cache is always tried (every other is compared with it)."""

    sigChanged = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Configurations to try", parent)
        self.list = QListWidget()
        row = self.list.fontMetrics().height() + 4
        self.list.setMinimumHeight(4 * row + 6)
        self.list.setMaximumHeight(LIST_ROWS * row + 6)
        self.list.setToolTip("The default grid for this model: untick what you do not want to try")
        self.list.itemChanged.connect(lambda *_: self.sigChanged.emit())
        self.opened = False  # the list shows an opened sweep's configurations, not the default grid
        self.about = QLabel("Load a model: its default grid is listed here.")
        self.about.setObjectName("muted")
        self.about.setWordWrap(True)
        self.all_button = QPushButton("Tick all")
        self.all_button.setToolTip("Try every configuration of the default grid")
        self.all_button.clicked.connect(lambda *_: self.tick_all())
        layout = QVBoxLayout(self)
        layout.addWidget(self.list)
        layout.addWidget(self.about)
        layout.addWidget(self.all_button)

    def set_grid(self, entries: list[tuple[str, dict[str, Any]]], skipped: list[str], opened: bool = False) -> None:
        """The default grid (ticked as before where an entry was listed already, else ticked), or with `opened` an
        opened sweep's configurations (all ticked)."""
        unticked = {_label(*e) for e in self._entries(Qt.CheckState.Unchecked)} if not self.opened else set()
        self.opened = opened
        self.list.blockSignals(True)
        self.list.clear()
        for name, options in entries:
            item = QListWidgetItem(_label(name, options))
            item.setData(Qt.ItemDataRole.UserRole, (name, dict(options)))
            exact = name == "dynamic"
            flags = item.flags() | Qt.ItemFlag.ItemIsUserCheckable
            item.setFlags(flags & ~Qt.ItemFlag.ItemIsEnabled if exact else flags)
            item.setCheckState(Qt.CheckState.Unchecked if item.text() in unticked and not exact
                               else Qt.CheckState.Checked)
            if exact:
                item.setToolTip("The exact cache: always tried, every other configuration is compared with it")
            self.list.addItem(item)
        self.list.blockSignals(False)
        left_out = f"; left out: {'; '.join(skipped)}" if skipped else ""
        self.about.setText(f"{len(entries)} configurations in the default grid{left_out}")
        self.about.setToolTip("\n".join(skipped))
        self.sigChanged.emit()

    def show_configurations(self, entries: list[tuple[str, dict[str, Any]]]) -> None:
        """An opened sweep's configurations, ticked (Choose tries them again; the tokens changed, or a model loaded,
        bring the default grid back)."""
        self.opened = True  # every one ticked
        self.set_grid(entries, [], opened=True)
        self.about.setText(f"the opened sweep's {len(entries)} configurations; change the tokens for the default grid")

    def tick_all(self) -> None:
        for i in range(self.list.count()):
            self.list.item(i).setCheckState(Qt.CheckState.Checked)

    def chosen(self) -> list[tuple[str, dict[str, Any]]]:
        """(strategy, options) of every ticked configuration, in the list's order."""
        return self._entries(Qt.CheckState.Checked)

    def _entries(self, state: Qt.CheckState) -> list[tuple[str, dict[str, Any]]]:
        items = (self.list.item(i) for i in range(self.list.count()))
        return [item.data(Qt.ItemDataRole.UserRole) for item in items if item.checkState() == state]

    def set_enabled(self, editable: bool) -> None:
        self.list.setEnabled(editable)
        self.all_button.setEnabled(editable)


def _label(name: str, options: dict[str, Any]) -> str:
    return strategy_label({"name": name, "options": options})
