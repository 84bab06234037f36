"""Plots against tokens in context: what they share (`SeriesPlot`), cache memory (measured and predicted), fidelity;
step latency has its own module (latency_plot)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from kvviz.present import MIB
from kvviz.qt import theme
from kvviz.qt.plots.base import PlotPanel, marker_line
from kvviz.qt.plots.legend import Entry
from kvviz.qt.series import (
    CACHE_MIB,
    FIXED_CROSS,
    FIXED_MIB,
    KL,
    PREDICTED_MIB,
    RunSeries,
    X,
    nearest_index,
)


class Curves:
    """The items one run owns in one plot."""

    def __init__(self):
        self.items: list[pg.GraphicsObject] = []
        self.drawn_n = -1
        self.prefill: float | None = None
        self.switch_lines: list[pg.InfiniteLine] = []
        self.pauses: dict[str, pg.InfiniteLine] = {}  # one-time pauses marked: "warm-up", "compile"


class SeriesPlot(PlotPanel):
    crosshair_line = True

    def __init__(self, parent=None):
        super().__init__(parent)
        self.plot.setClipToView(True)
        self.plot.setDownsampling(auto=True, mode="peak")
        self._curves: dict[int, Curves] = {}
        # While a run is live the x and y ranges grow in steps of 25 %, not with every token: a range
        # change makes pyqtgraph rebuild and repaint the axes, the largest part of a live frame (the
        # memory plot's paint took 15-22 ms with y fitted every frame, 9-11 ms stepped). A finished run
        # is fitted exactly. Zooming or panning by hand stops both.
        self.plot.enableAutoRange(x=False, y=False)
        self._follow_x = self._follow_y = True
        self._x_range: tuple[float, float] | None = None
        self._y_range: tuple[float, float] | None = None
        self._shown: tuple[int, ...] = ()
        self.x_partners: list[SeriesPlot] = []  # plots that zoom and pan along x with this one (share_x_zoom)
        self.plot.vb.sigRangeChangedManually.connect(self._manual)

    def _manual(self, *_):
        self._follow_x = self._follow_y = False
        x_range = self.plot.vb.viewRange()[0]
        for partner in self.x_partners:  # their y ranges go on following their data
            partner._follow_x = False
            partner.plot.setXRange(*x_range, padding=0)

    def x_span(self, series: RunSeries) -> tuple[float, float]:
        """The first and last x a run draws at."""
        x = series.column(X)
        return float(x[0]), float(x[-1])

    def reset_view(self) -> None:
        for plot in (self, *self.x_partners):
            plot.follow()
            plot._fit(plot._runs)

    def follow(self) -> None:
        """Let the ranges follow the data again (after a manual zoom)."""
        self._follow_x = self._follow_y = True
        self._x_range = self._y_range = None

    def y_bounds(self) -> tuple[float, float] | None:
        """The lowest and highest y the range should hold (None: nothing drawn): all the data by default."""
        bounds = self.plot.vb.childrenBounds()[1]
        return (float(bounds[0]), float(bounds[1])) if bounds is not None else None

    def _fit(self, runs) -> None:
        live = any(not r.finished for r in runs)
        self._fit_x(runs, live)
        self._fit_y(live)

    def _fit_y(self, live: bool) -> None:
        bounds = self.y_bounds() if self._follow_y else None
        if bounds is None:
            return
        lo, hi = bounds
        current = self._y_range
        if live and current is not None and current[0] <= lo and hi <= current[1]:
            return
        target = (lo, hi + 0.25 * max(hi - lo, abs(hi) * 0.05)) if live else (lo, hi)
        if target == current:
            return
        self._y_range = target
        self.plot.setYRange(*target, padding=0.05)

    def _fit_x(self, runs, live: bool) -> None:
        shown = tuple(r.run_id for r in runs)
        if shown != self._shown:
            self._shown = shown
            self.follow()
        if not self._follow_x:
            return
        spans = [self.x_span(r) for r in runs if r.n]
        if not spans:
            return
        lo = min(a for a, _ in spans)
        hi = max(b for _, b in spans)
        current = self._x_range
        if live and current is not None and current[0] == lo and hi <= current[1]:
            return
        width = max(hi - lo, 8.0)
        target = (lo, lo + width * (1.25 if live else 1.0))  # finished: fit the data exactly
        if target == current:
            return
        self._x_range = target
        self.plot.setXRange(*self._x_range, padding=0.02)

    def redraw(self, runs, primary) -> None:
        super().redraw(runs, primary)
        shown = {r.run_id for r in runs}
        for run_id in list(self._curves):
            if run_id not in shown:
                self._remove(self._curves.pop(run_id))
        for series in runs:
            curves = self._curves.get(series.run_id)
            if curves is None:
                curves = self._curves[series.run_id] = self.make_curves(series)
            if curves.drawn_n != series.n:
                self.update_curves(series, curves)
                curves.drawn_n = series.n
            self._mark_switches(series, curves)
        self._fit(runs)
        self.after_redraw(runs, primary)

    def _remove(self, curves: Curves) -> None:
        for item in curves.items + curves.switch_lines + list(curves.pauses.values()):
            self.plot.removeItem(item)

    def marks(self, series: RunSeries) -> bool:
        """Whether this plot marks the run's switches (it draws data of the run)."""
        return True

    def _mark_switches(self, series: RunSeries, curves: Curves) -> None:
        """A labelled vertical line, in the run's colour, where the run switched strategy."""
        if not self.marks(series):
            return
        colour = theme.run_colour(series.run_id)
        for x, strategy in series.switches[len(curves.switch_lines) :]:
            line = marker_line(colour, Qt.PenStyle.DashDotLine, f"→ {strategy}", 0.92, x)
            self.plot.addItem(line, ignoreBounds=True)
            curves.switch_lines.append(line)

    def switch_positions(self, run_id: int) -> list[float]:
        """x of each switch marker drawn for a run (tests)."""
        curves = self._curves.get(run_id)
        return [line.value() for line in curves.switch_lines] if curves else []

    def restyle(self) -> None:
        """Recreate items with the current palette (after a theme change)."""
        for run_id in list(self._curves):
            self._remove(self._curves.pop(run_id))
        if self._runs:
            self.redraw(self._runs, self._primary)

    def make_curves(self, series: RunSeries) -> Curves:
        raise NotImplementedError

    def update_curves(self, series: RunSeries, curves: Curves) -> None:
        raise NotImplementedError

    def after_redraw(self, runs, primary) -> None:
        pass

    def curve_data(self, run_id: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """(x, y) of each curve of a run that draws something, for tests and readouts (the memory plot's fixed part
        only where the run has one)."""
        curves = self._curves.get(run_id)
        if curves is None:
            return []
        data = [item.getOriginalDataset() for item in curves.items if isinstance(item, pg.PlotDataItem)]
        return [(x, y) for x, y in data if x is not None]

    @staticmethod
    def nearest(series: RunSeries, x: float) -> int | None:
        return nearest_index(series.column(X), x)


def share_x_zoom(plots: list[SeriesPlot]) -> None:
    """Zooming or panning one of `plots` along x by hand does the same to the others, and a double-click fits
    them all again. While they follow the data each fits its own x range (the same data, the same steps).

    Not a pyqtgraph X link: a linked plot repaints whenever its leader's view changes, and while a run
    decodes that was 15 ms of each 40 ms frame of the local view here (measured event by event)."""
    for plot in plots:
        plot.x_partners = [p for p in plots if p is not plot]


MEASURED_WIDTH = 3.0  # px: the measured memory line, wide enough to show the prediction inside it
PREDICTED_WIDTH = 1.2


PREFILL_ALPHA = 60  # of 255: the prefill's allocations, shaded under their line


class MemoryPlot(SeriesPlot):
    title = "Cache memory: measured (solid) and predicted (dashed); the prefill's allocations (shaded)"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("cache memory (MiB)", "tokens in context")
        self.prefill_line = marker_line("#999999", Qt.PenStyle.DotLine, "prefill", 0.5)
        self.prefill_line.setVisible(False)
        self.plot.addItem(self.prefill_line, ignoreBounds=True)

    def prefill_curve(self, series) -> tuple[np.ndarray, np.ndarray] | None:
        """The run's prefill's allocations as drawn (`RunSeries.prefill_curve`), None where it has none."""
        return series.prefill_curve()

    def x_span(self, series):
        # a run whose prefill's allocations are drawn starts where its prefill started, at 0
        first, last = super().x_span(series)
        return (0.0 if self.prefill_curve(series) is not None else first), last

    def y_bounds(self):
        # with a fixed part drawn, from 0: the dotted line is then a floor with the growing part over it, not a
        # line lost on the axis at the bottom of the range
        bounds = super().y_bounds()
        if bounds is None or not any(series.fixed_kind for series in self._runs):
            return bounds
        return 0.0, bounds[1]

    def legend_entries(self):
        colour = self.palette_.foreground
        entries = [
            Entry("measured", colour, width=MEASURED_WIDTH),
            Entry("predicted", colour, style=Qt.PenStyle.DashLine, width=PREDICTED_WIDTH),
        ]
        if any(self.prefill_curve(series) is not None for series in self._runs):
            entries.append(Entry("prefill's allocations, ★ their peak", colour, style=Qt.PenStyle.DashDotLine,
                                 width=PREDICTED_WIDTH, tooltip="what the prefill had allocated beside the weights "
                                 "and what was there before it (its activations, the logits, the cache it built), "
                                 "every allocation counted, over the prefill's time drawn across the prompt's "
                                 "tokens; it ends where the cache it left begins"))
        kinds = {series.fixed_kind for series in self._runs} - {None}
        if kinds:
            entries.append(Entry("of it " + " or ".join(sorted(kinds)), colour, style=Qt.PenStyle.DotLine,
                                 width=PREDICTED_WIDTH, tooltip="the part that does not grow with the tokens "
                                 "generated: linear-attention and state-space layers' states, or an encoder-decoder's "
                                 f"{FIXED_CROSS} keys and values of the prompt; the rest grows with every token"))
        return entries

    def make_curves(self, series):
        # The prediction often equals the measurement: drawn thin, dashed and lighter on top of the wide
        # measured line, it stays visible inside it.
        colour = theme.run_colour(series.run_id)
        dashed = pg.mkColor(theme.mix(colour, self.palette_.foreground, 0.6))
        dashed.setAlpha(self.palette_.predicted_alpha)
        measured = pg.PlotDataItem(pen=pg.mkPen(colour, width=MEASURED_WIDTH))
        predicted = pg.PlotDataItem(pen=pg.mkPen(dashed, width=PREDICTED_WIDTH, style=Qt.PenStyle.DashLine))
        predicted.setZValue(measured.zValue() + 1)
        fixed = pg.PlotDataItem(pen=pg.mkPen(colour, width=PREDICTED_WIDTH, style=Qt.PenStyle.DotLine))
        shade = pg.mkColor(colour)
        shade.setAlpha(PREFILL_ALPHA)
        prefill = pg.PlotDataItem(pen=pg.mkPen(colour, width=PREDICTED_WIDTH, style=Qt.PenStyle.DashDotLine),
                                  fillLevel=0.0, brush=pg.mkBrush(shade))
        peak = pg.ScatterPlotItem(symbol="star", size=14, pen=pg.mkPen(self.palette_.foreground),
                                  brush=pg.mkBrush(colour))
        curves = Curves()
        curves.items = [measured, predicted, fixed, prefill, peak]
        for item in curves.items:
            self.plot.addItem(item)
        return curves

    def update_curves(self, series, curves):
        x = series.column(X)
        curves.items[0].setData(x, series.column(CACHE_MIB))
        curves.items[1].setData(x, series.column(PREDICTED_MIB))
        if series.fixed_kind:
            curves.items[2].setData(x, series.column(FIXED_MIB))
        curve = self.prefill_curve(series)
        if curve is not None:
            curves.items[3].setData(*curve)
            top = int(np.argmax(curve[1]))
            curves.items[4].setData([curve[0][top]], [curve[1][top]])

    def after_redraw(self, runs, primary):
        if primary is not None and primary.prefill_x is not None:
            self.prefill_line.setPos(primary.prefill_x)
            self.prefill_line.setVisible(True)
        else:
            self.prefill_line.setVisible(False)

    def hover_text(self, x, y):
        parts = [f"{x:.0f} tokens"]
        for series in self._runs:
            curve = self.prefill_curve(series)
            if curve is not None and x < series.prefill_x:
                j = nearest_index(curve[0], x)
                parts.append(self.swatch(theme.run_colour(series.run_id), f"prefill: {curve[1][j]:.1f} MiB allocated "
                                         f"(its peak {series.prefill_peak_bytes / MIB:.1f} MiB)"))
                continue
            i = self.nearest(series, x)
            if i is not None:
                measured = series.column(CACHE_MIB)[i]
                predicted = series.column(PREDICTED_MIB)[i]
                text = f"{measured:.3f} MiB (pred. {predicted:.3f})"
                if series.fixed_kind:
                    fixed = series.column(FIXED_MIB)[i]
                    text += f", {measured - fixed:.3f} growing + {fixed:.3f} {series.fixed_kind}"
                parts.append(self.swatch(theme.run_colour(series.run_id), text))
        return " &nbsp; ".join(parts)


class FidelityPlot(SeriesPlot):
    """KL(reference || run) per step, for runs that ran a full-precision reference in lockstep."""

    title = "Fidelity: KL divergence from the exact cache"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("KL (nats)", "tokens in context")

    def marks(self, series):
        return series.has_reference

    def has_data(self) -> bool:
        return any(series.has_reference for series in self._runs)

    def make_curves(self, series):
        curve = pg.PlotDataItem(pen=pg.mkPen(theme.run_colour(series.run_id), width=1), connect="finite")
        curves = Curves()
        curves.items = [curve]
        self.plot.addItem(curve)
        return curves

    def update_curves(self, series, curves):
        curves.items[0].setData(series.column(X), series.column(KL))

    def hover_text(self, x, y):
        parts = [f"{x:.0f} tokens"]
        for series in self._runs:
            i = self.nearest(series, x)
            if i is not None and series.has_reference:
                parts.append(self.swatch(theme.run_colour(series.run_id), f"KL {series.column(KL)[i]:.4f}"))
        return " &nbsp; ".join(parts)
