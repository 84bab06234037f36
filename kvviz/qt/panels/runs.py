"""The Runs table: one row per run in the run store (live, finished, failed or opened); its selection is
the store's selection of runs to overlay.

The figures and the status come first (kvviz.present.RUN_TABLE): in a narrow window they show without scrolling.
The strategy column takes the room they leave in view, at least STRATEGY_MIN_CHARS wide: a longer label (a
quantized run's six options) is cut with "…" and shown whole as the cell's tooltip; the columns after it scroll.
"""

from __future__ import annotations

import time

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem, QWidget

from kvviz.present import RUN_TABLE, RUN_TABLE_HELP, run_cells, run_row
from kvviz.qt import theme
from kvviz.qt.run_store import RunStore

COLUMNS = tuple(title for title, _, _ in RUN_TABLE)
STRATEGY = COLUMNS.index("strategy")
STRATEGY_MIN_CHARS = 24  # the strategy column is never cut narrower than this many average characters
LIVE_REFRESH_S = 0.5  # a row's numbers come from Trace.summary() (linear in the steps): twice a second is enough


class RunsTable(QTableWidget):
    def __init__(self, store: RunStore, parent: QWidget | None = None):
        super().__init__(0, len(COLUMNS), parent)
        self.store = store
        self.setHorizontalHeaderLabels(COLUMNS)
        for column, title in enumerate(COLUMNS):
            if title in RUN_TABLE_HELP:
                self.horizontalHeaderItem(column).setToolTip(RUN_TABLE_HELP[title])
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().hide()
        self.setAlternatingRowColors(True)
        self.setWordWrap(False)  # a long label is cut with "…" on its one line, never wrapped out of sight
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(STRATEGY, QHeaderView.ResizeMode.Interactive)  # sized by _fit_strategy
        header.setStretchLastSection(True)
        header.sectionResized.connect(self._column_resized)
        self.setToolTip("Select several runs (Ctrl/Shift+click) to overlay them in the plots")
        self._rows: dict[int, int] = {}
        self._stale: set[int] = set()  # rows whose numbers are older than the store's
        self._refreshed = 0.0
        self.itemSelectionChanged.connect(self._selection_changed)
        store.sigRunAdded.connect(self._add_run)
        store.sigRunRemoved.connect(self._remove_run)
        store.sigShownChanged.connect(self._show_selection)

    def _cells(self, run_id: int) -> list[str]:
        return run_cells(run_row(f"#{run_id}", self.store.runs[run_id].trace, self.store.status(run_id)))

    def _add_run(self, run_id: int) -> None:
        row = self.rowCount()
        self.insertRow(row)
        self._rows[run_id] = row
        pixmap = QPixmap(12, 12)
        pixmap.fill(QColor(theme.run_colour(run_id)))
        for column, text in enumerate(self._cells(run_id)):
            item = QTableWidgetItem(text)
            if RUN_TABLE[column][2]:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            if COLUMNS[column] == "strategy":
                item.setToolTip(text)
            if COLUMNS[column] == "status" and self.store.runs[run_id].trace.error:  # a file of a run that failed
                item.setToolTip(self.store.runs[run_id].trace.error)  # (or a journal: why it stopped)
            if column == 0:
                item.setIcon(QIcon(pixmap))
                item.setData(Qt.ItemDataRole.UserRole, run_id)
            self.setItem(row, column, item)
        self._fit_strategy()

    def _remove_run(self, run_id: int) -> None:
        row = self._rows.pop(run_id, None)
        if row is None:
            return
        self.blockSignals(True)  # the store chooses what is shown after a withdrawal
        self.removeRow(row)
        self.blockSignals(False)
        self._rows = {r: i if i < row else i - 1 for r, i in self._rows.items()}
        self._stale.discard(run_id)

    def refresh(self, live: bool) -> None:
        """Rewrite the rows whose run changed: while a run is live at most every LIVE_REFRESH_S, else now."""
        self._stale |= self.store.take_changed()
        now = time.perf_counter()
        if not self._stale or (live and now - self._refreshed < LIVE_REFRESH_S):
            return
        # Each cell's change, announced alone, made the header fit every ResizeToContents column to all the rows again
        # before the next cell was set (about 4 ms a live row with 20 rows); announced once per row, they fit once.
        model = self.model()
        stale = [(run_id, self._rows[run_id]) for run_id in self._stale]
        model.blockSignals(True)
        try:
            for run_id, row in stale:
                for column, text in enumerate(self._cells(run_id)):
                    item = self.item(row, column)
                    if item.text() != text:
                        item.setText(text)
                        if COLUMNS[column] == "strategy":
                            item.setToolTip(text)
                error = self.store.runs[run_id].trace.error
                if error:
                    self.item(row, COLUMNS.index("status")).setToolTip(error)
        finally:
            model.blockSignals(False)
        for _, row in stale:
            model.dataChanged.emit(model.index(row, 0), model.index(row, len(COLUMNS) - 1), [])
        self._stale.clear()
        self._refreshed = now
        self._fit_strategy()

    # -- the strategy column's width ----------------------------------------------------------------------

    def _fit_strategy(self) -> None:
        """The strategy column as wide as its longest label, at most the room the columns before it leave in view
        (at least STRATEGY_MIN_CHARS wide)."""
        header = self.horizontalHeader()
        before = sum(header.sectionSize(column) for column in range(STRATEGY))
        room = self.viewport().width() - before
        least = self.fontMetrics().averageCharWidth() * STRATEGY_MIN_CHARS
        longest = max(self.sizeHintForColumn(STRATEGY), header.sectionSizeHint(STRATEGY))
        width = min(longest, max(room, least))
        if header.sectionSize(STRATEGY) != width:
            header.resizeSection(STRATEGY, width)

    def _column_resized(self, column: int, old: int, new: int) -> None:
        if column < STRATEGY:  # a figure grew or shrank: the strategy gets the room left
            self._fit_strategy()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit_strategy()

    def select_runs(self, run_ids: list[int]) -> None:
        """Select these runs' rows, as a user would (the store's selection follows)."""
        self._select(run_ids)
        self._selection_changed()

    def _show_selection(self, run_ids: list[int]) -> None:
        if run_ids != self.selected_runs():
            self._select(run_ids)

    def _select(self, run_ids: list[int]) -> None:
        self.blockSignals(True)
        self.clearSelection()
        mode = self.selectionMode()
        self.setSelectionMode(QAbstractItemView.SelectionMode.MultiSelection)
        for run_id in run_ids:
            if run_id in self._rows:
                self.selectRow(self._rows[run_id])
        self.setSelectionMode(mode)
        self.blockSignals(False)

    def selected_runs(self) -> list[int]:
        rows = sorted({index.row() for index in self.selectionModel().selectedRows()})
        return [self.item(r, 0).data(Qt.ItemDataRole.UserRole) for r in rows]

    def run_ids(self) -> list[int]:
        """Every run in the table, in table order."""
        return [self.item(r, 0).data(Qt.ItemDataRole.UserRole) for r in range(self.rowCount())]

    def row_text(self, run_id: int) -> list[str]:
        row = self._rows[run_id]
        return [self.item(row, c).text() for c in range(self.columnCount())]

    def cell(self, run_id: int, column: str) -> str:
        """The text of one cell, by its column's title."""
        return self.item(self._rows[run_id], COLUMNS.index(column)).text()

    def _selection_changed(self) -> None:
        self.store.show(self.selected_runs())
