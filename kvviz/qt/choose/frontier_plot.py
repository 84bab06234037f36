"""The Choose mode's frontier plot: each finished configuration's quality loss against its memory at the user's target
(log axis: its caches', or, chosen in the title row, the process's peak serving them), coloured by its decode speed,
with the frontier (`kvviz.files.frontier.frontier`) drawn through the configurations no other beats on both, the
tolerance as a horizontal line and the budget, where it bounds that memory, as a vertical one. Hover names the
configuration under the mouse; a click picks it (`sigPicked`).

The x axis holds log10(bytes) and labels its ticks in bytes ("48.0 MiB"), so that every item (points, frontier,
budget line) is placed in the same plain coordinates. The y axis shows the range where the choice is made: up to
OFF_SCALE times the tolerance, or the frontier's worst point if higher; a configuration that loses more sits on
the top edge as a triangle (its hover card gives its loss). The frontier's points carry short names, each placed
beside its point where it covers no other name and no point and stays inside the plot.
"""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtWidgets import QComboBox

from kvviz.files import frontier
from kvviz.files.sweep import Configuration, Sweep
from kvviz.present import UNKNOWN, counted, number, seconds, size, strategy_label
from kvviz.qt import theme
from kvviz.qt.plots.base import PlotPanel
from kvviz.qt.plots.legend import Entry

MEMORY_CHOICES = (("cache", "cache memory"), ("process", "process peak"))  # what the points stand at
SLOW, FAST = "#d1495b", "#2fb380"  # decode speed's colour ramp: the slowest configuration to the fastest
UNMEASURED = "#8a919c"  # a configuration whose decode speed is not known
POINT_SIZE = 11  # px
PICK_PX = 14  # a hover or a click within this many pixels of a point is on it
BUDGET_SPAN_DECADES = 2.0  # the budget widens the x range to show its line when it lies this close to the points
LOG2 = math.log10(2)
MAX_TICKS = 8  # on the memory axis
TICK_PX = 72  # the room a tick's label ("512 KiB") needs on it
OFF_SCALE = 3.0  # the quality axis reaches this many times the tolerance (or the frontier's worst point)
NAME_GAP = POINT_SIZE // 2 + 3  # px from a point's centre to its name, beside it (its own point is not in the way)
LINE_SAMPLES = 24  # places along each stretch of the frontier's line that a name should not cover
# where a name may go, in order of preference: right of its point or left of it, above or below (screen y grows down),
# beside the point or one line further out
NAME_SIDES = tuple((sx, sy, out) for out in (0, 1) for sx, sy in ((1, -1), (1, 1), (-1, -1), (-1, 1)))


