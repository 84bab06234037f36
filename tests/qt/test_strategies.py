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
