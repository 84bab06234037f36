"""The step-latency plot: each decode step's time, its memory-bound floor and scoring, the prefill, one-time pauses."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from kvviz.present import MIB, percent, seconds
from kvviz.qt import theme
from kvviz.qt.plots.base import marker_line
from kvviz.qt.plots.legend import Entry
from kvviz.qt.plots.series_plots import Curves, SeriesPlot
from kvviz.qt.series import CACHE_MIB, FLOOR_MS, SCORING_MS, WALL_MS, RunSeries, X


class LatencyPlot(SeriesPlot):
    title = "Step latency (decode steps; prefill apart)"
    help_text = (
        "Solid: the time of each decode step. Dashed: its memory-bound floor, the time to read every weight "
        "and the whole KV cache once at this machine's measured memory bandwidth; no step can be faster. "
        "The KV cache's share of those bytes grows with the context, so the floor of a growing cache "
        "(dynamic, static's written part) rises, while a sink or sliding window's, or a quantized cache's, "
        "stays low and flat: a smaller cache is faster because each step reads fewer bytes. "
        "One-time pauses (quanto's kernel build, torch.compile) are marked where they happened and are "
        "in no step's time; the star is the prefill. Dots: the part of a step its cache spent choosing what to keep "
        "(a policy that compresses while decoding); the prefill's share (KVzip's reading again) is in the legend."
    )

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("step latency (ms)", "tokens in context")

    def make_curves(self, series):
        colour = theme.run_colour(series.run_id)
        decode = pg.PlotDataItem(pen=pg.mkPen(colour, width=1))
        prefill = pg.ScatterPlotItem(size=10, symbol="star", pen=pg.mkPen(colour), brush=pg.mkBrush(colour))
        floor = pg.PlotDataItem(pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine), connect="finite")
        scoring = pg.PlotDataItem(pen=None, symbol="o", symbolSize=4, symbolPen=None, symbolBrush=pg.mkBrush(colour))
        curves = Curves()
        curves.items = [decode, prefill, floor, scoring]
        self.plot.addItem(decode)
        self.plot.addItem(scoring)
        # The prefill often takes many times a decode step; keep it out of the auto range.
        self.plot.addItem(prefill, ignoreBounds=True)
        self.plot.addItem(floor)
        return curves

    def update_curves(self, series, curves):
        start = series.decode_start
        x, y, floor = (series.column(c)[start:] for c in (X, WALL_MS, FLOOR_MS))
        curves.items[0].setData(x, y)
        if series.share_of_memory_bound is not None:  # every decode step has its floor
            curves.items[2].setData(x, floor)
        scoring = series.column(SCORING_MS)[start:]
        chose = np.isfinite(scoring) & (scoring > 0)
        if chose.any():
            curves.items[3].setData(x[chose], scoring[chose])
        if series.prefill_x is not None and curves.prefill != series.prefill_ms:
            curves.prefill = series.prefill_ms
            curves.items[1].setData([series.prefill_x], [series.prefill_ms])
        self._mark_pauses(series, curves)

    def _mark_pauses(self, series: RunSeries, curves: Curves) -> None:
        """A labelled line where a one-time pause happened: the strategy's warm-up at the run's start, torch.compile
        before the first decode step. Neither is in any step's time, so neither is on the curve."""
        trace = series.trace
        for kind, pause_ms, x in (
            ("warm-up", trace.warm_up_ms, series.prefill_x),
            ("compile", trace.compile_ms, series.first_decode_x),
        ):
            if pause_ms is None or x is None or kind in curves.pauses:
                continue
            colour = theme.run_colour(series.run_id)
            line = marker_line(colour, Qt.PenStyle.DotLine, f"{kind} {seconds(pause_ms)} s, in no step", 0.5, x)
            self.plot.addItem(line, ignoreBounds=True)
            curves.pauses[kind] = line

    def pause_positions(self, run_id: int) -> dict[str, float]:
        """x of each one-time pause marked for a run (tests)."""
        curves = self._curves.get(run_id)
        return {kind: line.value() for kind, line in curves.pauses.items()} if curves else {}

    def floor_data(self, run_id: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(x, floor ms) of a run's memory-bound floor line as drawn (tests), or None where it is not drawn."""
        curves = self._curves.get(run_id)
        if curves is None or curves.items[2].xData is None:
            return None
        return curves.items[2].getOriginalDataset()

    def scoring_data(self, run_id: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(x, scoring ms) of the decode steps whose cache chose what to keep, as drawn (tests), or None."""
        curves = self._curves.get(run_id)
        if curves is None or curves.items[3].xData is None or not len(curves.items[3].xData):
            return None
        return curves.items[3].getOriginalDataset()

    def legend_entries(self):
        """What the line styles mean (the runs' colours are the memory plot's and the table's), and the prefill
        time of each run (a star, kept off the decode steps' scale) with its scoring."""
        foreground = self.palette_.foreground
        entries = [
            Entry("step time", foreground),
            Entry("memory-bound floor", foreground, style=Qt.PenStyle.DashLine, tooltip=self.help_text),
        ]
        if any(np.nan_to_num(s.column(SCORING_MS)[s.decode_start:]).any() for s in self._runs):
            entries.append(Entry("scoring, within the step", foreground, kind="marker",
                                 tooltip="the part of the step its cache spent choosing what to keep"))
        stars = [
            Entry(f"{s.prefill_ms:.0f} ms" + (f", {s.prefill_scoring_ms:.0f} scoring" if s.prefill_scoring_ms else ""),
                  theme.run_colour(s.run_id), kind="marker", marker="star",
                  tooltip="the prefill's time; scoring: the part its cache spent choosing what to keep of the prompt "
                          "(KVzip: the model reading the prompt again)" if s.prefill_scoring_ms else "")
            for s in self._runs
            if s.prefill_ms is not None
        ]
        return entries + ([Entry("prefill", foreground, kind="text"), *stars] if stars else [])

    def hover_text(self, x, y):
        parts = [f"{x:.0f} tokens"]
        for series in self._runs:
            i = self.nearest(series, x)
            if i is None:
                continue
            text = f"{series.column(WALL_MS)[i]:.1f} ms"
            scoring = series.column(SCORING_MS)[i]
            if np.isfinite(scoring) and scoring > 0:
                text += f", {scoring:.1f} of it scoring"
            floor = series.column(FLOOR_MS)[i]
            weights = series.trace.weight_bytes
            if np.isfinite(floor) and weights is not None:
                kv = series.column(CACHE_MIB)[i] * MIB
                text += f" (floor {floor:.1f} ms, KV {percent(kv / (kv + weights), 1)} of the bytes read)"
            parts.append(self.swatch(theme.run_colour(series.run_id), text))
        return " &nbsp; ".join(parts)
