"""The Evaluate tab's plots against the position in the document: log-perplexity (a running mean) and
cache memory, one curve per strategy in its colour.

Both are the window's series plots (`SeriesPlot`: curves made once and fed with `setData`, an x range
that grows in steps, the crosshair readout); their `redraw(strategies, primary)` takes the evaluation's
`StrategySeries` objects in place of runs.
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt

from kvviz.qt import theme
from kvviz.qt.evaluate.series import SETTLING, SMOOTHING, X
from kvviz.qt.plots.legend import Entry
from kvviz.qt.plots.series_plots import Curves, MemoryPlot, SeriesPlot
from kvviz.qt.series import nearest_index

POSITION = "position in the document (tokens)"


class DocumentSpan:
    """For the series plots of an evaluation: while it runs, the x range is the document's whole span, so the
    curves grow into a frame that stays still; once it is over, the range fits the data as usual."""

    def _fit_x(self, runs, live: bool) -> None:
        super()._fit_x(runs, live)
        totals = [r.total for r in runs if r.total]
        if not self._follow_x or not totals or not live:
            return
        target = (0.0, float(max(totals) - 1))
        if target != self._x_range:
            self._x_range = target
            self.plot.setXRange(*target, padding=0.02)


class PerplexityPlot(DocumentSpan, SeriesPlot):
    """exp of the curve is the perplexity of the last SMOOTHING predictions: lower reads the text better.

    The y range holds the curves past their first SETTLING predictions (a mean over a few tokens at the start
    of a text runs high and would squash the rest).
    """

    title = f"Log-perplexity along the document: mean NLL of the last {SMOOTHING} tokens"

    def __init__(self, parent=None):
        super().__init__(parent)
        # the unit keeps the window's size: the short form of the label is "nats, 64-token mean"
        self.set_labels(f"log-perplexity (nats, {SMOOTHING}-token mean)", POSITION)

    def y_bounds(self) -> tuple[float, float] | None:
        ranges = [r for r in (s.mean_range() for s in self._runs) if r is not None]
        return (min(lo for lo, _ in ranges), max(hi for _, hi in ranges)) if ranges else None

    def make_curves(self, series):
        colour = theme.run_colour(series.run_id)
        curve = pg.PlotDataItem(pen=pg.mkPen(colour, width=1.5))
        # where the strategy's cache first dropped a token
        eviction = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine))
        eviction.setVisible(False)
        curves = Curves()
        curves.items = [curve, eviction]
        self.plot.addItem(curve)
        self.plot.addItem(eviction, ignoreBounds=True)
        return curves

    def update_curves(self, series, curves):
        curves.items[0].setData(series.column(X), series.running_mean())
        first = series.first_eviction
        if first is not None:
            curves.items[1].setPos(first)
        curves.items[1].setVisible(first is not None)

    def legend_entries(self):
        entries = []
        if any(s.first_eviction is not None for s in self._runs):
            entries.append(Entry("first eviction", self.palette_.foreground, style=Qt.PenStyle.DashLine, width=1.0,
                                 tooltip="the position from which the strategy's cache had dropped a token"))
        bounds = self.y_bounds()  # the range the plot fits exactly once every strategy has finished
        finished = self._runs and all(s.finished for s in self._runs)
        if finished and bounds is not None and any(s.n > SETTLING and float(s.running_mean()[:SETTLING].max())
                                                   > bounds[1] for s in self._runs):
            entries.append(Entry(f"the first {SETTLING} tokens' mean runs above the plot", self.palette_.foreground,
                                 kind="text", tooltip="a mean over a few tokens at the start of a text runs high; "
                                 "the y range holds the rest (hover or zoom out to read it)"))
        return entries

    def hover_text(self, x, y):
        parts = [f"position {x:,.0f}"]
        for series in self._runs:
            i = series.at(x)
            if i is not None:
                mean = series.running_mean()[i]
                parts.append(self.swatch(theme.run_colour(series.run_id), f"{mean:.3f} nats"))
        return " &nbsp; ".join(parts)


class EvalMemoryPlot(DocumentSpan, MemoryPlot):
    """The cache each strategy held after each prediction: measured and predicted, as in the Local run tab
    (a chunked evaluation measures once per chunk)."""

    title = "Cache memory: measured (solid) and predicted (dashed)"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("cache memory (MiB)", POSITION)

    def make_curves(self, series):
        curves = super().make_curves(series)
        if series.sparse:  # measured once per chunk: dots say where, the lines between are not measurements
            curves.items[0].setSymbol("o")
            curves.items[0].setSymbolSize(6)
            curves.items[0].setSymbolBrush(theme.run_colour(series.run_id))
            curves.items[0].setSymbolPen(None)
        return curves

    def update_curves(self, series, curves):
        x, measured, predicted = series.memory()
        curves.items[0].setData(x, measured)
        curves.items[1].setData(x, predicted)

    def after_redraw(self, runs, primary):
        pass  # an evaluation has no prompt: no prefill line

    def prefill_curve(self, series):
        return None  # nor a prefill's allocations

    def hover_text(self, x, y):
        parts = [f"position {x:,.0f}"]
        for series in self._runs:
            positions, measured, predicted = series.memory()
            i = nearest_index(positions, x)
            if i is not None:
                parts.append(self.swatch(theme.run_colour(series.run_id),
                                         f"{measured[i]:.3f} MiB (pred. {predicted[i]:.3f})"))
        return " &nbsp; ".join(parts)