class BytesAxis(pg.AxisItem):
    """An axis of log10(bytes): ticks at powers of two (every one, or every second, third... on a long span), each
    labelled as a size ("128 KiB")."""

    def tickValues(self, minVal, maxVal, size_px):  # noqa: N802,N803 - pyqtgraph override
        if not (math.isfinite(minVal) and math.isfinite(maxVal)) or maxVal <= minVal:
            return []
        low, high = math.ceil(minVal / LOG2), math.floor(maxVal / LOG2)
        fit = max(2, min(MAX_TICKS, int(size_px // TICK_PX)))  # a narrow plot: fewer, so labels never run together
        step = max(1, math.ceil((high - low + 1) / fit))
        return [(step * LOG2, [k * LOG2 for k in range(low, high + 1) if k % step == 0])]

    def tickStrings(self, values, scale, spacing):  # noqa: N802 - pyqtgraph override
        return [size(2.0 ** round(v / LOG2)) for v in values]


class ConfigurationsPlot(PlotPanel):
    """A plot of a sweep's configurations against their cache memory at the target (x: log10 bytes, labelled as
    sizes): hover names the configuration under the mouse, a click picks it (`sigPicked`), a double click fits the
    view again. Subclasses draw and say where each configuration's points are (`placed_points`)."""

    export_aspect = 0.6
    sigPicked = Signal(int)  # the index (in the sweep) of the configuration clicked

    def __init__(self, parent=None):
        self.bytes_axis = BytesAxis("bottom")
        super().__init__(parent)
        self.plot.setAxisItems({"bottom": self.bytes_axis})
        self.plot.getAxis("bottom").enableAutoSIPrefix(False)
        self.sweep: Sweep | None = None
        self.covers = "cache"  # the memory each point stands at: its caches' or the process's (`frontier.memory`)
        self.names: list[tuple[pg.TextItem, float, float]] = []  # beside the points named, at (x, y)
        self.defaults: dict | None = None  # the strategies' option defaults: names leave them out (None: not known)
        self.plot.vb.sigRangeChanged.connect(self._place_names)  # zoomed, panned, resized: placed again
        self.plot.vb.sigResized.connect(self._place_names)

    def memory(self, config: Configuration) -> int | None:
        return frontier.memory(config, self.covers)

    def memory_axis(self) -> str:
        """The memory axis's label."""
        what = "cache memory" if self.covers == "cache" else "the process's peak"
        return f"{what} at the target (bytes, log scale)"

    def placed_points(self) -> list[tuple[int, float, float]]:
        """(configuration index, x, y) of every point drawn, in view coordinates."""
        raise NotImplementedError

    def kept_clear(self) -> list[tuple[float, float]]:
        """Places in view coordinates that names should not cover, beside the points."""
        return []

    def name_points(self, named: list[tuple[Configuration, float, float]]) -> None:
        """A short name beside each of these points, (configuration, x, y) (what a picture without hover needs): the
        strategy and the options it sets away from their defaults."""
        for label, _, _ in self.names:
            self.plot.removeItem(label)
        self.names = []
        for config, x, y in named:
            label = pg.TextItem(strategy_label(config.run.strategy, self.defaults), color=self.palette_.foreground)
            label.setPos(x, y)
            self.plot.addItem(label, ignoreBounds=True)
            self.names.append((label, x, y))
        self._place_names()

    def _place_names(self, *_) -> None:
        """Each name on the first side of its point (NAME_SIDES) where it covers no name placed before it, no point,
        nothing the plot keeps clear (`kept_clear`: the frontier's line) and nothing outside the plot; where every
        side covers something, the side that covers least."""
        vb = self.plot.vb
        area = vb.sceneBoundingRect()
        if area.width() <= 0 or not self.names:
            return

        def around(x: float, y: float, radius: float) -> QRectF:
            point = vb.mapViewToScene(QPointF(x, y))
            return QRectF(point.x() - radius, point.y() - radius, 2 * radius, 2 * radius)

        taken = [around(x, y, POINT_SIZE / 2 + 1) for _, x, y in self.placed_points()]
        taken += [around(x, y, 1.5) for x, y in self.kept_clear()]
        for label, x, y in self.names:
            point = vb.mapViewToScene(QPointF(x, y))
            box = label.textItem.boundingRect()
            width, height = box.width(), box.height()
            best = None
            for sx, sy, out in NAME_SIDES:
                left = point.x() + (NAME_GAP if sx > 0 else -NAME_GAP - width)
                top = point.y() + (NAME_GAP / 2 if sy > 0 else -NAME_GAP / 2 - height) + sy * out * height
                rect = QRectF(left, top, width, height)
                inside = rect.intersected(area)
                cost = width * height - inside.width() * inside.height()
                cost += sum(_overlap(rect, other) for other in taken)
                if best is None or cost < best[0]:
                    best = (cost, rect)
                if cost == 0:
                    break
            rect = best[1]
            label.setAnchor(((point.x() - rect.left()) / width, (point.y() - rect.top()) / height))
            taken.append(rect)

    def nearest(self, x: float, y: float) -> int | None:
        """The index of the point drawn nearest to view position (x, y), within PICK_PX pixels; None if none."""
        return nearest(self.plot.vb, self.placed_points(), x, y)

    def hover_text(self, x: float, y: float) -> str:
        index = self.nearest(x, y)
        return "" if index is None else card(self.sweep, index)

    def _on_click(self, event) -> None:
        if event.double():
            self.reset_view()
            return
        if not self.plot.vb.sceneBoundingRect().contains(event.scenePos()):
            return
        point = self.plot.vb.mapSceneToView(event.scenePos())
        index = self.nearest(point.x(), point.y())
        if index is not None:
            self.sigPicked.emit(index)


class FrontierPlot(ConfigurationsPlot):
    title = "Quality lost against memory at your target: one point per configuration"
    sigCovers = Signal(str)  # the user chose what memory the points stand at: "cache" or "process"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.chooser = QComboBox()  # in the title row: the memory the points stand at
        for key, text in MEMORY_CHOICES:
            self.chooser.addItem(text, key)
        self.chooser.setToolTip("Each configuration at its caches' memory at the target, or at the process's peak "
                                "serving them (the weights, one request's prefill at its peak and the other caches)")
        self.chooser.currentIndexChanged.connect(lambda *_: self.sigCovers.emit(self.chooser.currentData()))
        self.head.addWidget(self.chooser)
        self.selected: int | None = None
        self.points = pg.ScatterPlotItem(size=POINT_SIZE, pxMode=True)
        self.ring = pg.ScatterPlotItem(size=POINT_SIZE + 10, pxMode=True, brush=None)
        self.frontier_line = pg.PlotDataItem()
        self.tolerance_line = pg.InfiniteLine(angle=0, movable=False)
        self.budget_line = pg.InfiniteLine(angle=90, movable=False)
        self.plot.addItem(self.frontier_line)
        self.plot.addItem(self.points)
        self.plot.addItem(self.ring)
        self.plot.addItem(self.tolerance_line, ignoreBounds=True)
        self.plot.addItem(self.budget_line, ignoreBounds=True)
        self._placed: list[tuple[int, float, float]] = []  # (index, log10 bytes, loss) of each point drawn
        self.set_labels("perplexity change (%)", self.memory_axis())

    # -- what is drawn -------------------------------------------------------------------------------------

    def loss_in_units(self, sweep: Sweep, config: Configuration) -> float | None:
        """The quality loss as the y axis reads it: a percentage, or nats."""
        loss = frontier.quality_loss(sweep, config)
        if loss is None:
            return None
        return 100.0 * loss if sweep.question.tolerance.kind == "perplexity" else loss

    def set_covers(self, covers: str) -> None:
        """Stand the points at their caches' memory ("cache") or at the process's peak ("process"), and draw again."""
        self.covers = covers
        self.chooser.blockSignals(True)
        self.chooser.setCurrentIndex(self.chooser.findData(covers))
        self.chooser.blockSignals(False)
        self.set_axis_label("bottom", self.memory_axis())
        self.show_sweep(self.sweep, self.selected)

    def show_sweep(self, sweep: Sweep | None, selected: int | None = None) -> None:
        """Draw `sweep`'s finished configurations (None: nothing), `selected` ringed."""
        changed = sweep is not self.sweep
        self.sweep, self.selected = sweep, selected
        if changed:
            self.clear_hover()
        if sweep is None:
            self._placed = []
            for item in (self.points, self.ring):
                item.setData([])
            self.frontier_line.setData([], [])
            self.name_points([])
            self.tolerance_line.setVisible(False)
            self.budget_line.setVisible(False)
            self.update_legend()
            return
        kl = sweep.question.tolerance.kind == "kl"
        self.set_axis_label("left", "mean KL divergence from the exact cache (nats)" if kl else
                            "perplexity change (%)")
        index = {id(c): i for i, c in enumerate(sweep.configurations)}
        tolerance = sweep.question.tolerance.value * (1.0 if kl else 100.0)
        line = frontier.frontier(sweep, self.covers)
        top = max([OFF_SCALE * tolerance] + [self.loss_in_units(sweep, c) for c in line])
        placed = frontier.placed(sweep, self.covers)
        self._placed = [(index[id(c)], math.log10(max(1, self.memory(c))), min(self.loss_in_units(sweep, c), top))
                        for c in placed]
        above = {index[id(c)] for c in placed if self.loss_in_units(sweep, c) > top}
        speeds = self._speeds()
        spots = [{"pos": (x, y), "data": i, "brush": pg.mkBrush(self._speed_colour(speeds, i)),
                  "symbol": "t1" if i in above else "o",
                  "pen": pg.mkPen(self.palette_.background, width=1)} for i, x, y in self._placed]
        self.points.setData(spots)
        self.frontier_line.setData([math.log10(max(1, self.memory(c))) for c in line],
                                   [self.loss_in_units(sweep, c) for c in line])
        self.name_points([(c, math.log10(max(1, self.memory(c))), self.loss_in_units(sweep, c)) for c in line])
        ringed = [(x, y) for i, x, y in self._placed if i == selected]
        self.ring.setData([{"pos": p} for p in ringed])
        self.tolerance_line.setPos(tolerance)
        self.tolerance_line.setVisible(True)
        budget = self.budget()
        self.budget_line.setVisible(budget is not None)
        if budget is not None:
            self.budget_line.setPos(math.log10(budget))
        self._fit()
        self.update_legend()

    def kept_clear(self) -> list[tuple[float, float]]:
        """Places along each stretch of the frontier's line."""
        xs, ys = self.frontier_line.getData()
        if xs is None:
            return []
        return [(x0 + (x1 - x0) * t / LINE_SAMPLES, y0 + (y1 - y0) * t / LINE_SAMPLES)
                for x0, y0, x1, y1 in zip(xs[:-1], ys[:-1], xs[1:], ys[1:], strict=True)
                for t in range(1, LINE_SAMPLES)]

    def budget(self) -> int | None:
        """The budget's bytes where it bounds the memory the points stand at (None: no budget, or it bounds the
        other)."""
        question = self.sweep.question
        return question.budget_bytes if question.budget_covers == self.covers else None

    def _fit(self) -> None:
        """The points, the tolerance and (when near them) the budget in view, with a margin."""
        if not self._placed:
            return
        xs = [x for _, x, _ in self._placed]
        ys = [y for _, _, y in self._placed] + [self.tolerance_line.value()]
        budget = self.budget_line.value() if self.budget_line.isVisible() else None
        if budget is not None and min(xs) - BUDGET_SPAN_DECADES <= budget <= max(xs) + BUDGET_SPAN_DECADES:
            xs.append(budget)
        x_pad = max(0.1, 0.06 * (max(xs) - min(xs)))
        y_pad = max(1e-3, 0.08 * (max(ys) - min(ys)))
        self.plot.setXRange(min(xs) - x_pad, max(xs) + x_pad, padding=0)
        self.plot.setYRange(min(ys) - y_pad, max(ys) + y_pad, padding=0)

    def reset_view(self) -> None:
        self._fit()

    def _speeds(self) -> dict[int, float]:
        """Decode tokens/s of each point whose speed was measured."""
        configs = self.sweep.configurations
        return {i: 1000.0 / configs[i].decode_ms for i, _, _ in self._placed if configs[i].decode_ms}

    def _speed_colour(self, speeds: dict[int, float], index: int) -> str:
        if index not in speeds:
            return UNMEASURED
        low, high = min(speeds.values()), max(speeds.values())
        share = (speeds[index] - low) / (high - low) if high > low else 1.0
        return theme.mix(SLOW, FAST, share)

    def has_data(self) -> bool:
        return bool(self._placed)

    def apply_palette(self, palette: theme.Palette) -> None:
        super().apply_palette(palette)
        foreground = palette.foreground
        self.frontier_line.setPen(pg.mkPen(foreground, width=2))
        self.ring.setPen(pg.mkPen(foreground, width=2))
        self.tolerance_line.setPen(pg.mkPen(foreground, width=1, style=Qt.PenStyle.DashLine))
        self.budget_line.setPen(pg.mkPen(foreground, width=1, style=Qt.PenStyle.DashDotLine))
        if self.sweep is not None:
            self.show_sweep(self.sweep, self.selected)

    def legend_entries(self) -> list[Entry]:
        sweep = self.sweep
        if sweep is None or not self._placed:
            return []
        foreground = self.palette_.foreground
        entries = [Entry("frontier", foreground, tooltip="the configurations no other beats on both memory and "
                                                         "quality")]
        entries.append(Entry(f"tolerance ({sweep.question.tolerance.describe()})", foreground,
                             style=Qt.PenStyle.DashLine, width=1.0))
        if self.budget() is not None:
            entries.append(Entry(f"budget ({size(self.budget())})", foreground,
                                 style=Qt.PenStyle.DashDotLine, width=1.0, tooltip=sweep.question.budget))
        speeds = self._speeds()
        if speeds:
            low, high = min(speeds.values()), max(speeds.values())
            entries.append(Entry(f"decode speed {number(low)} to {number(high)} tokens/s", SLOW, kind="ramp",
                                 to_colour=FAST, tooltip="one decode step with the configuration's cache alone, "
                                                         "after the text (median of a few)"))
        if len(speeds) < len(self._placed):
            entries.append(Entry("speed not measured", UNMEASURED, kind="marker"))
        return entries

    # -- hover and click ----------------------------------------------------------------------------------

    def placed_points(self) -> list[tuple[int, float, float]]:
        return self._placed

    def fill_export_copy(self, copy: FrontierPlot) -> None:
        copy.covers = self.covers
        copy.set_axis_label("bottom", self.memory_axis())
        copy.show_sweep(self.sweep, self.selected)


def nearest(vb: pg.ViewBox, placed, x: float, y: float) -> int | None:
    """Of `placed` points (index, x, y) in view coordinates, the index of the one drawn nearest to view position
    (x, y), within PICK_PX pixels on screen; None if none is."""
    here = vb.mapViewToScene(QPointF(x, y))
    best, best_d = None, float(PICK_PX)
    for i, px, py in placed:
        there = vb.mapViewToScene(QPointF(px, py))
        d = math.hypot(there.x() - here.x(), there.y() - here.y())
        if d <= best_d:
            best, best_d = i, d
    return best


def _overlap(a: QRectF, b: QRectF) -> float:
    """The area two rectangles share."""
    both = a.intersected(b)
    return max(0.0, both.width()) * max(0.0, both.height())


def card(sweep: Sweep, index: int) -> str:
    """The hover card of one configuration: its name, what it costs in quality, its memory at the target, the
    sequences that fit in the budget, the longest context one sequence reaches in it, and its decode speed."""
    config = sweep.configurations[index]
    target = config.target
    question = sweep.question
    lines = [f"<b>{config.label}</b>", frontier.loss_text(sweep, config),
             f"{size(frontier.memory(config))} of cache for {counted(question.sequences, 'sequence')} of "
             f"{question.context:,} tokens"]
    at = target.first_token if target is not None else None
    if at is not None:
        mark = " (predicted)" if at.predicted else ""
        lines.append(f"serving one such request: peak {size(at.peak_bytes)}, first token in "
                     f"{seconds(at.ttft_ms)} s{mark}")
    if target is not None and target.process_bytes is not None and question.sequences > 1:
        lines.append(f"the process serving them all: {size(target.process_bytes)}")
    if target is not None and target.sequences_in_budget is not None:
        lines.append(f"{counted(target.sequences_in_budget, 'such sequence')} fit in the budget")
    if target is not None and target.longest_context is not None:
        limit = {"budget": " (the budget's limit)", "context": " (the model's positions)", "none": ""}
        lines.append(f"longest context in the budget: {target.longest_context:,} tokens"
                     f"{limit.get(target.longest_limit, '')}")
    elif target is not None and target.longest_limit == "none":
        lines.append("longest context in the budget: no limit (the cache's size is bounded)")
    for regime in sweep.asked.regimes if sweep.asked else ():
        lines.append(f"{frontier.accuracy_text(sweep, config, regime)} answered ({regime})")
    speed = config.summary()["decode_tokens_per_s"]
    lines.append(f"decode: {number(speed) if speed else UNKNOWN} tokens/s")
    return "<br>".join(lines)
