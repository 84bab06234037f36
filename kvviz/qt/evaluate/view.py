"""The "Evaluate" tab: what is evaluated (a line above), log-perplexity and cache memory along the document
(the two plots share their x axis), and one table row per strategy.

The view only draws: `redraw(strategies, header)` takes the evaluation's `StrategySeries` (kept by
kvviz.qt.evaluate.mode) and the line to show. The table's numbers come from the series' running sums, so a
refresh costs the same at the first token and the ten-thousandth.
"""

from __future__ import annotations

import time

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from kvviz.present import CANCELLED, FAILED, RUNNING, UNKNOWN, number
from kvviz.qt import theme
from kvviz.qt.evaluate.plots import EvalMemoryPlot, PerplexityPlot
from kvviz.qt.evaluate.series import StrategySeries
from kvviz.qt.plots.series_plots import share_x_zoom

# (title, right-aligned, tooltip)
COLUMNS = (
    ("strategy", False, "The strategy and the options it sets away from their defaults (hover: all of them)"),
    ("tokens", True, "Predictions made: every document token after the first is predicted from the cache"),
    ("perplexity", True, "exp of the mean negative log-likelihood over every prediction so far"),
    ("2nd half", True, "Perplexity over the second half of the predictions (after a small cache filled, "
                       "what a long document costs)"),
    ("cache MiB", True, "The cache's measured size after the last prediction"),
    ("tokens/s", True, "Predictions per second of forward time (a chunked evaluation scores many per forward; "
                        "strategies read together by kvviz eval --token-by-token share each forward)"),
    ("evicts from", True, "The first position predicted after the cache had dropped a token"),
    ("status", False, "finished, running, cancelled (and why, for a journal of a process that ended), not run "
              "(stopped before it started), or failed and why"),
)
TABLE_REFRESH_S = 0.5  # while evaluating, the rows are rewritten at most this often
TABLE_SHARE = 0.4  # of the tab's height, at most, for the table


def cells(series: StrategySeries) -> list[str]:
    """A strategy's row as the table shows it (unknown values as –, never 0)."""
    total = series.total
    done = f"{series.n:,}" if total is None or series.n == total else f"{series.n:,} of {total:,}"
    cache = series.cache_mib()
    first = series.first_eviction
    status = series.state
    if series.state in (FAILED, CANCELLED) and series.error:  # cancelled with a reason: a journal's
        status = f"{series.state}: {series.error}"
    elif series.state == RUNNING and series.run is not None and series.run.method.get("mode") == "chunked":
        status = f"running (up to {series.run.method.get('chunk')} tokens per forward)"
    return [
        series.short_label(),
        done if series.run is not None else UNKNOWN,
        number(series.perplexity(), 2),
        number(series.second_half_perplexity(), 2),
        UNKNOWN if cache is None else f"{cache:,.2f}",
        number(series.tokens_per_s(), 1),
        UNKNOWN if first is None else f"{first:,}",
        status,
    ]


class EvalTable(QTableWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(0, len(COLUMNS), parent)
        self.setHorizontalHeaderLabels([title for title, _, _ in COLUMNS])
        for column, (_, _, tip) in enumerate(COLUMNS):
            self.horizontalHeaderItem(column).setToolTip(tip)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.verticalHeader().hide()
        self.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)
        self.setAlternatingRowColors(True)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)  # the status, and a failure's message, get the room left
        self._shown: list[int] = []  # id() of the series each row shows
        self._refreshed = 0.0

    def show_series(self, series: list[StrategySeries], live: bool) -> None:
        """One row per strategy; while `live`, the numbers at most every TABLE_REFRESH_S."""
        now = time.perf_counter()
        same = self._shown == [id(s) for s in series]
        if same and live and now - self._refreshed < TABLE_REFRESH_S:
            return
        self._refreshed = now
        if not same:
            self.setRowCount(len(series))
            self._shown = [id(s) for s in series]
            for row, s in enumerate(series):
                for column, (_, right, _) in enumerate(COLUMNS):
                    item = QTableWidgetItem()
                    if right:
                        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                    self.setItem(row, column, item)
                pixmap = QPixmap(12, 12)
                pixmap.fill(QColor(theme.run_colour(s.run_id)))
                self.item(row, 0).setIcon(QIcon(pixmap))
        for row, s in enumerate(series):
            for column, text in enumerate(cells(s)):
                item = self.item(row, column)
                if item.text() != text:
                    item.setText(text)
            self.item(row, 0).setToolTip(s.label())
            self.item(row, len(COLUMNS) - 1).setToolTip(s.error or "")

    def restyle(self) -> None:
        """Make the rows again at the next refresh (their colour icons follow the theme)."""
        self._shown = []

    def row_text(self, row: int) -> list[str]:
        return [self.item(row, c).text() for c in range(self.columnCount())]


class EvalView(QWidget):
    """The central "Evaluate" tab."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.summary = QLabel(
            "Choose a document and strategies under Controls ▸ Evaluate, then press Evaluate: every strategy "
            "reads the document through its own cache, one token at a time, and each next token is scored."
        )
        self.summary.setObjectName("serverSummary")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.perplexity_plot = PerplexityPlot()
        self.memory_plot = EvalMemoryPlot()
        self.memory_plot.show_run_legend = False  # named once, above the perplexity plot (exports name them)
        share_x_zoom([self.perplexity_plot, self.memory_plot])
        self.table = EvalTable()
        self.plots = [self.perplexity_plot, self.memory_plot]
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(self.perplexity_plot)
        self.splitter.addWidget(self.memory_plot)
        self.splitter.addWidget(self.table)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setStretchFactor(0, 5)  # a taller window gives the plots the room, not the table
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setStretchFactor(2, 0)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 0)
        layout.addWidget(self.summary)
        layout.addWidget(self.splitter, 1)

    def redraw(self, series: list[StrategySeries], header: str, live: bool) -> None:
        self.summary.setText(header)
        drawn = [s for s in series if s.run is not None]
        identities = [id(s) for s in drawn]
        for plot in self.plots:
            if identities != self._drawn:  # other series under the same colours: no curve of the old ones stays
                plot.redraw([], None)
            plot.draw_frame(drawn, drawn[-1] if drawn else None)
        self._drawn = identities
        self.table.show_series(series, live)
        if len(series) != self._rows_fitted:
            self._fit_table(len(series))

    _rows_fitted = -1  # the table's height was fitted to this many rows
    _drawn: list[int] = []  # id() of the series the plots show

    def _fit_table(self, rows: int) -> None:
        """The table as tall as its rows (at most TABLE_SHARE of the view); the plots share the rest 5:3."""
        total = sum(self.splitter.sizes())
        if total <= 0:
            return
        table = self.table
        rows_px = max(rows, 1) * table.verticalHeader().defaultSectionSize()
        want = (table.horizontalHeader().sizeHint().height() + rows_px + 2 * table.frameWidth()
                + table.horizontalScrollBar().sizeHint().height())
        want = min(want, int(total * TABLE_SHARE))
        rest = total - want
        self.splitter.setSizes([rest * 5 // 8, rest - rest * 5 // 8, want])
        self._rows_fitted = rows

    def apply_palette(self, palette: theme.Palette) -> None:
        for plot in self.plots:
            plot.apply_palette(palette)
            plot.restyle()
        self.table.restyle()
