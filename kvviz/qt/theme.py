"""Colours of the window, all of them here: dark and light palettes, one colour per run, one colour per
cache slot state, and the named data colours every plot draws with.

The data and run colours come from the Okabe-Ito and Tableau palettes, which stay apart for the
common kinds of colour blindness and on both dark and light backgrounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyqtgraph as pg

from kvviz.files.trace import SlotState
from kvviz.qt.cache_cells import RAMP_START, RAMP_STEPS

THEMES = ("dark", "light")


# Tableau 10, reordered so that the first runs get the most distinct colours.
RUN_COLOURS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
# The same hues made darker where they had less than 3:1 contrast on white (the light theme's plots):
# Tableau's yellow, grey, pink, cyan and orange read as faint lines there.
LIGHT_RUN_COLOURS = (
    "#4e79a7",
    "#d9730d",
    "#569c4d",
    "#e15759",
    "#b07aa1",
    "#519b95",
    "#ad8b11",
    "#d46a85",
    "#9c755f",
    "#8c7f7a",
)


@dataclass(frozen=True)
class Palette:
    name: str
    background: str  # plot background
    foreground: str  # axes, labels
    muted: str  # secondary text (the prompt in the token view)
    unseen: str  # cache slot that does not exist yet
    preallocated: str  # cache slot allocated but not written
    evicted: str  # cache slot whose token was dropped (muted: what is kept matters more)
    predicted_alpha: int  # alpha (0-255) of the dashed "predicted" curves
    shade: tuple[int, int, int]  # token-latency shading colour (RGB)
    run_colours: tuple[str, ...]  # one per run, in order (see RUN_COLOURS)


PALETTES = {
    "dark": Palette(
        name="dark",
        background="#1e2127",
        foreground="#d7dae0",
        muted="#8a919c",
        unseen="#2a2e36",
        preallocated="#5b6472",
        evicted="#7d3f2c",
        predicted_alpha=200,
        shade=(230, 120, 40),
        run_colours=RUN_COLOURS,
    ),
    "light": Palette(
        name="light",
        background="#ffffff",
        foreground="#262a30",
        muted="#6b7280",
        unseen="#eef0f3",
        preallocated="#b3bac5",
        evicted="#c49a80",  # a light brown: "brown" in both themes (it was a peach that Help called muted red)
        predicted_alpha=220,
        shade=(240, 140, 40),
        run_colours=LIGHT_RUN_COLOURS,
    ),
}

# Okabe-Ito data colours: the same in both themes, legible on the dark and the light background.
BLUE = "#56b4e9"  # sky blue
ORANGE = "#e69f00"
GREEN = "#009e73"  # bluish green
PURPLE = "#cc79a7"  # reddish purple
YELLOW = "#f0e442"
VERMILLION = "#d55e00"

# Slot states that hold data keep their colour in both themes.
_STATE_COLOURS = {
    SlotState.FULL: BLUE,
    SlotState.QUANTIZED: ORANGE,
    SlotState.RESIDUAL: GREEN,
    SlotState.SINK: PURPLE,
    SlotState.STATE: YELLOW,
    SlotState.SHARED: VERMILLION,
}

# Each state's colour in a word that is true in both themes (Help says these; a test checks them against the hues).
# Okabe-Ito's "reddish purple" reads as pink in a cell.
STATE_COLOUR_WORDS = {
    SlotState.UNSEEN: "background",
    SlotState.PREALLOCATED: "grey",
    SlotState.FULL: "blue",
    SlotState.QUANTIZED: "orange",
    SlotState.RESIDUAL: "green",
    SlotState.EVICTED: "brown",
    SlotState.SINK: "pink",
    SlotState.STATE: "yellow",
    SlotState.SHARED: "vermillion",
}
# A position held by some of a layer's KV heads, not all: the full-precision blue, fainter (nearer the plot's
# background) the fewer heads hold it; the fewest heads still get this much of the blue, so that the shade never
# reads as the grey of "allocated, empty" or the background of "not yet used".
HELD_SHARE_FLOOR = 0.35

STATE_LABELS = {
    SlotState.UNSEEN: "not yet used",
    SlotState.PREALLOCATED: "allocated, empty",
    SlotState.FULL: "full precision",
    SlotState.QUANTIZED: "quantized",
    SlotState.RESIDUAL: "residual buffer",
    SlotState.EVICTED: "evicted",
    SlotState.SINK: "attention sink",
    SlotState.STATE: "fixed-size state, no positions",
    SlotState.SHARED: "shares another layer's keys and values",
}

_current = "dark"  # the theme the application is styled with (one per application, like its stylesheet)


def use(name: str) -> Palette:
    """Make `name` the theme the colour functions below answer for; its palette."""
    global _current
    _current = name if name in PALETTES else "dark"
    return PALETTES[_current]


def current() -> Palette:
    return PALETTES[_current]


def run_colour(run_id: int, palette: Palette | None = None) -> str:
    """The colour of run `run_id` (1-based) in every plot, table row and legend, in `palette` (default: the
    current theme's)."""
    colours = (palette or current()).run_colours
    return colours[(run_id - 1) % len(colours)]


def readable(colour: str, palette: Palette | None = None, contrast: float = 3.0) -> str:
    """`colour` darkened or lightened (same hue) until a thin line of it has `contrast` against the plot
    background of `palette` (default: the current theme's); unchanged when it has already."""
    palette = palette or current()
    background = pg.mkColor(palette.background)
    darker = _luminance(background) > 0.5
    c = pg.mkColor(colour)
    hue, saturation, lightness, alpha = c.getHslF()
    for _ in range(60):
        if contrast_ratio(c, background) >= contrast:
            break
        lightness = lightness * 0.95 if darker else lightness + (1.0 - lightness) * 0.08
        c.setHslF(hue, saturation, lightness, alpha)
    return c.name()


def mix(colour: str, other: str, share: float) -> str:
    """`share` (0..1) of `other` mixed into `colour`."""
    a, b = pg.mkColor(colour), pg.mkColor(other)
    channels = (round(x + (y - x) * share) for x, y in zip(a.getRgb()[:3], b.getRgb()[:3], strict=True))
    return "#" + "".join(f"{c:02x}" for c in channels)


def _luminance(c) -> float:
    """WCAG relative luminance of a QColor."""

    def linear(v: float) -> float:
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4

    return 0.2126 * linear(c.redF()) + 0.7152 * linear(c.greenF()) + 0.0722 * linear(c.blueF())


def contrast_ratio(a, b) -> float:
    """WCAG contrast ratio of two QColors (1: the same luminance, 21: black on white)."""
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def state_colour(state: SlotState, palette: Palette) -> str:
    if state == SlotState.UNSEEN:
        return palette.unseen
    if state == SlotState.PREALLOCATED:
        return palette.preallocated
    if state == SlotState.EVICTED:
        return palette.evicted
    return _STATE_COLOURS[SlotState(state)]


def held_share_colour(share: float, palette: Palette) -> str:
    """The colour of a position that a `share` (0..1) of its layer's KV heads hold: full precision's blue, mixed
    toward the plot's background the fewer heads hold it (never less than HELD_SHARE_FLOOR of the blue)."""
    strength = HELD_SHARE_FLOOR + (1 - HELD_SHARE_FLOOR) * share
    return mix(palette.background, state_colour(SlotState.FULL, palette), strength)


def state_lut(palette: Palette) -> np.ndarray:
    """A 256-entry RGBA lookup table: index = SlotState value (levels 0..255 map one to one); from RAMP_START on,
    the share of KV heads that hold a position (kvviz.qt.cache_cells), `held_share_colour`."""
    lut = np.zeros((256, 4), dtype=np.uint8)
    lut[:] = _rgba(palette.unseen)
    for state in SlotState:
        lut[int(state)] = _rgba(state_colour(state, palette))
    for step in range(RAMP_STEPS + 1):
        lut[RAMP_START + step] = _rgba(held_share_colour(step / RAMP_STEPS, palette))
    return lut


def _rgba(colour: str) -> tuple[int, int, int, int]:
    c = pg.mkColor(colour)
    return c.red(), c.green(), c.blue(), 255


def resources_dir() -> Path:
    """The kvviz resources folder (shipped in the wheel as kvviz.resources)."""
    from kvviz import resources

    return Path(resources.path())


def stylesheet(name: str) -> str:
    """The theme's Qt stylesheet, its icon URLs (@ICONS@) pointing at the theme's icon folder."""
    folder = resources_dir() / "styles"
    try:
        text = (folder / f"{name}.qss").read_text(encoding="utf-8")
    except OSError:
        return ""
    return text.replace("@ICONS@", (folder / "icons" / name).as_posix())


def style_plot(plot: pg.PlotItem, palette: Palette) -> None:
    """Axis pens, label colours and grid for one plot."""
    for name in ("left", "bottom", "right", "top"):
        axis = plot.getAxis(name)
        axis.setPen(pg.mkPen(palette.foreground))
        axis.setTextPen(pg.mkPen(palette.foreground))
        axis.label.setDefaultTextColor(pg.mkColor(palette.foreground))
    # No grid: pyqtgraph repaints grid lines with every data update, which costs about 10 ms a
    # plot in software rendering; the crosshair readout gives exact values instead.
    plot.showGrid(x=False, y=False)
    plot.titleLabel.item.setDefaultTextColor(pg.mkColor(palette.foreground))
