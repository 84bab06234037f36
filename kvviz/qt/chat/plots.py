"""The Chat tab's plots, over tokens in context across the whole chat, with the turns marked.

- memory: the cache's bytes measured after every generated token (solid) and predicted from the config (dashed);
- latency: every step's time, each turn's first token (its prefill: the history's new tokens) as a marker;
- the cache map: layers x positions of the chat, each position coloured by the role of the turn it belongs to
  (shades alternate from turn to turn) where the cache still holds it, in the evicted colour where it does not.

Each turn's first token (where its user message begins) is a dashed vertical line with the turn's number.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from kvviz.files.trace import SlotState
from kvviz.present import MIB, mib
from kvviz.qt import theme
from kvviz.qt.plots.base import PlotPanel
from kvviz.qt.plots.legend import Entry

TOKENS = "tokens in context"
# what a position of the cache map holds: its role (two shades a role, alternating with the turns), or evicted
ROLE_COLOURS = {"system": ("#8e99a8", "#8e99a8"), "user": ("#4c8bf5", "#2d63c8"),
                "assistant": ("#f0a030", "#c47812")}
UNSEEN, EVICTED = 0, 1
HELD = {int(SlotState.FULL), int(SlotState.QUANTIZED), int(SlotState.RESIDUAL), int(SlotState.SINK)}


def role_codes() -> list[tuple[str, int]]:
    """(role, shade) in the order of the colour table after UNSEEN and EVICTED."""
    return [(role, shade) for role in ROLE_COLOURS for shade in (0, 1)]


class TurnLines:
    """Dashed vertical lines at each turn's first token, numbered."""

    def __init__(self, plot: pg.PlotItem):
        self.plot = plot
        self.lines: list[pg.InfiniteLine] = []
        self._shown: tuple = ()  # the starts and colour drawn (every frame of a long chat draws the same)

    def set_turns(self, starts: list[tuple[int, int]], colour: str) -> None:
        """starts: (turn number, first token) of each turn of the chat on screen."""
        if self._shown == (starts, colour):
            return
        self._shown = (list(starts), colour)
        for line in self.lines[len(starts):]:
            self.plot.removeItem(line)
        del self.lines[len(starts):]
        pen = pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine)
        for i, (number, start) in enumerate(starts):
            if i == len(self.lines):
                line = pg.InfiniteLine(angle=90, movable=False, label=f"T{number}",
                                       labelOpts={"position": 0.92, "color": colour})
                self.plot.addItem(line, ignoreBounds=True)
                self.lines.append(line)
            self.lines[i].setPen(pen)
            self.lines[i].label.setColor(colour)
            self.lines[i].setValue(start)


