"""The "Local run" view: cache memory, step latency and fidelity against tokens above the cache map,
per-layer bytes and per-layer time below it; one legend (`run_legend`, which the window puts beside the
central tabs) names the runs shown for all of them. The cache map shares its place with the attention view
(a tab each): `sigAttentionShown` says when the attention view comes on and off screen, so that the engine
computes the attention only while it shows."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from PySide6.QtCore import QByteArray, Qt, Signal
from PySide6.QtWidgets import QSplitter, QTabWidget, QVBoxLayout, QWidget

from kvviz.attach.request_trace import is_served
from kvviz.qt.plots import CacheMapPlot, FidelityPlot, LatencyPlot, LayerBytesPlot, LayerTimePlot, MemoryPlot
from kvviz.qt.plots.attention_plots import AttentionView
from kvviz.qt.plots.legend import LegendBar
from kvviz.qt.plots.series_plots import share_x_zoom
from kvviz.qt.series import RunSeries

LAYER_VIEWS_INTERVAL_S = 0.25  # the per-layer views while generating: 4 redraws a second are enough
Drawn = tuple[list[RunSeries], list[RunSeries], RunSeries | None]  # a redraw's runs shown, the local ones, primary


class LocalView(QWidget):
    sigAttentionShown = Signal(bool)  # the attention view came on screen (True) or went off it

    def __init__(self, parent=None):
        super().__init__(parent)
        self.memory_plot = MemoryPlot()
        self.latency_plot = LatencyPlot()
        self.fidelity_plot = FidelityPlot()
        self.fidelity_plot.hide()  # shown while a run with a reference is on screen
        self.cache_map = CacheMapPlot()
        self.layer_bytes_plot = LayerBytesPlot()
        self.layer_time_plot = LayerTimePlot()
        self.attention = AttentionView()
        self.attention_map, self.sink_plot = self.attention.map_plot, self.attention.sink_plot
        # the first three follow every token; the per-layer views change little from one to the next
        self.plots = [
            self.memory_plot,
            self.latency_plot,
            self.fidelity_plot,
            self.cache_map,
            self.layer_bytes_plot,
            self.layer_time_plot,
            self.attention_map,
            self.sink_plot,
        ]
        for plot in self.plots:
            plot.show_run_legend = False  # named once, in run_legend
        self.run_legend = LegendBar(max_rows=1)  # placed by the window, beside the view's tabs
        share_x_zoom([self.memory_plot, self.latency_plot, self.fidelity_plot])
        self.map_tabs = QTabWidget()
        self.map_tabs.setDocumentMode(True)
        self.map_tabs.addTab(self.cache_map, "Cache map")
        self.map_tabs.addTab(self.attention, "Attention")
        self.map_tabs.setTabToolTip(1, "where the current token's attention goes, per layer; computed only while "
                                       "this tab shows")
        self.map_tabs.currentChanged.connect(self._tab_changed)
        self.attention.sigShownChanged.connect(self.sigAttentionShown)

        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.latency_plot)
        right.addWidget(self.fidelity_plot)
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(self.memory_plot)
        top.addWidget(right)
        bottom = QSplitter(Qt.Orientation.Horizontal)
        bottom.addWidget(self.layer_bytes_plot)
        bottom.addWidget(self.layer_time_plot)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(top)
        self.splitter.addWidget(self.map_tabs)
        self.splitter.addWidget(bottom)
        self.splitter.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 2, 0, 0)
        layout.addWidget(self.splitter, 1)
        # sizes kept in the settings
        self.splitters = {"main": self.splitter, "top": top, "bottom": bottom, "right": right,
                          "attention": self.attention}
        self._last_layer_redraw = 0.0
        self._last_draw: Drawn = ([], [], None)  # the runs of the last redraw

    def reset_layout(self) -> None:
        """The splitters' first sizes."""
        self.splitter.setSizes([38, 30, 32])  # shares: the memory and latency row, the cache map, the layer plots
        for name in ("top", "bottom", "right"):
            self.splitters[name].setSizes([1, 1])

    def restore_splitters(self, settings) -> None:
        for name, splitter in self.splitters.items():
            value = settings.value(f"window/splitter_{name}")
            if isinstance(value, QByteArray) and not value.isEmpty():
                splitter.restoreState(value)

    def save_splitters(self, settings) -> None:
        for name, splitter in self.splitters.items():
            settings.setValue(f"window/splitter_{name}", splitter.saveState())

    def show_attention(self, shown: bool = True) -> None:
        """Bring the attention view to the front (or the cache map)."""
        self.map_tabs.setCurrentWidget(self.attention if shown else self.cache_map)

    def attention_refused(self, run_id: int, why: str) -> None:
        """The engine cannot compute the attention of run `run_id` (a compiled run, a model's own attention)."""
        self.attention_map.refuse(run_id, why)
        self._tab_changed()

    def _tab_changed(self, *_) -> None:
        """The tab that came to the front draws what the other drew meanwhile."""
        for plot in self._tab_plots():
            plot.draw_frame(*self._runs_for(plot, self._last_draw))

    def draw_every_plot(self) -> None:
        """Every plot drawn with the last redraw's runs, the map's tab behind and a hidden plot too (redraws skip
        them): File ▸ Export plots writes each one that has something to draw."""
        for plot in self.plots:
            plot.draw_frame(*self._runs_for(plot, self._last_draw))

    def _runs_for(self, plot, drawn: Drawn) -> tuple[list[RunSeries], RunSeries | None]:
        """What `plot` draws of a redraw's runs: the latency plot every run shown, the others the local runs."""
        shown, local, primary = drawn
        return (shown if plot is self.latency_plot else local), primary

    def _tab_plots(self) -> list:
        """The plots of the map's tab in front: only those are drawn (the one behind costs nothing)."""
        if self.map_tabs.currentWidget() is self.attention:
            return [self.attention_map, self.sink_plot]
        return [self.cache_map]

    def redraw_parts(self, shown: list[RunSeries], primary: RunSeries | None,
                     generating: bool) -> list[Callable[[], None]]:
        """The runs shown, drawn a plot per part; the per-layer views at most every LAYER_VIEWS_INTERVAL_S
        while generating (each costs a full repaint of its plot)."""
        # Served runs have timings only: the latency plot shows them, the cache views do not.
        local = [r for r in shown if not is_served(r.trace)]
        local_primary = primary if primary in local else (local[-1] if local else None)
        now = time.perf_counter()
        full = not generating or now - self._last_layer_redraw >= LAYER_VIEWS_INTERVAL_S
        if full:
            self._last_layer_redraw = now
        self.fidelity_plot.setVisible(any(r.has_reference for r in local))
        self.run_legend.set_entries(self.memory_plot.run_entries(shown))
        self._last_draw = drawn = (shown, local, local_primary)
        behind = {self.cache_map, self.attention_map, self.sink_plot} - set(self._tab_plots())
        return [functools.partial(plot.draw_frame, *self._runs_for(plot, drawn))
                for plot in (self.plots if full else self.plots[:3]) if plot not in behind and not plot.isHidden()]
