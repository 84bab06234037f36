"""What a cache-map cell stands for, on hand-made records: the token at its position and the share of KV heads
that hold it (per-head eviction), in the map's image, its hover and its legend (no engine needed)."""

from __future__ import annotations

import html

import numpy as np
import pytest
from PySide6.QtGui import QColor

from kvviz.files.trace import LayerRecord, SlotState, StepRecord, Trace
from kvviz.qt import theme
from kvviz.qt.cache_cells import RAMP_START, RAMP_STEPS, head_counts, heads_at, quoted, token_at
from kvviz.qt.plots.layer_plots import HELD_BY_SOME, bar_places
from kvviz.qt.series import RunSeries

PIECES = ["<s>", "The", " cat", " sat", "\n", " on"]


def per_head_step(index: int) -> StepRecord:
    """Six prompt positions plus the steps before this one; 3 KV heads. Layer 0 is per-head: positions 1-2 held
    by 2 heads, 3 by none, 4 by 1, the rest by all 3; layer 1 holds everything in every head."""
    seen = len(PIECES) + index
    head_spans = [[3, 1], [2, 2], [0, 1], [1, 1], [3, seen - 5]]
    spans = [[int(SlotState.FULL), 3], [int(SlotState.EVICTED), 1], [int(SlotState.FULL), seen - 4]]
    layers = [
        LayerRecord(100, 100, 10, 10, spans=spans, head_spans=head_spans),
        LayerRecord(100, 100, seen, seen, spans=[[int(SlotState.FULL), seen]]),
    ]
    return StepRecord(index=index, phase="prefill" if index == 0 else "decode", token_id=7, token=f" w{index}",
                      wall_ms=1.0, cache_bytes=400, predicted_cache_bytes=400, rss_bytes=1, strategy="h2o",
                      layers=layers, position=seen)


def shown(plot, x: float, y: float) -> str:
    """The plot's readout at (x, y) as text (readouts are rich text)."""
    return html.unescape(plot.hover_text(x, y))


def trace_of(steps: int) -> Trace:
    return Trace(model={"num_kv_heads": 3}, strategy={"name": "h2o", "options": {"budget": 8}},
                 prompt_tokens=len(PIECES), prompt_pieces=list(PIECES),
                 steps=[per_head_step(i) for i in range(steps)])


def test_tokens_are_named_by_position_prompt_and_generated():
    trace = trace_of(3)
    assert [token_at(trace, p) for p in (0, 2, 4, 6, 8, 9, -1)] == ["<s>", " cat", "\n", " w0", " w2", None, None]
    assert quoted(" cat") == "' cat'" and quoted("\n") == "'\\n'" and quoted(None) == ""
    assert quoted("") == quoted("\ufffd") == "(part of a character)"
    # a file without prompt pieces names the generated tokens only
    bare = Trace(model={}, strategy={"name": "h2o"}, prompt_tokens=6, steps=trace.steps)
    assert token_at(bare, 2) is None and token_at(bare, 7) == " w1"


def test_head_counts_follow_the_head_spans():
    layer = per_head_step(2).layers[0]
    assert head_counts(layer).tolist() == [3, 2, 2, 0, 1, 3, 3, 3]
    assert [heads_at(layer, p) for p in (0, 1, 3, 4, 7, 8)] == [3, 2, 0, 1, 3, None]
    assert head_counts(per_head_step(2).layers[1]) is None


def test_cache_map_shades_positions_some_heads_hold_and_says_so(qtbot):
    from kvviz.qt.plots import CacheMapPlot

    series = RunSeries.from_trace(1, trace_of(3))
    image = series.cache_map()
    assert image.shape == (2, 8)
    two_of_three = RAMP_START + round(2 / 3 * RAMP_STEPS)
    assert image[0].tolist() == [SlotState.FULL, two_of_three, two_of_three, SlotState.EVICTED,
                                 RAMP_START + round(RAMP_STEPS / 3), SlotState.FULL, SlotState.FULL, SlotState.FULL]
    assert (image[1] == SlotState.FULL).all()

    plot = CacheMapPlot()
    qtbot.addWidget(plot)
    plot.redraw([series], series)
    assert shown(plot, 1.5, 0) == "layer 0, position 1 'The': held by 2 of 3 KV heads"
    assert shown(plot, 3.5, 0) == "layer 0, position 3 ' sat': evicted, held by no KV head"
    assert shown(plot, 0.5, 0) == "layer 0, position 0 '<s>': full precision, held by all 3 KV heads"
    assert shown(plot, 4.5, 1) == "layer 1, position 4 '\\n': full precision"
    assert shown(plot, 7.2, 1) == "layer 1, position 7 ' w1': full precision"
    texts = plot.legend_bar.texts()
    assert texts.index(HELD_BY_SOME) == texts.index("full precision") + 1  # the shades follow the colour they fade
    # the lookup table shades full precision's colour, fainter the fewer heads; every head: full precision itself
    lut = plot._lut
    assert (lut[RAMP_START + RAMP_STEPS] == lut[SlotState.FULL]).all()
    assert len({tuple(lut[v]) for v in image[0]}) == 4  # full, two shades, evicted


