"""The curves of the configuration picked on the frontier, along the text: its running perplexity (the exact
cache's beside it), its running mean KL divergence from the exact cache, and the cache bytes it measured
(the exact cache's beside it). Each is a plot of the window's (`PlotPanel`) fed with `show_config(sweep, index)`.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from kvviz.files.sweep import Configuration, Sweep
from kvviz.present import MIB
from kvviz.qt import theme
from kvviz.qt.plots.base import PlotPanel
from kvviz.qt.plots.legend import Entry

POSITION = "position in the text (tokens)"
PICKED = 1  # the picked configuration's colour: the first run colour


class AlongTextPlot(PlotPanel):
    """One measure of the picked configuration along the text, and (`with_reference`) the exact cache's."""

    with_reference = True
    export_aspect = 0.5

    def __init__(self, parent=None):
        super().__init__(parent)
        self.sweep: Sweep | None = None
        self.index: int | None = None
        self.curve = pg.PlotDataItem()
        self.reference_curve = pg.PlotDataItem()
        self.plot.addItem(self.reference_curve)
        self.plot.addItem(self.curve)

    def values(self, config: Configuration) -> tuple[np.ndarray, np.ndarray]:
        """(positions, values) of this measure; NaN where it was not measured."""
        raise NotImplementedError

    def show_config(self, sweep: Sweep | None, index: int | None) -> None:
        self.sweep, self.index = sweep, index
        config = self.config()
        reference = sweep.reference() if sweep is not None and self.with_reference else None
        if reference is config:
            reference = None
        for item, shown in ((self.curve, config), (self.reference_curve, reference)):
            if shown is None or not shown.run.records:
                item.setData([], [])
            else:
                x, y = self.values(shown)
                keep = np.isfinite(y)
                item.setData(x[keep], y[keep])
        self.plot.enableAutoRange()
        self.update_legend()

    def config(self) -> Configuration | None:
        if self.sweep is None or self.index is None or self.index >= len(self.sweep.configurations):
            return None
        return self.sweep.configurations[self.index]

    def has_data(self) -> bool:
        config = self.config()
        return config is not None and bool(config.run.records)

    def apply_palette(self, palette: theme.Palette) -> None:
        super().apply_palette(palette)
        self.curve.setPen(pg.mkPen(theme.run_colour(PICKED, palette), width=2))
        self.reference_curve.setPen(pg.mkPen(palette.muted, width=1.5, style=Qt.PenStyle.DashLine))

    def legend_entries(self) -> list[Entry]:
        config = self.config()
        if config is None:
            return []
        entries = [Entry(config.label, theme.run_colour(PICKED, self.palette_))]
        if self.reference_curve.xData is not None and len(self.reference_curve.xData):
            entries.append(Entry("exact cache", self.palette_.muted, style=Qt.PenStyle.DashLine, width=1.5))
        return entries

    def hover_text(self, x: float, y: float) -> str:
        parts = [f"position {x:,.0f}"]
        for item, colour in ((self.curve, theme.run_colour(PICKED, self.palette_)),
                             (self.reference_curve, self.palette_.muted)):
            xs, ys = item.xData, item.yData
            if xs is not None and len(xs):
                i = int(np.clip(np.searchsorted(xs, x), 0, len(xs) - 1))
                parts.append(self.swatch(colour, self.reading(float(ys[i]))))
        return " &nbsp; ".join(parts)

    def reading(self, value: float) -> str:
        return f"{value:.3g}"

    def fill_export_copy(self, copy: AlongTextPlot) -> None:
        copy.show_config(self.sweep, self.index)


class RunningPerplexityPlot(AlongTextPlot):
    title = "Running perplexity along the text: exp of the mean NLL so far"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("perplexity (ppl, log scale)", POSITION)  # the short form "ppl" fits a low plot
        self.plot.setLogMode(y=True)  # the first tokens' mean runs orders of magnitude above the rest

    def values(self, config):
        nll = config.run.column("nll")
        return config.run.column("position"), np.exp(np.cumsum(nll) / np.arange(1, len(nll) + 1))

    def reading(self, value):
        return f"{value:.2f}"


class RunningDivergencePlot(AlongTextPlot):
    title = "KL divergence: running mean from the exact cache"
    with_reference = False

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("mean KL divergence (nats)", POSITION)

    def values(self, config):
        kl = np.asarray(config.kl, dtype=float)
        positions = config.run.column("position")[: len(kl)]
        return positions, np.cumsum(kl) / np.arange(1, len(kl) + 1)

    def reading(self, value):
        return f"{value:.4f} nats"


class MeasuredCachePlot(AlongTextPlot):
    title = "Cache memory: measured along the text"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("cache memory (MiB)", POSITION)

    def values(self, config):
        return config.run.column("position"), config.run.column("cache_bytes") / MIB

    def reading(self, value):
        return f"{value:.3f} MiB"
