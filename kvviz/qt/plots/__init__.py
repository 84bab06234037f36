"""The window's plots. Each is a `PlotPanel`: the run plots' `redraw(runs, primary)` takes `RunSeries` objects,
the server plots' `redraw_server(series)` a `ServerSeries`."""

from kvviz.qt.plots.layer_plots import CacheMapPlot, LayerBytesPlot, LayerTimePlot
from kvviz.qt.plots.series_plots import FidelityPlot, LatencyPlot, MemoryPlot
from kvviz.qt.plots.server_plots import PrefixHitPlot, RequestsPlot, ServerLatencyPlot, ThroughputPlot, UsagePlot

__all__ = [
    "CacheMapPlot",
    "FidelityPlot",
    "LatencyPlot",
    "LayerBytesPlot",
    "LayerTimePlot",
    "MemoryPlot",
    "PrefixHitPlot",
    "RequestsPlot",
    "ServerLatencyPlot",
    "ThroughputPlot",
    "UsagePlot",
]