class ChatSeriesPlot(PlotPanel):
    """A plot over tokens in context of the chat on screen, with its turns marked."""

    crosshair_line = True
    legend_runs = "none"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.turn_lines = TurnLines(self.plot)
        self.x = np.zeros(0)  # the chat's steps: tokens in context, and the columns the plots draw
        self.columns: dict[str, np.ndarray] = {}

    def has_data(self) -> bool:
        return bool(len(self.x))

    def show_chat(self, x: np.ndarray, columns: dict[str, np.ndarray], turns: list[tuple[int, int]]) -> None:
        self.x, self.columns = x, columns
        self.draw(x, columns)
        self.turn_lines.set_turns(turns, self.palette_.muted)
        self.update_legend()

    def draw(self, x: np.ndarray, columns: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def hover_text(self, x: float, y: float) -> str:
        if not len(self.x):
            return ""
        i = int(np.clip(np.searchsorted(self.x, x), 0, len(self.x) - 1))
        return f"{int(self.x[i]):,} tokens in context: {self.step_text(i)}"

    def step_text(self, i: int) -> str:
        """What the hover readout says of step i."""
        raise NotImplementedError


class ChatMemoryPlot(ChatSeriesPlot):
    title = "Cache memory across the conversation: measured and predicted"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("cache memory (MiB)", TOKENS)
        self.measured = self.plot.plot(pen=pg.mkPen(theme.run_colour(1), width=2))
        self.predicted = self.plot.plot(pen=pg.mkPen(theme.run_colour(1), width=1.5, style=Qt.PenStyle.DashLine))

    def legend_entries(self) -> list[Entry]:
        colour = theme.run_colour(1)
        return [Entry("measured", colour, width=2.0), Entry("predicted", colour, style=Qt.PenStyle.DashLine)]

    def draw(self, x, columns) -> None:
        self.measured.setData(x, columns["cache_bytes"] / MIB, connect=columns["connect"])
        self.predicted.setData(x, columns["predicted_cache_bytes"] / MIB, connect=columns["connect"])

    def step_text(self, i: int) -> str:
        columns = self.columns
        return f"{mib(columns['cache_bytes'][i])} measured, {mib(columns['predicted_cache_bytes'][i])} predicted"


class ChatLatencyPlot(ChatSeriesPlot):
    title = "Step latency across the conversation: each turn's first token marked"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("step latency (ms)", TOKENS)
        self.curve = self.plot.plot(pen=pg.mkPen(theme.run_colour(1), width=1.2))
        self.first = pg.ScatterPlotItem(size=9, symbol="o", brush=pg.mkBrush(theme.run_colour(2)), pen=None)
        self.plot.addItem(self.first)

    def legend_entries(self) -> list[Entry]:
        return [Entry("decode step", theme.run_colour(1), width=1.5),
                Entry("first token of a turn (its prefill)", theme.run_colour(2), kind="marker")]

    def draw(self, x, columns) -> None:
        decode = columns["prefill"] == 0
        self.curve.setData(x[decode], columns["wall_ms"][decode], connect=columns["connect"][decode])
        first = ~decode
        self.first.setData(x[first], columns["wall_ms"][first])

    def step_text(self, i: int) -> str:
        what = "first token (prefill)" if self.columns["prefill"][i] else "decode step"
        return f"{what} {self.columns['wall_ms'][i]:,.1f} ms"


class ChatCacheMap(PlotPanel):
    """Layers x positions: which turns' tokens the cache still holds, coloured by role."""

    title = "Cache map by turn and role: what the cache holds of each turn"
    integer_axes = ("left",)
    legend_runs = "none"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels("layer", "position in the conversation (tokens)")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.turn_lines = TurnLines(self.plot)
        self.codes = np.zeros((0, 0), dtype=np.uint8)
        self.owners: list[tuple[int, str]] = []  # per position: (turn number, role)

    def legend_entries(self) -> list[Entry]:
        return [Entry(role, colours[0], kind="box") for role, colours in ROLE_COLOURS.items()] + [
            Entry("evicted", self.palette_.evicted, kind="box")]

    def has_data(self) -> bool:
        return bool(self.codes.size)

    def show_map(self, layers, owners: list[tuple[int, str]], turns: list[tuple[int, int]]) -> None:
        """layers: the latest step's LayerRecords (their spans over positions 0 ..); owners: per position."""
        self.owners = owners
        width = len(owners)
        codes = np.full((len(layers), max(width, 1)), UNSEEN, dtype=np.uint8)
        role_code = {key: 2 + i for i, key in enumerate(role_codes())}
        owner_codes = np.array([role_code[(role, number % 2)] for number, role in owners], dtype=np.uint8)
        for row, layer in enumerate(layers):
            position = 0
            for state, count in layer.spans:
                end = min(position + count, width)
                if end > position:
                    codes[row, position:end] = owner_codes[position:end] if state in HELD else (
                        EVICTED if state == SlotState.EVICTED else UNSEEN)
                position += count
        self.codes = codes
        colours = [self.palette_.unseen, self.palette_.evicted] + [ROLE_COLOURS[r][s] for r, s in role_codes()]
        lut = np.array([pg.mkColor(c).getRgb() for c in colours], dtype=np.ubyte)
        self.image.setImage(codes, lut=lut, levels=(0, len(colours) - 1), autoLevels=False)
        self.image.setRect(0, -0.5, max(width, 1), len(layers))
        self.turn_lines.set_turns(turns, self.palette_.foreground)
        self.plot.setXRange(0, max(width, 1), padding=0.01)
        self.plot.setYRange(-0.5, len(layers) - 0.5, padding=0)
        self.update_legend()

    def hover_text(self, x: float, y: float) -> str:
        position, layer = int(x), int(round(y))
        if not (0 <= position < len(self.owners) and 0 <= layer < self.codes.shape[0]):
            return ""
        number, role = self.owners[position]
        held = self.codes[layer, position] >= 2
        return f"position {position:,}, layer {layer}: turn {number}, {role}; {'held' if held else 'evicted'}"

