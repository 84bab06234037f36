"""The plots every mode shares. Each is a `PlotPanel` whose `redraw(runs, primary)` takes `RunSeries` objects;
a mode's own plots live in its folder (kvviz.qt.evaluate.plots, kvviz.qt.server.plots)."""

from kvviz.qt.plots.latency_plot import LatencyPlot
from kvviz.qt.plots.layer_plots import CacheMapPlot, LayerBytesPlot, LayerTimePlot
from kvviz.qt.plots.series_plots import FidelityPlot, MemoryPlot

__all__ = [
    "CacheMapPlot",
    "FidelityPlot",
    "LatencyPlot",
    "LayerBytesPlot",
    "LayerTimePlot",
    "MemoryPlot",
]
