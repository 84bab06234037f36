"""The Runs table: one row per run (live, finished, failed or opened), multi-select to overlay."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem, QWidget

from kvviz.attach.request_trace import is_served
from kvviz.qt import theme
from kvviz.qt.series import MIB, RunSeries

COLUMNS = (
    "run",
    "model",
    "strategy",
    "tokens",
    "prefill ms",
    "decode ms (mean)",
    "decode ms (p95)",
    "tokens/s",
    "peak cache MiB",
    "peak RSS MiB",
    "top-1 agree",
    "mean KL",
    "first diverge",
    "status",
)


def _number(value, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def row_values(series: RunSeries, status: str) -> list[str]:
    """The table's text for one run, from the trace's own summary."""
    summary = series.trace.summary()
    strategy = series.label().split(" ", 1)[1]
    served = is_served(series.trace)  # a server's request: timings only, its cache is the server's
    return [
        f"#{series.run_id}",
        str((series.trace.model or {}).get("name", "")),
        strategy,
        str(summary["new_tokens"]),
        _number(summary["prefill_ms"]),
        _number(summary["decode_ms_mean"], 2),
        _number(summary["decode_ms_p95"], 2),
        _number(summary["decode_tokens_per_s"]),
        "–" if served or summary["peak_cache_bytes"] is None else _number(summary["peak_cache_bytes"] / MIB, 3),
        "–" if served or summary["peak_rss_bytes"] is None else _number(summary["peak_rss_bytes"] / MIB, 0),
        # fidelity against the lockstep reference, when the run had one
        _number(summary.get("top1_agreement"), 3),
        _number(summary.get("mean_kl"), 4),
        "–"
        if "mean_kl" not in summary
        else "none"
        if summary["first_divergence"] is None
        else f"step {summary['first_divergence']}",
        status,
    ]


class RunsTable(QTableWidget):
    sigSelectionChanged = Signal(list)  # run ids, in table order

    def __init__(self, parent: QWidget | None = None):
        super().__init__(0, len(COLUMNS), parent)
        self.setHorizontalHeaderLabels(COLUMNS)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().hide()
        self.setAlternatingRowColors(True)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.setToolTip("Select several runs (Ctrl/Shift+click) to overlay them in the plots")
        self._rows: dict[int, int] = {}
        self.itemSelectionChanged.connect(self._selection_changed)

    def add_run(self, series: RunSeries, status: str, select: bool = True) -> None:
        row = self.rowCount()
        self.insertRow(row)
        self._rows[series.run_id] = row
        pixmap = QPixmap(12, 12)
        pixmap.fill(QColor(theme.run_colour(series.run_id)))
        for column, text in enumerate(row_values(series, status)):
            item = QTableWidgetItem(text)
            if column >= 3 and column < len(COLUMNS) - 1:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            if column == 2:
                item.setToolTip(text)
            if column == 0:
                item.setIcon(QIcon(pixmap))
                item.setData(Qt.ItemDataRole.UserRole, series.run_id)
            self.setItem(row, column, item)
        if select:
            self.select_runs([series.run_id])

    def update_run(self, series: RunSeries, status: str) -> None:
        row = self._rows.get(series.run_id)
        if row is None:
            return
        for column, text in enumerate(row_values(series, status)):
            item = self.item(row, column)
            if item.text() != text:
                item.setText(text)
            if column == len(COLUMNS) - 1 and series.trace.error:
                item.setToolTip(series.trace.error)

    def select_runs(self, run_ids: list[int]) -> None:
        self.blockSignals(True)
        self.clearSelection()
        mode = self.selectionMode()
        self.setSelectionMode(QAbstractItemView.SelectionMode.MultiSelection)
        for run_id in run_ids:
            if run_id in self._rows:
                self.selectRow(self._rows[run_id])
        self.setSelectionMode(mode)
        self.blockSignals(False)
        self._selection_changed()

    def selected_runs(self) -> list[int]:
        rows = sorted({index.row() for index in self.selectionModel().selectedRows()})
        return [self.item(r, 0).data(Qt.ItemDataRole.UserRole) for r in rows]

    def row_text(self, run_id: int) -> list[str]:
        row = self._rows[run_id]
        return [self.item(row, c).text() for c in range(self.columnCount())]

    def _selection_changed(self) -> None:
        self.sigSelectionChanged.emit(self.selected_runs())
