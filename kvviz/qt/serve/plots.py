"""The Serve mode's plots, over the run's time in seconds: each request's phases (waiting, prefill, decode,
preempted), the pool's blocks held at each step against its size (a second run overlays the one before), and the
batch of each step (its prefill and decode tokens)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from kvviz.files.serve_trace import PHASES, ServeRun, phases
from kvviz.qt import theme
from kvviz.qt.plots.base import PlotPanel
from kvviz.qt.plots.legend import Entry

PHASE_COLOURS = {"waiting": theme.YELLOW, "prefill": theme.ORANGE, "decode": theme.BLUE, "preempted": theme.VERMILLION}
BAR = 0.7  # a request's row height


class ServePlot(PlotPanel):
    legend_runs = "none"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.run: ServeRun | None = None

    def has_data(self) -> bool:
        return self.run is not None and bool(self.run.steps)


class TimelinePlot(ServePlot):
    title = "Requests over time"
    integer_axes = ("left",)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.bars = {phase: pg.BarGraphItem(x0=[], y=[], width=[], height=BAR, brush=pg.mkBrush(colour),
                                            pen=pg.mkPen(None)) for phase, colour in PHASE_COLOURS.items()}
        for bar in self.bars.values():
            self.plot.addItem(bar)
        self.plot.getViewBox().invertY(True)  # the first request on top
        self.set_labels("request", "time (s)")

    def legend_entries(self) -> list[Entry]:
        return [Entry(phase, PHASE_COLOURS[phase], kind="box") for phase in PHASES]

    def show_run(self, run: ServeRun | None) -> None:
        self.run = run
        spans = phases(run) if run is not None else {}
        for phase, bar in self.bars.items():
            rows = [(row, start, end) for row, r in enumerate(run.requests if run else []) for p, start, end in
                    spans[r.id] if p == phase]
            bar.setOpts(x0=[s for _, s, _ in rows], y=[row for row, _, _ in rows],
                        width=[e - s for _, s, e in rows], height=BAR)
        self.update_legend()

    def hover_text(self, x: float, y: float) -> str:
        if self.run is None or not 0 <= round(y) < len(self.run.requests):
            return ""
        request = self.run.requests[round(y)]
        at = next((p for p, start, end in phases(self.run)[request.id] if start <= x <= end), None)
        return f"{request.id}: {at or 'not in the run'} at {x:.2f} s; {len(request.token_times)} tokens, " \
               f"{request.preemptions} preemptions"


class PoolPlot(ServePlot):
    title = "Pool in use"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.previous: ServeRun | None = None
        self.curve = self.plot.plot([], [], stepMode="center")
        self.before = self.plot.plot([], [], stepMode="center")
        self.size_line = pg.InfiniteLine(angle=0, movable=False)
        self.before_size = pg.InfiniteLine(angle=0, movable=False)
        self.plot.addItem(self.size_line)
        self.plot.addItem(self.before_size)
        self.set_labels("blocks held", "time (s)")

    def legend_entries(self) -> list[Entry]:
        colour, muted = theme.run_colour(1, self.palette_), self.palette_.muted
        entries = [Entry("this run", colour), Entry("its pool", colour, style=Qt.PenStyle.DashLine, width=1)]
        if self.previous is not None:
            entries += [Entry("the run before", muted, style=Qt.PenStyle.DotLine),
                        Entry("its pool", muted, style=Qt.PenStyle.DashDotLine, width=1)]
        return entries

    def show_runs(self, run: ServeRun | None, previous: ServeRun | None) -> None:
        self.run, self.previous = run, previous
        colour, muted = theme.run_colour(1, self.palette_), self.palette_.muted
        for curve, line, shown, pen, pool_pen in (
                (self.curve, self.size_line, run, pg.mkPen(colour, width=2),
                 pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine)),
                (self.before, self.before_size, previous, pg.mkPen(muted, width=2, style=Qt.PenStyle.DotLine),
                 pg.mkPen(muted, width=1, style=Qt.PenStyle.DashDotLine))):
            times, held = held_over_time(shown)
            curve.setData(times, held) if len(times) else curve.setData([], [])
            curve.setPen(pen)
            line.setPen(pool_pen)
            line.setVisible(shown is not None)
            if shown is not None:
                line.setPos(sum(g.blocks for g in shown.groups))
        self.update_legend()

    def hover_text(self, x: float, y: float) -> str:
        times, held = held_over_time(self.run)
        if not len(times) or x < times[0]:
            return ""
        i = min(int(np.searchsorted(times, x, side="right")) - 1, len(held) - 1)
        return f"{held[i]:,.0f} of {sum(g.blocks for g in self.run.groups):,} blocks held at {x:.2f} s"


def held_over_time(run: ServeRun | None) -> tuple[np.ndarray, np.ndarray]:
    """Each step's start, and the blocks held then (every group), with the last step's end closing the curve
    (pyqtgraph's step mode takes one x more than y)."""
    if run is None or not run.steps:
        return np.array([]), np.array([])
    steps = list(run.steps)
    times = [s.started for s in steps] + [steps[-1].ended or steps[-1].started]
    held = [sum(s.pool.held(g.name) for g in run.groups) for s in steps]
    return np.array(times, dtype=float), np.array(held, dtype=float)


class BatchPlot(ServePlot):
    title = "Batch per step"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.prefill = self.plot.plot([], [], stepMode="center", pen=pg.mkPen(PHASE_COLOURS["prefill"], width=2))
        self.decode = self.plot.plot([], [], stepMode="center", pen=pg.mkPen(PHASE_COLOURS["decode"], width=2))
        self.set_labels("tokens per step", "time (s)")

    def legend_entries(self) -> list[Entry]:
        return [Entry("prefill tokens", PHASE_COLOURS["prefill"]), Entry("decode tokens", PHASE_COLOURS["decode"])]

    def show_run(self, run: ServeRun | None) -> None:
        self.run = run
        times, _ = held_over_time(run)
        steps = list(run.steps)[: max(len(times) - 1, 0)] if run is not None else []
        for curve, values in ((self.prefill, [s.prefill_tokens for s in steps]),
                              (self.decode, [s.decode_tokens for s in steps])):
            curve.setData(times, values) if steps else curve.setData([], [])
        self.update_legend()

    def hover_text(self, x: float, y: float) -> str:
        times, _ = held_over_time(self.run)
        if not len(times) or x < times[0]:
            return ""
        steps = list(self.run.steps)
        step = steps[min(int(np.searchsorted(times, x, side="right")) - 1, len(steps) - 1)]
        return f"step at {step.started:.2f} s: {len(step.batch)} requests, {step.prefill_tokens:,} prefill and " \
               f"{step.decode_tokens:,} decode tokens"
