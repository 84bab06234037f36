"""Per-layer plots: key/value bytes now, mean time per layer, and the cache map (layers x positions)."""

from __future__ import annotations

import html

import numpy as np
import numpy.ma  # noqa: F401 - else np.unique imports it (12 ms) in a first run's first frame, on the GUI thread
import pyqtgraph as pg
from PySide6.QtCore import Qt

from kvviz.files.trace import SlotState, heads_holding
from kvviz.qt import theme
from kvviz.qt.cache_cells import RAMP_START, cell_name, heads_at, kv_heads
from kvviz.qt.plots.base import PlotPanel
from kvviz.qt.plots.legend import Entry
from kvviz.qt.plots.note import NotePlot
from kvviz.qt.plots.pin_outline import Held, outlines, pin_at
from kvviz.qt.series import FIXED_CROSS

HELD_BY_SOME = "held by some KV heads (fainter: fewer)"  # the cache map's legend entry for per-head eviction
KEYS_COLOUR = theme.BLUE
VALUES_COLOUR = theme.ORANGE
STATE_COLOUR = theme.YELLOW  # the cache map's colour of a fixed-size state
CROSS_COLOUR = theme.PURPLE  # an encoder-decoder's cross-attention keys and values
ALWAYS_SHOWN = tuple(s for s in SlotState if s not in (SlotState.STATE, SlotState.SHARED))  # the rest when present
# a pinned span's boxes; evicted in the theme's foreground (white or black), which stands out on the evicted cells'
# brown where a red would not
PIN_COLOURS = {Held.ALL: theme.GREEN, Held.SOME: theme.YELLOW}


def bar_places(keys: np.ndarray, values: np.ndarray, states: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(x, width) per layer of the keys, values and state bars: each layer's bars side by side, centred on its tick
    (a plain layer two bars, a state layer one, a layer with a state and keys and values three)."""
    layers = np.arange(len(keys), dtype=float)
    tokens = (keys > 0) | (values > 0)
    count = 2 * tokens + (states > 0)
    count = np.where(count == 0, 2, count)  # an empty layer: its keys and values bars, flat
    width = np.where(count == 1, 0.4, 0.8 / count)
    left = layers - count * width / 2  # where the layer's first bar begins
    key_x = left + width / 2
    value_x = key_x + width
    state_x = np.where(tokens, value_x + width, key_x)
    return [(key_x, width), (value_x, width), (state_x, width)]


PLAIN_NAMES = (("keys", ""), ("values", ""))  # the per-layer plot's first two bars, with their legend tooltips


def latent_names(latent: dict) -> tuple[tuple[str, str], tuple[str, str]]:
    """The first two bars' names under multi-head latent attention (the model card's `latent_attention`): the cache
    holds the compressed latent where keys would be and the rotary key part where values would be."""
    return (
        ("latent", f"the compressed latent (kv_lora_rank {latent['kv_lora_rank']}), cached where keys would be: "
                   "every head's keys and values are computed from it at each step"),
        ("rotary key part", f"the rotated key part shared by all heads (qk_rope_head_dim "
                            f"{latent['qk_rope_head_dim']}), cached where values would be"),
    )


def latent_words(trace) -> str:
    """For the cache map's hover: what a latent-attention model caches per position ("" for other models)."""
    latent = (trace.model or {}).get("latent_attention") if trace is not None else None
    if not latent:
        return ""
    return (f"; cached as the compressed latent, {latent['stored_bytes']:,} bytes per token (per-head keys and "
            f"values would take {latent['expanded_bytes']:,}, {latent['factor']:.1f}x)")


def beside_positions(record) -> str:
    """What a layer keeps beside the positions the cache map draws, for its hover text ("" if nothing): a hybrid
    layer's fixed-size state, an encoder-decoder's cross-attention keys and values."""
    if record is None:
        return ""
    if record.cross_bytes:
        return (f"; beside them, cross-attention keys and values of the {record.cross_tokens:,} prompt tokens the "
                f"encoder read ({record.cross_bytes:,} bytes, fixed)")
    if record.state_bytes:
        return f"; beside them, a fixed-size state of {record.state_bytes:,} bytes"
    return ""


