"""Figures for reports, drawn offscreen by the window's own plot widgets.

Used by `kvviz compare`: the same MemoryPlot, LatencyPlot and CacheMapPlot the window shows,
filled from finished traces and saved with `QWidget.grab()`; and by `kvviz choose --out`: the Choose tab's
frontier plot of a sweep, as PNG and SVG.
"""

from __future__ import annotations

from pathlib import Path

from kvviz.files.sweep import Sweep
from kvviz.files.trace import Trace
from kvviz.qt.tools import drive

SIZE = (1000, 420)


def _save(panel, runs, primary, path: Path) -> Path:
    from kvviz.qt import theme

    panel.apply_palette(theme.PALETTES["light"])
    panel.resize(*SIZE)
    panel.redraw(runs, primary)
    if hasattr(panel, "reset_view"):
        panel.reset_view()
    panel.show()
    drive.application().processEvents()
    panel.grab().save(str(path))
    panel.close()
    return path


def render_comparison(traces: list[Trace], out: Path) -> dict[str, Path]:
    """Overlaid memory and latency plots and one cache map per run; returns {title: PNG path}."""
    drive.application("kvviz-figures")
    from kvviz.qt import theme
    from kvviz.qt.plots.latency_plot import LatencyPlot
    from kvviz.qt.plots.layer_plots import CacheMapPlot
    from kvviz.qt.plots.series_plots import MemoryPlot
    from kvviz.qt.series import RunSeries

    theme.use("light")  # the figures' palette: run colours readable on white
    runs = [RunSeries.from_trace(i + 1, t) for i, t in enumerate(traces)]
    figures = {
        "Cache memory against tokens": _save(MemoryPlot(), runs, runs[0], out / "memory.png"),
        "Step latency against tokens": _save(LatencyPlot(), runs, runs[0], out / "latency.png"),
    }
    for run in runs:
        name = f"Cache map of run #{run.run_id}: {run.label()}"
        figures[name] = _save(CacheMapPlot(), runs, run, out / f"cache-map-{run.run_id}.png")
    return figures


FRONTIER_WIDTH = 1600  # px of frontier.png


def render_frontier(sweep: Sweep, out: Path) -> dict[str, Path]:
    """The sweep's frontier plot as the Choose tab draws it, in the light theme: {"png": out/frontier.png,
    "svg": out/frontier.svg}."""
    drive.application("kvviz-figures")
    from kvviz.qt import theme
    from kvviz.qt.choose.frontier_plot import FrontierPlot

    theme.use("light")
    out.mkdir(parents=True, exist_ok=True)
    plot = FrontierPlot()
    plot.apply_palette(theme.PALETTES["light"])
    plot.show_sweep(sweep)
    png = out / "frontier.png"
    if not plot.export_image(FRONTIER_WIDTH).save(str(png)):
        raise OSError(f"could not write {png}")
    svg = plot.export_svg(out / "frontier.svg", FRONTIER_WIDTH)
    plot.deleteLater()
    return {"png": png, "svg": svg}
