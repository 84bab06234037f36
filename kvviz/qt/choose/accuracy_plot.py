"""The Choose mode's accuracy plot, beside the frontier where the sweep asked questions: each finished configuration's
accuracy (the share of its answers scored right, in %) against its cache memory at the user's target (the frontier's
log axis of bytes, linked to it: the same range), one series of points per regime, the exact cache's accuracy as a
dashed line per regime and the accuracy tolerance below the exact cache's worst regime as a dotted one. The
configurations no other beats on memory and accuracy in the first regime carry their names. Hover names any
configuration; a click picks it (`sigPicked`), as on the frontier.
"""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import Qt

from kvviz.files import frontier
from kvviz.files.sweep import Configuration, Sweep
from kvviz.qt import theme
from kvviz.qt.choose.frontier_plot import ConfigurationsPlot
from kvviz.qt.plots.legend import Entry

# one colour, symbol and size per regime (kvviz.files.qa.REGIMES), the same in both themes; each smaller than the one
# before, drawn over it, so that points of equal accuracy stay visible around each other
REGIME_STYLES = {"query-agnostic": (theme.BLUE, "o", 19), "query-aware": (theme.ORANGE, "s", 11),
                 "decode-time": (theme.GREEN, "d", 9), "multi-turn": (theme.PURPLE, "t", 6)}
MARGIN = 8.0  # accuracy points above 100 % and below 0 %: a point on the edge stays whole


class AccuracyPlot(ConfigurationsPlot):
    title = "Answers right against memory at your target"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.series = {regime: pg.ScatterPlotItem(size=size, pxMode=True, symbol=symbol, brush=pg.mkBrush(colour))
                       for regime, (colour, symbol, size) in REGIME_STYLES.items()}
        self.exact_lines = {regime: pg.InfiniteLine(angle=0, movable=False,
                                                    pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine))
                            for regime, (colour, _, _) in REGIME_STYLES.items()}
        self.tolerance_line = pg.InfiniteLine(angle=0, movable=False)
        for regime in REGIME_STYLES:
            self.plot.addItem(self.exact_lines[regime], ignoreBounds=True)
            self.plot.addItem(self.series[regime])
        self.plot.addItem(self.tolerance_line, ignoreBounds=True)
        self._placed: list[tuple[int, str, float, float]] = []  # (index, regime, log10 bytes, accuracy %) drawn
        self.set_labels("answers right (%)", self.memory_axis())
        self.plot.setLimits(yMin=-MARGIN, yMax=100 + MARGIN)

    def set_covers(self, covers: str) -> None:
        """Stand the points at their caches' memory ("cache") or at the process's peak ("process"), and draw again."""
        self.covers = covers
        self.set_axis_label("bottom", self.memory_axis())
        self.show_sweep(self.sweep)

    def show_sweep(self, sweep: Sweep | None) -> None:
        """Draw each finished configuration's accuracy in each regime the sweep asked (nothing without questions)."""
        if sweep is not self.sweep:
            self.clear_hover()
        self.sweep = sweep
        regimes = sweep.asked.regimes if sweep is not None and sweep.asked else []
        reference = sweep.reference() if regimes else None
        self._placed = []
        for regime in REGIME_STYLES:
            points = []
            if regime in regimes:
                for c in frontier.placed(sweep, self.covers):
                    accuracy = c.accuracy(regime)
                    if accuracy is not None:
                        i = sweep.configurations.index(c)
                        points.append((i, regime, math.log10(max(1, self.memory(c))), 100.0 * accuracy))
            self._placed += points
            self.series[regime].setData([{"pos": (x, y), "data": i} for i, _, x, y in points])
            exact = reference.accuracy(regime) if reference is not None and regime in regimes else None
            self.exact_lines[regime].setVisible(exact is not None)
            if exact is not None:
                self.exact_lines[regime].setPos(100.0 * exact)
        self.name_points(self._best(sweep, regimes[0]) if regimes else [])
        worst = [reference.accuracy(r) for r in regimes] if reference is not None else []
        floor = (min(worst) - sweep.question.accuracy_tolerance) if worst and None not in worst else None
        self.tolerance_line.setVisible(floor is not None and floor > 0)
        if floor is not None:
            self.tolerance_line.setPos(100.0 * floor)
        self.reset_view()
        self.update_legend()

    def _best(self, sweep: Sweep, regime: str) -> list[tuple[Configuration, float, float]]:
        """The configurations no other beats on both memory and accuracy in the first regime asked, named (a name
        for every point would cover the plot); their points' places."""
        placed = sorted(((c, math.log10(max(1, self.memory(c))), 100.0 * c.accuracy(regime)) for c in
                         frontier.placed(sweep, self.covers) if c.accuracy(regime) is not None),
                        key=lambda point: (point[1], -point[2]))
        best, most = [], -1.0
        for config, x, y in placed:
            if y > most:
                best.append((config, x, y))
                most = y
        return best

    def reset_view(self) -> None:
        """0 to 100 %, whatever the zoom was (the memory axis is the frontier's: kvviz.qt.choose.view links them)."""
        self.plot.setYRange(-MARGIN, 100 + MARGIN, padding=0)

    def has_data(self) -> bool:
        return bool(self._placed)

    def apply_palette(self, palette: theme.Palette) -> None:
        super().apply_palette(palette)
        self.tolerance_line.setPen(pg.mkPen(palette.foreground, width=1, style=Qt.PenStyle.DotLine))
        for scatter in self.series.values():
            scatter.setPen(pg.mkPen(palette.background, width=1))
        self.update_legend()

    def legend_entries(self) -> list[Entry]:
        if not self._placed:
            return []
        drawn = [r for r in REGIME_STYLES if any(regime == r for _, regime, _, _ in self._placed)]
        entries = [Entry(regime, REGIME_STYLES[regime][0], kind="marker",
                         tooltip="the share of the configuration's answers scored right in this regime")
                   for regime in drawn]
        entries.append(Entry("exact cache", self.palette_.foreground, style=Qt.PenStyle.DashLine, width=1.0,
                             tooltip="the exact cache's accuracy in each regime, in its colour"))
        if self.tolerance_line.isVisible():
            tolerance = 100 * self.sweep.question.accuracy_tolerance
            entries.append(Entry(f"tolerance ({tolerance:g} points)", self.palette_.foreground,
                                 style=Qt.PenStyle.DotLine, width=1.0,
                                 tooltip="the answer names no configuration below this in any regime asked"))
        return entries

    def placed_points(self) -> list[tuple[int, float, float]]:
        return [(i, x, y) for i, _, x, y in self._placed]

    def fill_export_copy(self, copy: AccuracyPlot) -> None:
        copy.show_sweep(self.sweep)