class LayerBytesPlot(PlotPanel):
    title = "Cache bytes per layer, now"
    integer_axes = ("bottom",)
    legend_runs = "primary"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("bytes (KiB)", "layer")
        self.keys = pg.BarGraphItem(x=[], height=[], width=0.4, brush=KEYS_COLOUR, pen=None)
        self.values = pg.BarGraphItem(x=[], height=[], width=0.4, brush=VALUES_COLOUR, pen=None)
        self.states = pg.BarGraphItem(x=[], height=[], width=0.4, brush=STATE_COLOUR, pen=None)
        for item in (self.keys, self.values, self.states):
            self.plot.addItem(item)
        self._drawn = (None, -1)
        self._unit = (1024.0, "KiB")
        self._data = (np.zeros(0), np.zeros(0), np.zeros(0))
        self._fixed_kind: str | None = None  # what the third bar is (RunSeries.fixed_kind)
        self._names = PLAIN_NAMES  # what the first two bars are

    def legend_entries(self):
        (keys, key_tip), (values, value_tip) = self._names
        entries = [Entry(keys, KEYS_COLOUR, kind="box", tooltip=key_tip),
                   Entry(values, VALUES_COLOUR, kind="box", tooltip=value_tip)]
        if self._fixed_kind == FIXED_CROSS:
            entries.append(Entry("cross-attention keys + values", CROSS_COLOUR, kind="box",
                                 tooltip="an encoder-decoder's keys and values of the encoder's output (the prompt): "
                                 "fixed once the prompt is read"))
        elif self._fixed_kind:
            entries.append(Entry("fixed-size state", STATE_COLOUR, kind="box",
                                 tooltip="a linear-attention or state-space layer's convolution and recurrent "
                                 "states: the same size whatever the context"))
        return entries

    def redraw(self, runs, primary):
        super().redraw(runs, primary)
        key = (primary.run_id if primary else None, primary.n if primary else -1)
        if key == self._drawn:
            return
        self._drawn = key
        keys, values, states = primary.layer_bytes() if primary else (np.zeros(0), np.zeros(0), np.zeros(0))
        self._data = (keys, values, states)
        fixed_kind = primary.fixed_kind if primary else None
        latent = (primary.trace.model or {}).get("latent_attention") if primary else None
        names = latent_names(latent) if latent else PLAIN_NAMES
        if (fixed_kind, names) != (self._fixed_kind, self._names):
            self._fixed_kind, self._names = fixed_kind, names
            self.states.setOpts(brush=CROSS_COLOUR if fixed_kind == FIXED_CROSS else STATE_COLOUR)
            self.update_legend()
        peak = max(keys.max(initial=0), values.max(initial=0), states.max(initial=0))
        unit = (1024.0 * 1024.0, "MiB") if peak >= 1024 * 1024 else (1024.0, "KiB")
        if unit != self._unit:
            self._unit = unit
            self.plot.setLabel("left", f"bytes ({unit[1]})")
        places = bar_places(keys, values, states)
        for item, heights, (x, width) in zip((self.keys, self.values, self.states), (keys, values, states), places,
                                             strict=True):
            item.setOpts(x=x, height=heights / unit[0], width=width)

    def hover_text(self, x, y):
        keys, values, states = self._data
        i = int(round(x))
        if not 0 <= i < len(keys):
            return ""
        scale, name = self._unit
        (first, _), (second, _) = self._names
        text = f"layer {i}: {first} {keys[i] / scale:.1f} {name}, {second} {values[i] / scale:.1f} {name}"
        return text + (f", {self._fixed_kind} {states[i] / scale:.1f} {name}" if states[i] else "")


