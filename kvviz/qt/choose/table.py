"""The Choose mode's table: one row per configuration, sorted by its memory at the target (smallest first; the ones
without a memory yet last, in the sweep's order). Selecting a row picks that configuration (`sigPicked`).
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem, QWidget

from kvviz.files import sweep_report
from kvviz.files.sweep import Sweep
from kvviz.present import named_options, options_text

# (key in `sweep_report.cells`, title, right-aligned, tooltip)
COLUMNS = (
    ("strategy", "strategy", False, "The cache strategy"),
    ("options", "options", False, "Its options"),
    ("perplexity", "perplexity", True, "exp of the mean negative log-likelihood over the text"),
    ("change", "change", True, "Perplexity against the exact cache's"),
    ("kl", "KL", True, "Mean KL divergence from the exact cache's next-token distribution (nats)"),
    ("top1", "top-1", True, "Share of predictions whose most likely token is the exact cache's"),
    ("target", "at target", True, "Cache and policy bytes at the target context and number of sequences"),
    ("peak", "serving peak", True, "The process's peak serving one request of the target context up to its first "
                                   "token: the weights and the most its prefill allocated at once, its cache included "
                                   "(pred.: predicted from a request of the text's length)"),
    ("ttft", "TTFT (s)", True, "The time to first token of one request of the target context (pred.: predicted from "
                               "a request of the text's length)"),
    ("fit", "in budget", True, "Sequences of the target length that fit in the budget"),
    ("longest", "longest context", True, "The longest context one sequence reaches within the budget"),
    ("decode", "decode tok/s", True, "One decode step with this cache alone, after the text (median of a few)"),
    ("status", "status", False, "finished, running, waiting, cancelled, or why it failed"),
)

OPTIONS = 1  # the options' column
OPTIONS_CHARS = 28  # its width, in characters


def columns(sweep: Sweep | None) -> tuple[tuple[str, str, bool, str], ...]:
    """The table's columns: `COLUMNS`, and where the sweep asked questions, the answers of each regime after top-1, as
    the command line's table has them (`sweep_report.columns`)."""
    regimes = sweep.asked.regimes if sweep is not None and sweep.asked else []
    at = [key for key, *_ in COLUMNS].index("top1") + 1
    answers = tuple((f"accuracy:{regime}", f"{regime} answers", True,
                     f"Questions answered right, asked {regime} (partial scores count in part)")
                    for regime in regimes)
    return (*COLUMNS[:at], *answers, *COLUMNS[at:])


def cells(sweep: Sweep, index: int, state: str) -> list[str]:
    """A configuration's row as `kvviz choose` writes it (`sweep_report.cells`), its strategy and options apart;
    `state` for one not finished."""
    config = sweep.configurations[index]
    written = sweep_report.cells(sweep, config)
    written.update(strategy=str(config.run.strategy.get("name", "")),
                   options=options_text(named_options(config.run.strategy)),
                   status=f"{config.status}: {config.run.error}" if config.run.error else state)
    return [written[key] for key, *_ in columns(sweep)]


class ChooseTable(QTableWidget):
    sigPicked = Signal(int)  # the sweep index of the row selected

    def __init__(self, parent: QWidget | None = None):
        super().__init__(0, len(COLUMNS), parent)
        self.shown: tuple = ()  # the columns shown
        self._set_columns(COLUMNS)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().hide()
        self.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)
        self.setAlternatingRowColors(True)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        # an eviction policy's options are long: the column keeps a fixed width, the cell's tooltip has them all
        header.setSectionResizeMode(OPTIONS, QHeaderView.ResizeMode.Interactive)
        header.resizeSection(OPTIONS, self.fontMetrics().horizontalAdvance("x") * OPTIONS_CHARS)
        self.rows: list[int] = []  # the sweep index each row shows
        self.itemSelectionChanged.connect(self._picked)

    def _set_columns(self, shown: tuple) -> None:
        if shown == self.shown:
            return
        self.shown = shown
        self.setRowCount(0)  # the rows are made again for the new columns
        self.setColumnCount(len(shown))
        self.setHorizontalHeaderLabels([title for _, title, _, _ in shown])
        for column, (_, _, _, tip) in enumerate(shown):
            self.horizontalHeaderItem(column).setToolTip(tip)

    def show_sweep(self, sweep: Sweep | None, states: list[str], selected: int | None) -> None:
        """One row per configuration by memory at the target; `states`: each one's state in the window's words."""
        self.blockSignals(True)
        try:
            self._set_columns(columns(sweep))
            self.rows = sweep_report.by_memory(sweep) if sweep is not None else []
            self.setRowCount(len(self.rows))
            for row, index in enumerate(self.rows):
                for column, text in enumerate(cells(sweep, index, states[index])):
                    item = self.item(row, column)
                    if item is None:
                        item = QTableWidgetItem()
                        if self.shown[column][2]:
                            item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                        self.setItem(row, column, item)
                    if item.text() != text:
                        item.setText(text)
                self.item(row, 0).setToolTip(sweep.configurations[index].label)
                self.item(row, OPTIONS).setToolTip(self.item(row, OPTIONS).text())
                self.item(row, len(self.shown) - 1).setToolTip(sweep.configurations[index].run.error or "")
            if selected in self.rows:
                self.selectRow(self.rows.index(selected))
            else:
                self.clearSelection()
        finally:
            self.blockSignals(False)

    def _picked(self) -> None:
        rows = {i.row() for i in self.selectedItems()}
        if len(rows) == 1:
            self.sigPicked.emit(self.rows[rows.pop()])

    def row_text(self, row: int) -> list[str]:
        return [self.item(row, c).text() for c in range(self.columnCount())]
