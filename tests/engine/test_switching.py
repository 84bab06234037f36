"""Switching strategy between steps converts the live cache; lossless conversions change nothing."""

import pytest

from kvviz.engine import decode, strategies
from kvviz.engine.strategies import OptionError

PROMPT = "Write a detailed paragraph about the history of Rome."


def run(loaded, name, options=None, switches=None, new_tokens=36):
    settings = decode.GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False)
    decoder = decode.Decoder(loaded, strategies.choose(name, options or {}), settings, PROMPT)
    tokens = []
    for step in decoder:
        tokens.append(step.token_id)
        if switches and step.index + 1 in switches:
            decoder.request_switch(strategies.choose(*switches[step.index + 1]))
    return tokens, decoder


@pytest.fixture(scope="module")
def never_switched(default_model):
    return run(default_model, "dynamic")[0]


def test_dynamic_to_static_and_back_is_lossless(default_model, never_switched):
    tokens, decoder = run(default_model, "dynamic", switches={10: ("static", {}), 22: ("dynamic", {})})
    assert tokens == never_switched
    assert [(s.step, s.from_strategy, s.to_strategy) for s in decoder.trace.switches] == [
        (10, "dynamic", "static"), (22, "static", "dynamic"),
    ]
    assert [s.strategy for s in decoder.trace.steps[9:11]] == ["dynamic", "static"]
    assert all(s.cache_bytes == s.predicted_cache_bytes for s in decoder.trace.steps)
    # static preallocates: memory jumps at the switch and falls back after it
    steps = decoder.trace.steps
    assert steps[10].cache_bytes > steps[9].cache_bytes and steps[22].cache_bytes < steps[21].cache_bytes


@pytest.mark.parametrize(
    "target",
    [("quantized", {"backend": "hqq", "nbits": "4"}), ("sliding", {"window": "16"}), ("sink", {"window": "16"}),
     ("quantized", {"backend": "fp8"})],
    ids=["quantized", "sliding", "sink", "fp8"],
)
def test_dynamic_to_lossy_and_back(default_model, target):
    tokens, decoder = run(default_model, "dynamic", switches={10: target, 20: ("dynamic", {})})
    steps = decoder.trace.steps
    assert steps[10].strategy == target[0] and steps[20].strategy == "dynamic"
    assert steps[10].cache_bytes < steps[9].cache_bytes  # every lossy target holds less
    assert all(s.cache_bytes == s.predicted_cache_bytes for s in steps)
    # the cache map still covers every position processed, evicted ones marked as such
    for step in steps:
        assert sum(n for _, n in step.layers[0].spans) == step.position


def test_refused_up_front_with_reason(default_model):
    settings = decode.GenerationSettings(max_new_tokens=30, stop_at_eos=False)
    decoder = decode.Decoder(default_model, strategies.choose("sliding", {"window": "8"}), settings, PROMPT)
    steps = iter(decoder)
    next(steps)
    with pytest.raises(OptionError, match="'sliding' has already evicted tokens, and a static cache cannot"):
        decoder.request_switch(strategies.choose("static"))
    with pytest.raises(OptionError, match="attention sinks are the first tokens"):
        decoder.request_switch(strategies.choose("sink"))
    next(steps)  # the run goes on, unswitched
    assert decoder.trace.switches == []
