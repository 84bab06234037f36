"""The attention view: where the current token's attention goes, and how much of it the first positions draw.

- `AttentionMapPlot`: for the step shown, layers x positions, the newest token's attention averaged over the
  query heads (each layer's row sums to 1), on a log colour scale so that the small shares show; positions the
  layer does not hold (evicted) draw no attention and keep the cache map's "evicted" colour.
- `AttentionSinkPlot`: per layer, the share of that attention on the first ATTENTION_SINK_POSITIONS positions
  (the "attention sink" of StreamingLLM) at every step of the run: one line per layer, coloured by depth, and
  their mean; the layer under the mouse stands out and is named.
- `AttentionView`: the two side by side; it says when it is shown or hidden, because the engine computes the
  attention only while someone looks (kvviz.engine.attention_view).

Trace files keep the shares, not the matrices (`StepRecord.attention` is live only). The map draws the newest
matrix the run recorded (`RunSeries.attention_step`: the latest step's, or the last one's before the view was
hidden) and says why it is empty where there is none: a file, a run the engine cannot read, or a run generated while
the view was hidden.
"""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QSplitter

from kvviz.files.trace import ATTENTION_SINK_POSITIONS, SlotState
from kvviz.qt import theme
from kvviz.qt.cache_cells import cell_name, quoted, token_at
from kvviz.qt.plots.legend import Entry
from kvviz.qt.plots.note import NotePlot
from kvviz.qt.series import RunSeries, grown, nearest_index

LOG_FLOOR = -5  # log10 of the smallest share with a colour of its own; smaller shares get the lowest colour
COLOUR_MAP = "viridis"  # perceptually uniform, readable on both themes, apart from the "evicted" colour
NOT_HELD = 0  # image value of a position with no attention (the layer does not hold it)
SHALLOW, DEEP = theme.BLUE, theme.ORANGE  # the sink lines' colours of the first and the last layer
LINE_ALPHA = 150  # of a layer's sink line (0-255)


def _superscript(n: int) -> str:
    return str(n).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


def log_image(matrix: np.ndarray) -> np.ndarray:
    """Attention shares ``[layers, positions]`` as image values: NOT_HELD where zero, else 1..255 along
    log10(share) from LOG_FLOOR to 0."""
    image = np.full(matrix.shape, NOT_HELD, dtype=np.uint8)
    held = matrix > 0
    logs = np.log10(matrix[held], dtype=np.float64)
    image[held] = 1 + np.rint(np.clip(logs / -LOG_FLOOR + 1.0, 0.0, 1.0) * 254).astype(np.uint8)
    return image


def _why_empty(series: RunSeries, refusal: str | None) -> str:
    """Why the run shown has no attention matrix to draw."""
    if refusal:
        return f"no attention for this run: {refusal}"
    if any(step.attention_sink is not None for step in series.trace.steps[: series.n]):
        return ("trace files keep each layer's attention-sink share (right), not where the attention goes: that "
                "shows while a run generates with this view on screen")
    if not series.finished:
        return "the attention is computed from the next step on, while this view is shown"
    return ("not recorded: this view was hidden while the run generated (the attention is computed only while it "
            "is shown); run again with it shown")


