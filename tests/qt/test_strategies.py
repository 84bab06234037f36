"""Every strategy available on this machine runs once through the window (tiny model)."""

from __future__ import annotations

import pytest

from kvviz.engine import strategies
from kvviz.files.trace import SlotState

# Small options so that a few tokens already show what each strategy does in the cache map.
OPTIONS = {
    "quantized": {"backend": "hqq", "nbits": 4, "residual_length": 4, "q_group_size": 16},
    "sliding": {"window": 8},
    "sink": {"sink_tokens": 2, "window": 6},
    "static": {"max_cache_len": 64},
}
EXPECTED_STATES = {
    "quantized": {SlotState.QUANTIZED},
    "sliding": {SlotState.EVICTED},
    "sink": {SlotState.SINK, SlotState.EVICTED},
    "static": {SlotState.PREALLOCATED},
}
AVAILABLE = [s.name for s in strategies.all_strategies() if s.available()[0]]


@pytest.mark.parametrize("name", AVAILABLE)
def test_strategy_runs_through_the_window(qtbot, drive, window, name):
    drive.load(window, "tiny")
    run_id = drive.run(window, name, OPTIONS.get(name), tokens=8, prompt="Tell me about caches, please.")
    assert window.store.status(run_id) == "finished", window.last_error
    series = window.store.runs[run_id]
    assert len(series.trace.steps) == 8
    assert series.trace.strategy["name"] == name
    assert window.runs_table.cell(run_id, "strategy").startswith(name)
    states = set(int(v) for v in set(window.modes["local"].view.cache_map._image.ravel().tolist()))
    assert EXPECTED_STATES.get(name, set()) <= states, (name, states)


def test_unavailable_strategies_cannot_be_picked(window):
    for strategy in strategies.all_strategies():
        ok, _ = strategy.available()
        assert window.controls.strategy_panel.set_current(strategy.name) == ok


WIDGETS = {"bool": "QCheckBox", "int": "QSpinBox", "float": "QDoubleSpinBox", "choice": "QComboBox"}


def test_every_strategy_and_option_is_in_the_picker_and_help(window):
    """Each engine strategy is listed, each option gets the widget of its kind, and a value set in it reaches the
    engine's parse with its type; Help names each strategy."""
    from kvviz.qt.help import strategies_html

    panel = window.controls.strategy_panel
    listed = [s.name for s in strategies.all_strategies()]
    assert panel.names(available_only=False) == listed
    for name in AVAILABLE:
        assert panel.set_current(name)
        strategy = strategies.get(name)
        for option in strategy.options:
            assert type(panel._widgets[option.name]).__name__ == WIDGETS[option.kind], (name, option.name)
        changed = {o.name: _another_value(o) for o in strategy.options}
        for option, value in changed.items():
            panel.set_option(option, value)
        sent = panel.values()
        assert sent == {k: v for k, v in changed.items() if v != strategy.option(k).default}, name
        assert all(type(sent[k]) is type(strategy.option(k).default) for k in sent), name
        for option in strategy.options:  # back to the defaults, for the next strategy's combinations
            panel.set_option(option.name, option.default)
    page = strategies_html(strategies.all_strategies())
    assert all(f"<b>{name}</b>" in page for name in listed)


def _another_value(option):
    """A value of `option` other than its default, within its range."""
    if option.kind == "bool":
        return not option.default
    if option.kind == "choice":
        return option.choices[-1] if option.default != option.choices[-1] else option.choices[0]
    if option.kind == "float":
        return 0.25 if option.default != 0.25 and (option.maximum is None or option.maximum >= 0.25) else 0.125
    return option.default + 1 if option.maximum is None or option.default + 1 <= option.maximum else option.default - 1


def held_per_layer(step) -> float:
    return sum(layer.seq_len for layer in step.layers) / len(step.layers)


def test_each_compression_while_decoding_is_marked(qtbot, drive, window):
    """key norm compressing every 4 tokens to 6: a dashed line on the cache map at each step that left the cache
    holding fewer tokens than before, its scoring dotted on the latency plot; a policy evicting one token a step
    (h2o) and a sliding window hold as many as before, and get none."""
    drive.load(window, "tiny")
    prompt = "Tell me about caches, please, and why they keep keys."
    options = {"budget": 8, "skip_layers": 0, "decode_interval": 4, "decode_target": 6}
    run_id = drive.run(window, "knorm", options, tokens=12, prompt=prompt)
    series = window.store.runs[run_id]
    steps = series.trace.steps
    dropped = [s.index for before, s in zip(steps, steps[1:], strict=False)
               if held_per_layer(s) < held_per_layer(before)]
    assert dropped == [4, 8]  # 8 after the prompt, 9, 10, 11, then 6 at every 4th token fed
    assert [c.step for c in series.compressions] == dropped
    assert all(c.after == 6 and c.before == 9 for c in series.compressions[1:])
    view = window.modes["local"].view
    window.redraw()
    xs = [series.trace.prompt_tokens + step for step in dropped]
    assert view.cache_map.compression_positions() == xs
    assert any(e.text == "compressed while decoding (2×)" for e in view.cache_map.legend_entries())
    assert "compressed at step 4: " in view.cache_map.hover_text(xs[0] - 0.5, 0)
    scored_x, scored_ms = view.latency_plot.scoring_data(run_id)
    assert set(xs) <= set(scored_x.tolist()) and (scored_ms > 0).all()
    for strategy, every_step in (("h2o", {"budget": 8}), ("sliding", {"window": 8})):
        other = drive.run(window, strategy, every_step, tokens=12, prompt=prompt)
        assert window.store.runs[other].compressions == [], strategy
        window.runs_table.select_runs([other])
        window.redraw()
        assert view.cache_map.compression_positions() == [], strategy


def test_kvzip_scoring_is_shown_beside_the_prefill(qtbot, drive, window):
    """KVzip reads the prompt again after the prefill: that forward is the prefill's scoring, in the legend."""
    drive.load(window, "tiny")
    run_id = drive.run(window, "kvzip", {"budget": 8}, tokens=4, prompt="Tell me about caches, please, and why.")
    series = window.store.runs[run_id]
    assert 0 < series.prefill_scoring_ms < series.prefill_ms
    window.redraw()
    stars = [e.text for e in window.modes["local"].view.latency_plot.legend_entries() if e.marker == "star"]
    assert stars == [f"{series.prefill_ms:.0f} ms, {series.prefill_scoring_ms:.0f} scoring"]
