"""The Choose mode's answers, where the sweep asked questions: one branch per configuration (by memory at the target,
as the table), its accuracy per regime, and under it one row per question asked in each regime: the item, right or
wrong (a partial score as its share), the model's answer, what was expected, and in how many layer-heads the cache
still held the needle when the question came. Selecting a configuration's row picks it (`sigPicked`)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTreeWidget, QTreeWidgetItem, QWidget

from kvviz.files import frontier, sweep_report
from kvviz.files.qa import AnswerRecord
from kvviz.files.sweep import Sweep
from kvviz.present import UNKNOWN
from kvviz.qt import theme

# (title, tooltip)
COLUMNS = (
    ("configuration / item", "The configuration and its answers right per regime, then each item it was asked"),
    ("regime", "How the question was fed: query-agnostic, query-aware, decode-time or multi-turn"),
    ("result", "right, wrong, or the share of the references found (scored as the item's metric says)"),
    ("model's answer", "What the model wrote after the answer prefix"),
    ("expected", "The references the answer is scored against"),
    ("needle held", "Layer-heads (attention layers x KV heads) holding every token of the needle when the question "
                    "came"),
)
RESULT = 2
ANSWER_CHARS = 60  # an answer is cut to this in its cell (its tooltip has it whole)
RIGHT, WRONG = theme.GREEN, theme.VERMILLION


def result_text(record: AnswerRecord) -> str:
    """ "right", "wrong", "0.5 right" for a partial score, or why it has none."""
    if record.score is None:
        return f"not answered: {record.error}" if record.error else UNKNOWN
    if record.score >= 1.0:
        return "right"
    return "wrong" if record.score <= 0.0 else f"{record.score:.2g} right"


def held_text(record: AnswerRecord) -> str:
    if record.needle_held is None or record.layer_heads is None:
        return UNKNOWN
    return f"{record.needle_held} of {record.layer_heads}"


def _cut(text: str) -> str:
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= ANSWER_CHARS else one_line[: ANSWER_CHARS - 1] + "…"


class AnswersTree(QTreeWidget):
    sigPicked = Signal(int)  # the sweep index of the configuration selected

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setColumnCount(len(COLUMNS))
        self.setHeaderLabels([title for title, _ in COLUMNS])
        for column, (_, tip) in enumerate(COLUMNS):
            self.headerItem().setToolTip(column, tip)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setAlternatingRowColors(True)
        self.setUniformRowHeights(True)
        self.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.header().setStretchLastSection(True)
        self._shown: tuple = ()  # what is drawn: the sweep and its answers' count (drawn again only when it changes)
        self.itemSelectionChanged.connect(self._picked)

    def show_sweep(self, sweep: Sweep | None) -> None:
        """A branch per configuration that answered, by memory at the target (open where some answer is wrong)."""
        shown = (id(sweep), *(len(c.answers) for c in sweep.configurations)) if sweep is not None else ()
        if shown == self._shown:
            return
        self._shown = shown
        self.blockSignals(True)
        try:
            self.clear()
            if sweep is None or sweep.asked is None:
                return
            items = sweep.asked.items
            for index in sweep_report.by_memory(sweep):
                config = sweep.configurations[index]
                if not config.answers:
                    continue
                accuracy = ", ".join(f"{frontier.accuracy_text(sweep, config, r)} ({r})" for r in sweep.asked.regimes)
                # the configuration and its accuracy across the row: its columns are the answers'
                branch = QTreeWidgetItem([f"{config.label}: {accuracy}"])
                branch.setData(0, Qt.ItemDataRole.UserRole, index)
                branch.setToolTip(0, config.label)
                self.addTopLevelItem(branch)
                branch.setFirstColumnSpanned(True)
                for record in config.answers:
                    item = items[record.item] if record.item < len(items) else None
                    turn = item.turns[record.turn] if item is not None and record.turn < len(item.turns) else None
                    name = item.name if item is not None else f"item {record.item + 1}"
                    if item is not None and len(item.turns) > 1:
                        name += f", question {record.turn + 1}"
                    expected = " | ".join(turn.answers) if turn is not None else UNKNOWN
                    row = QTreeWidgetItem([name, record.regime, result_text(record), _cut(record.answer),
                                           expected, held_text(record)])
                    row.setData(0, Qt.ItemDataRole.UserRole, index)
                    row.setToolTip(3, record.answer)
                    row.setToolTip(2, record.error or "")
                    if record.score is not None:
                        row.setForeground(RESULT, QColor(RIGHT if record.score >= 1.0 else WRONG))
                    branch.addChild(row)
                branch.setExpanded(any(r.score is None or r.score < 1.0 for r in config.answers))
        finally:
            self.blockSignals(False)

    def rows(self) -> list[list[str]]:
        """Every answer row: its configuration's index in the sweep, then its cells (tests)."""
        out = []
        for b in range(self.topLevelItemCount()):
            branch = self.topLevelItem(b)
            for c in range(branch.childCount()):
                child = branch.child(c)
                index = branch.data(0, Qt.ItemDataRole.UserRole)
                out.append([index] + [child.text(i) for i in range(self.columnCount())])
        return out

    def _picked(self) -> None:
        selected = self.selectedItems()
        if len(selected) == 1:
            self.sigPicked.emit(selected[0].data(0, Qt.ItemDataRole.UserRole))