class AttentionMapPlot(NotePlot):
    title = "Attention of the current token: layers x positions (mean over heads)"
    integer_axes = ("left",)
    legend_runs = "none"  # the title names the run shown

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("layer", "position (token)")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.plot.invertY(True)
        self.colour_map = pg.colormap.get(COLOUR_MAP)
        self.bar = pg.ColorBarItem(values=(LOG_FLOOR, 0), colorMap=self.colour_map, width=12, interactive=False,
                                   colorMapMenu=False)
        self.bar.axis.setTicks([[(v, "1" if v == 0 else f"10{_superscript(v)}") for v in range(LOG_FLOOR, 1)]])
        self.bar.axis.setLabel("share (log)")
        self.plot.layout.addItem(self.bar, 2, 5)  # after the right-hand axis, as ColorBarItem places itself
        self.plot.layout.setColumnFixedWidth(4, 5)
        self._lut = self._make_lut(self.palette_)
        self._drawn: tuple | None = ()  # what the map was drawn for (run, step drawn, latest step, finished)
        self._matrix: np.ndarray | None = None  # the shares drawn, [layers, positions]
        self.refusals: dict[int, str] = {}  # run id -> why the engine cannot compute its attention

    def refuse(self, run_id: int, why: str) -> None:
        """The engine cannot compute run `run_id`'s attention: the map says why instead."""
        self.refusals[run_id] = why
        self._drawn = ()

    def _make_lut(self, palette: theme.Palette) -> np.ndarray:
        lut = np.zeros((256, 4), dtype=np.uint8)
        lut[1:] = self.colour_map.map(np.linspace(0.0, 1.0, 255), mode="byte")
        lut[NOT_HELD] = pg.mkColor(theme.state_colour(SlotState.EVICTED, palette)).getRgb()
        return lut

    def apply_palette(self, palette):
        super().apply_palette(palette)
        for name in ("left", "right", "top", "bottom"):
            axis = self.bar.getAxis(name)
            axis.setPen(pg.mkPen(palette.foreground))
            axis.setTextPen(pg.mkPen(palette.foreground))
        self.bar.axis.label.setDefaultTextColor(pg.mkColor(palette.foreground))
        self._lut = self._make_lut(palette)
        self.image.setLookupTable(self._lut)
        self._drawn = ()

    def legend_entries(self):
        return [Entry("no attention: not held (evicted)", theme.state_colour(SlotState.EVICTED, self.palette_),
                      kind="box")]

    def has_data(self) -> bool:
        return self._matrix is not None

    def matrix(self) -> np.ndarray | None:
        """The attention shares drawn now (tests)."""
        return self._matrix

    def redraw(self, runs, primary):
        # the newest step that carries its matrix: the latest one, or the last before the view was hidden
        step = primary.attention_step if primary else None
        latest = primary.latest if primary else None
        key = (primary.run_id, step.index if step else None, latest.index if latest else -1, primary.finished) \
            if primary else None
        super().redraw(runs, primary)
        if key == self._drawn:
            return
        self._drawn = key
        self._matrix = step.attention if step is not None else None
        if self._matrix is None:
            self.image.clear()
            self.set_title_detail(primary.label() if primary else "")
            self.set_note(_why_empty(primary, self.refusals.get(primary.run_id)) if latest is not None else "")
            return
        self.set_note("")
        image = log_image(self._matrix)
        self.image.setImage(image, levels=(0, 255), lut=self._lut, autoLevels=False, autoDownsample=False)
        self.image.setRect(0, -0.5, image.shape[1], image.shape[0])
        self.plot.setLimits(xMin=0, xMax=max(image.shape[1], 1), yMin=-0.5, yMax=image.shape[0] - 0.5)
        query = image.shape[1] - 1  # the token fed at this step, the one whose attention this is
        token = quoted(token_at(primary.trace, query))
        detail = f"{primary.label()}, token at position {query}" + (f" {token}" if token else "")
        if step is not latest:  # the view was hidden for the steps after it
            detail += ", the last computed while this view showed"
        self.set_title_detail(detail)

    def hover_text(self, x, y):
        matrix = self._matrix
        if matrix is None:
            return ""
        layer, position = int(np.floor(y + 0.5)), int(np.floor(x))
        if not (0 <= layer < matrix.shape[0] and 0 <= position < matrix.shape[1]):
            return ""
        where = html.escape(cell_name(self._primary.trace, layer, position), quote=False)
        share = float(matrix[layer, position])
        if share <= 0:
            return f"{where}: no attention (the layer does not hold it)"
        return f"{where}: {share * 100:.3g}% of the layer's attention"


class SinkShares:
    """A run's attention-sink shares as columns: x (tokens in context) and one column per layer, NaN at steps
    recorded without them (the view was hidden); caught up from the trace like RunSeries."""

    def __init__(self):
        self.n = 0
        self.x = np.zeros(16)
        self.shares = np.zeros((16, 0))
        self.recorded = 0  # steps that carry shares

    def sync(self, series: RunSeries) -> bool:
        """Take the steps the run drew since the last call; False when there were none."""
        steps = series.trace.steps[self.n : series.n]
        if not steps:
            return False
        if not self.n:
            self.shares = np.zeros((len(self.x), len(steps[0].layers)))
        need = self.n + len(steps)
        self.x, self.shares = grown(self.x, need), grown(self.shares, need)
        for i, step in enumerate(steps, start=self.n):
            self.x[i] = series.trace.prompt_tokens + step.index
            known = step.attention_sink is not None and len(step.attention_sink) == self.shares.shape[1]
            self.shares[i] = step.attention_sink if known else np.nan
            self.recorded += known
        self.n = need
        return True

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        return self.x[: self.n], self.shares[: self.n]