class LayerTimePlot(NotePlot):
    title = "Time per layer (mean over decode steps)"
    integer_axes = ("bottom",)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("time (ms)", "layer")
        self._curves: dict[int, tuple[pg.PlotDataItem, int]] = {}

    def redraw(self, runs, primary):
        super().redraw(runs, primary)
        shown = {r.run_id for r in runs}
        for run_id in list(self._curves):
            if run_id not in shown:
                self.plot.removeItem(self._curves.pop(run_id)[0])
        measured = 0
        for series in runs:
            means = series.layer_ms_mean()
            entry = self._curves.get(series.run_id)
            if entry is None:
                colour = theme.run_colour(series.run_id)
                item = pg.PlotDataItem(
                    pen=pg.mkPen(colour, width=1), symbol="o", symbolSize=5, symbolBrush=colour, symbolPen=None
                )
                self.plot.addItem(item)
                entry = (item, -1)
            item, drawn = entry
            if means is not None:
                measured += 1
                if drawn != series.n:
                    item.setData(np.arange(len(means)), means)
            self._curves[series.run_id] = (item, series.n)
        self.set_note("" if measured else _why_no_layer_time(runs))

    def restyle(self):
        for item, _ in self._curves.values():
            self.plot.removeItem(item)
        self._curves.clear()
        if self._runs:
            self.redraw(self._runs, self._primary)

    def hover_text(self, x, y):
        i = int(round(x))
        parts = []
        for series in self._runs:
            means = series.layer_ms_mean()
            if means is not None and 0 <= i < len(means):
                parts.append(self.swatch(theme.run_colour(series.run_id), f"{means[i]:.2f} ms"))
        return (f"layer {i}: " + " &nbsp; ".join(parts)) if parts else ""


def pinned_words(series) -> str:
    """ "needle held in 12 of 30 x 3 layer-heads; " at the step drawn (each pinned span), "" when none is pinned."""
    step = series.latest
    if not series.trace.pins or step is None or not step.pins_held:
        return ""
    return "".join(f"{'needle' if len(series.trace.pins) == 1 else pin.label[:20] or 'span'} "
                   f"{heads_holding(counts, pin.size).text()}; "
                   for pin, counts in zip(series.trace.pins, step.pins_held, strict=True))


def _why_no_layer_time(runs) -> str:
    """Why none of `runs` has a mean per-layer time ("" when there is no run): not yet (no decode step so far: a
    warm-up or the prefill is running), none to time (a run of one token), or not measured (a compiled run)."""
    if not runs:
        return ""
    if any(series.first_decode_x is not None for series in runs):
        return "per-layer time is not measured for this run" if len(runs) == 1 else \
            "per-layer time is not measured for these runs"
    if all(series.finished for series in runs):
        return "no decode step to time: the run generated only its first token"
    return "per-layer time: the mean over decode steps, from the first one on"


