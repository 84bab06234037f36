"""The window's plots. Each is a `PlotPanel` whose `redraw(runs, primary)` takes `RunSeries` objects."""

from kvviz.qt.plots.layer_plots import CacheMapPlot, LayerBytesPlot, LayerTimePlot
from kvviz.qt.plots.series_plots import FidelityPlot, LatencyPlot, MemoryPlot

__all__ = ["CacheMapPlot", "FidelityPlot", "LatencyPlot", "LayerBytesPlot", "LayerTimePlot", "MemoryPlot"]