class AttentionSinkPlot(NotePlot):
    title = f"Attention sink: share of each layer's attention on the first {ATTENTION_SINK_POSITIONS} positions"
    crosshair_line = True
    legend_runs = "none"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("attention (share)", "tokens in context")
        self.plot.setYRange(0.0, 1.0, padding=0.02)
        self.plot.enableAutoRange(y=False)
        self.plot.setLimits(yMin=-0.05, yMax=1.05)
        self._run: int | None = None
        self._shares = SinkShares()
        self._lines: list[pg.PlotDataItem] = []
        self._mean = pg.PlotDataItem()
        self._mean.setZValue(10)
        self.plot.addItem(self._mean)
        self._picked: int | None = None  # the layer under the mouse, drawn on top

    def layer_colour(self, layer: int, layers: int) -> str:
        return theme.mix(SHALLOW, DEEP, layer / max(layers - 1, 1))

    def _layer_pen(self, layer: int, layers: int, picked: bool = False):
        """A layer's line: thin and a little see-through, so that the mean reads over thirty of them; the layer
        under the mouse wide and solid."""
        colour = pg.mkColor(self.layer_colour(layer, layers))
        colour.setAlpha(255 if picked else LINE_ALPHA)
        return pg.mkPen(colour, width=3 if picked else 1)

    def legend_entries(self):
        layers = self._shares.shares.shape[1]
        if not layers:
            return []
        return [
            Entry(f"layer 0 … {layers - 1}", SHALLOW, kind="ramp", to_colour=DEEP,
                  tooltip="one line per layer, coloured from the first layer to the last"),
            Entry("mean of the layers", self.palette_.foreground, width=3.0),
        ]

    def has_data(self) -> bool:
        return self._shares.recorded > 0

    def curve_data(self) -> tuple[np.ndarray, np.ndarray]:
        """x and the shares [steps, layers] drawn (tests)."""
        return self._shares.columns()

    def redraw(self, runs, primary):
        run_id = primary.run_id if primary else None
        if run_id != self._run:
            self._run = run_id
            self._shares = SinkShares()
            self._set_lines(0)
        changed = primary is not None and self._shares.sync(primary)
        super().redraw(runs, primary)
        self.set_title_detail(primary.label() if primary else "")
        if primary is None:
            self.set_note("")
            return
        if not self.has_data():
            self.set_note("no attention-sink shares: the attention view was hidden while this run generated"
                          if primary.n else "")
            self._set_lines(0)
            return
        self.set_note("")
        if changed or len(self._lines) != self._shares.shares.shape[1]:
            self._draw()

    def _set_lines(self, layers: int) -> None:
        if len(self._lines) == layers:
            return
        for line in self._lines:
            self.plot.removeItem(line)
        self._lines = []
        for layer in range(layers):
            line = pg.PlotDataItem(pen=self._layer_pen(layer, layers), connect="finite")
            self.plot.addItem(line)
            self._lines.append(line)
        self._mean.setPen(pg.mkPen(self.palette_.foreground, width=3))
        self._picked = None

    def _draw(self) -> None:
        x, shares = self._shares.columns()
        self._set_lines(shares.shape[1])
        for layer, line in enumerate(self._lines):
            line.setData(x, shares[:, layer], connect="finite")
        known = ~np.isnan(shares).all(axis=1)
        mean = np.full(len(x), np.nan)
        mean[known] = shares[known].mean(axis=1)  # a step carries every layer's share or none
        self._mean.setData(x, mean, connect="finite")

    def apply_palette(self, palette):
        super().apply_palette(palette)
        self._mean.setPen(pg.mkPen(palette.foreground, width=3))

    def _pick(self, layer: int | None) -> None:
        """Draw `layer` wide and on top (None: none)."""
        if layer == self._picked:
            return
        layers = len(self._lines)
        if self._picked is not None and self._picked < layers:
            line = self._lines[self._picked]
            line.setPen(self._layer_pen(self._picked, layers))
            line.setZValue(0)
        self._picked = layer
        if layer is not None and layer < layers:
            self._lines[layer].setPen(self._layer_pen(layer, layers, picked=True))
            self._lines[layer].setZValue(20)

    def clear_hover(self) -> None:
        super().clear_hover()
        self._pick(None)

    def hover_text(self, x, y):
        xs, shares = self._shares.columns()
        i = nearest_index(xs, x)
        if i is None or np.isnan(shares[i]).all():
            self._pick(None)
            return ""
        row = shares[i]
        layer = int(np.nanargmin(np.abs(row - y)))
        self._pick(layer)
        colour = self.layer_colour(layer, len(row))
        return (f"{xs[i]:.0f} tokens: " + self.swatch(colour, f"layer {layer} {row[layer]:.3f}")
                + " &nbsp; " + self.swatch(self.palette_.foreground, f"mean {np.nanmean(row):.3f}"))


class AttentionView(QSplitter):
    """The attention map and the sink lines side by side; `sigShownChanged(bool)` as it comes on and off screen
    (a tab switched, the window minimised), so that the engine computes the attention only while it shows."""

    sigShownChanged = Signal(bool)

    def __init__(self, parent=None):
        super().__init__(Qt.Orientation.Horizontal, parent)
        self.map_plot = AttentionMapPlot()
        self.sink_plot = AttentionSinkPlot()
        self.addWidget(self.map_plot)
        self.addWidget(self.sink_plot)
        self.setChildrenCollapsible(False)
        self.setSizes([62, 38])
        self.shown = False

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        self._set_shown(True)

    def hideEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().hideEvent(event)
        self._set_shown(False)

    def _set_shown(self, shown: bool) -> None:
        if shown != self.shown:
            self.shown = shown
            self.sigShownChanged.emit(shown)