class CacheMapPlot(PlotPanel):
    title = "Cache map: what each layer holds at each position"
    integer_axes = ("left",)
    legend_runs = "none"  # the title names the run shown

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("layer", "position (token)")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.plot.invertY(True)
        self.plot.showGrid(x=False, y=False)
        self._drawn = (None, -1)
        self._image = np.zeros((0, 0), dtype=np.uint8)
        self._step = None  # the step drawn (hover reads its layers)
        self._lut = theme.state_lut(self.palette_)
        # the pinned spans' boxes, one curve per state (kvviz.qt.plots.pin_outline), over the image
        self.pin_curves = {state: pg.PlotDataItem(pen=pg.mkPen(self.pin_colour(state), width=3), connect="finite")
                           for state in Held}
        for curve in self.pin_curves.values():
            curve.setZValue(10)
            self.plot.addItem(curve)
        self._pins_drawn: set[Held] = set()
        # a line across the layers where the cache was compressed while decoding (RunSeries.compressions)
        self.compression_marks = pg.PlotDataItem(connect="pairs", pen=self._marks_pen(self.palette_))
        self.compression_marks.setZValue(1)  # over the image
        self.plot.addItem(self.compression_marks, ignoreBounds=True)

    @staticmethod
    def _marks_pen(palette):
        return pg.mkPen(palette.foreground, width=1, style=Qt.PenStyle.DashLine)

    def apply_palette(self, palette):
        super().apply_palette(palette)
        self.plot.showGrid(x=False, y=False)
        self._lut = theme.state_lut(palette)
        self.image.setLookupTable(self._lut)
        self.compression_marks.setPen(self._marks_pen(palette))
        self._drawn = (None, -1)
        for state, curve in self.pin_curves.items():
            curve.setPen(pg.mkPen(self.pin_colour(state), width=3))

    def pin_colour(self, state: Held) -> str:
        return PIN_COLOURS.get(state, self.palette_.foreground)

    def legend_entries(self):
        """What each colour of the map means; with per-head eviction, the fainter blues of positions some KV heads
        hold."""
        palette = self.palette_
        shown = set(np.unique(self._image).tolist()) if self._image.size else set()
        entries = [Entry(theme.STATE_LABELS[s], theme.state_colour(s, palette), kind="box") for s in SlotState
                   if s in ALWAYS_SHOWN or int(s) in shown]
        step = self._primary.latest if self._primary is not None else None
        if step is not None and any(layer.head_spans for layer in step.layers):
            entries.insert(
                SlotState.FULL + 1,
                Entry(HELD_BY_SOME, theme.held_share_colour(0.0, palette), kind="ramp",
                      to_colour=theme.held_share_colour(1.0, palette),
                      tooltip="per-head eviction: a position that some of the layer's KV heads hold, not all, is "
                      "full precision's blue, the fainter the fewer heads hold it; hover a cell for the count"),
            )
        compressions = self._primary.compressions if self._primary is not None else []
        if compressions:  # beside the evicted colour, what it is about (the legend's last entries may be cut)
            after = next(i for i, e in enumerate(entries) if e.text == theme.STATE_LABELS[SlotState.EVICTED]) + 1
            entries.insert(after, Entry(f"compressed while decoding ({len(compressions):,}×)", palette.foreground,
                                 style=Qt.PenStyle.DashLine, width=1.0,
                                 tooltip="a step after which the cache held fewer tokens than before it (a policy "
                                 "compressing every decode_interval tokens); hover near a line for the sizes"))
        for state in Held:
            if state in self._pins_drawn:
                entries.append(Entry(f"pinned: {state.value}", self.pin_colour(state), kind="line",
                                     tooltip="a pinned span (a task item's needle, words pinned), outlined per layer"))
        return entries

    def redraw(self, runs, primary):
        super().redraw(runs, primary)
        key = (primary.run_id if primary else None, primary.latest.index if primary and primary.latest else -1)
        if key == self._drawn:
            return
        self._drawn = key
        # the run shown and the strategy of the step shown (after a live switch: the new one), even before
        # the run's first step: never the title of a run no longer shown over this one's empty map
        # a pinned span's count first: a long strategy label is cut before it
        self.set_title_detail((pinned_words(primary) + primary.label_now()) if primary else "")
        image = primary.cache_map() if primary else np.zeros((0, 0), dtype=np.uint8)
        kinds_before = set(np.unique(self._image).tolist()) & {SlotState.STATE, SlotState.SHARED}
        self._image = image
        if kinds_before != set(np.unique(image).tolist()) & {SlotState.STATE, SlotState.SHARED}:
            self.update_legend()
        self._step = primary.latest if primary else None
        self._draw_pins(primary, image.shape[0])
        self._mark_compressions(primary, image.shape[0])
        if image.size == 0:
            self.image.clear()
            return
        # no downsampling: it averages neighbouring cells, and the average of two states is a third state
        self.image.setImage(image, levels=(0, 255), lut=self._lut, autoLevels=False, autoDownsample=False)
        # row i spans i-0.5 .. i+0.5, so that the tick "i" sits in the middle of layer i
        self.image.setRect(0, -0.5, image.shape[1], image.shape[0])
        self.plot.setLimits(xMin=0, xMax=max(image.shape[1], 1), yMin=-0.5, yMax=image.shape[0] - 0.5)

    def _draw_pins(self, primary, layers: int) -> None:
        """Outline the run's pinned spans in the colour of what each layer holds of them at the step drawn."""
        pins = primary.trace.pins if primary is not None else []
        held = self._step.pins_held if self._step is not None else None
        boxes = outlines(pins, held, layers) if pins and held and layers else {}
        drawn = {state for state, points in boxes.items() if len(points)}
        for state, curve in self.pin_curves.items():
            if state in drawn:
                curve.setData(boxes[state][:, 0], boxes[state][:, 1])
            else:
                curve.setData([], [])
        if drawn != self._pins_drawn:
            self._pins_drawn = drawn
            self.update_legend()

    def _mark_compressions(self, primary, layers: int) -> None:
        compressions = primary.compressions if primary is not None and layers else []
        if not compressions:
            self.compression_marks.setData([], [])
            return
        xs = np.repeat([c.x for c in compressions], 2)
        self.compression_marks.setData(xs, np.tile([-0.5, layers - 0.5], len(compressions)))

    def compression_positions(self) -> list[float]:
        """x of each compression line drawn (tests)."""
        x, _ = self.compression_marks.getData()
        return [] if x is None else x[::2].tolist()

    def hover_text(self, x, y):
        text = self._hover_cell(x, y)
        near = [c for c in (self._primary.compressions if self._primary is not None else []) if abs(c.x - x) <= 1]
        if text and near:
            c = near[0]
            text += (f"<br>compressed at step {c.step}: {c.before:,.0f} → {c.after:,.0f} tokens held per layer"
                     + (f", {c.scoring_ms:.1f} ms choosing" if c.scoring_ms else ""))
        return text

    def _hover_cell(self, x, y) -> str:
        layer, position = int(np.floor(y + 0.5)), int(np.floor(x))
        image = self._image
        if not (0 <= layer < image.shape[0] and 0 <= position < image.shape[1]):
            return ""
        return self._cell_text(layer, position, image) + self._pin_text(layer, position)

    def _pin_text(self, layer: int, position: int) -> str:
        """Where the cell is in a pinned span: how many of its tokens each KV head of the layer holds."""
        pins = self._primary.trace.pins if self._primary is not None else []
        index = pin_at(pins, position)
        if index is None:
            return ""
        pin = pins[index]
        held = self._step.pins_held if self._step is not None else None
        counts = held[index][layer] if held and layer < len(held[index]) else None
        words = html.escape(pin.label or "tokens", quote=False)
        if counts is None:
            return f"<br>pinned “{words}” (tokens {pin.start}-{pin.end - 1})"
        return (f"<br>pinned “{words}” (tokens {pin.start}-{pin.end - 1}): its {pin.size} tokens held per KV head "
                f"of this layer: {', '.join(map(str, counts))}")

    def _cell_text(self, layer: int, position: int, image: np.ndarray) -> str:
        value = int(image[layer, position])
        where = html.escape(cell_name(self._primary.trace if self._primary else None, layer, position), quote=False)
        record = self._step.layers[layer] if self._step is not None and layer < len(self._step.layers) else None
        held = heads_at(record, position) if record is not None else None
        if value == SlotState.STATE and record is not None:
            shapes = ", ".join("[" + ", ".join(map(str, shape)) + "]" for shape in record.state_shapes or ())
            return (f"layer {layer}: a fixed-size state of {record.state_bytes:,} bytes (convolution and recurrent "
                    f"states {shapes}): every token so far folded in, no positions held")
        if held is None:
            words = latent_words(self._primary.trace if self._primary else None) if value == SlotState.FULL else ""
            return f"{where}: {theme.STATE_LABELS[SlotState(value)]}" + words + beside_positions(record)
        heads = kv_heads(self._primary.trace, record)
        if value >= RAMP_START:
            return f"{where}: held by {held} of {heads} KV heads"
        state = theme.STATE_LABELS[SlotState(value)]
        return f"{where}: {state}, held by " + ("no KV head" if held == 0 else f"all {heads} KV heads")