def test_cache_map_of_a_layer_choice_has_no_share_legend(qtbot):
    from kvviz.qt.plots import CacheMapPlot

    trace = trace_of(2)
    for step in trace.steps:
        step.layers[0].head_spans = None
    series = RunSeries.from_trace(1, trace)
    plot = CacheMapPlot()
    qtbot.addWidget(plot)
    plot.redraw([series], series)
    assert np.isin(series.cache_map(), [SlotState.FULL, SlotState.EVICTED]).all()
    assert HELD_BY_SOME not in plot.legend_bar.texts()
    assert shown(plot, 3.5, 0) == "layer 0, position 3 ' sat': evicted"


def hls(colour) -> tuple[float, float, float]:
    """Hue (degrees), lightness and saturation (0..1) of a colour name or an RGBA row of a lookup table."""
    c = QColor(colour) if isinstance(colour, str) else QColor(*(int(v) for v in colour[:3]))
    hue, saturation, lightness, _ = c.getHslF()
    return hue * 360, lightness, saturation


# What a colour word may mean: hue range (degrees) and the least and most saturation.
WORDS = {
    "blue": ((185, 235), 0.4, 1.0),
    "orange": ((25, 50), 0.6, 1.0),
    "green": ((140, 180), 0.4, 1.0),
    "pink": ((300, 345), 0.3, 1.0),
    "yellow": ((50, 65), 0.6, 1.0),
    "vermillion": ((15, 30), 0.6, 1.0),
    "brown": ((5, 35), 0.25, 0.6),  # a dull red-orange, darker or lighter
    "grey": ((0, 360), 0.0, 0.15),
}


@pytest.mark.parametrize("name", theme.THEMES)
def test_each_states_colour_word_is_true_in_both_themes(name):
    palette = theme.PALETTES[name]
    for state, word in theme.STATE_COLOUR_WORDS.items():
        colour = theme.state_colour(state, palette)
        if word == "background":  # next to the plot's background, nearly the same
            assert theme.contrast_ratio(QColor(colour), QColor(palette.background)) < 1.2, (state, colour)
            continue
        hue, lightness, saturation = hls(colour)
        (low, high), least, most = WORDS[word]
        assert low <= hue <= high and least <= saturation <= most, (state, word, colour, hue, saturation)
        assert word == "grey" or 0.25 <= lightness <= 0.7, (state, word, colour, lightness)  # not near white or black


@pytest.mark.parametrize("name", theme.THEMES)
def test_positions_some_heads_hold_are_a_fainter_blue_never_a_grey(name):
    """Held by 1 of 8 heads up to 7 of 8: full precision's hue, saturated, apart from "allocated, empty" (grey) and
    "not yet used" (the background); the fewer heads, the nearer the plot's background."""
    palette = theme.PALETTES[name]
    lut = theme.state_lut(palette)
    full_hue = hls(theme.state_colour(SlotState.FULL, palette))[0]
    background = QColor(palette.background)
    nearness = []
    for heads in range(1, 8):
        value = RAMP_START + round(heads / 8 * RAMP_STEPS)
        hue, _, saturation = hls(lut[value])
        # saturated, where the words test holds "grey" (allocated, empty) to 0.15 at most
        assert abs(hue - full_hue) < 12 and saturation > 0.3, (heads, hue, saturation)
        colour = QColor(*(int(v) for v in lut[value][:3]))
        nearness.append(theme.contrast_ratio(colour, background))
    assert nearness == sorted(nearness)  # more heads: further from the background
    assert nearness[0] > 1.3 > theme.contrast_ratio(QColor(palette.unseen), background)  # and never "not yet used"


def test_each_layers_bars_sit_centred_on_its_tick():
    # layers: a state layer, a plain one, a hybrid one (state + keys and values), an empty one
    keys = values = np.array([0.0, 5.0, 5.0, 0.0])
    states = np.array([3.0, 0.0, 3.0, 0.0])
    (key_x, width), (value_x, _), (state_x, _) = bar_places(keys, values, states)
    drawn = [[state_x[0]], [key_x[1], value_x[1]], [key_x[2], value_x[2], state_x[2]], [key_x[3], value_x[3]]]
    for layer, centres in enumerate(drawn):
        assert np.mean(centres) == pytest.approx(layer)
        assert np.diff(centres) == pytest.approx(width[layer])  # side by side, not overlapping
