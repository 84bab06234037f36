"""Pinned spans of a run's prompt on the tiny model: per layer and KV head, whether the cache still holds their
tokens, right after an eviction and after live switches, as the cache itself holds them; kept in the trace."""

import pytest
import torch

from kvviz.engine import decode
from kvviz.engine.strategies import choose
from kvviz.errors import OptionError
from kvviz.files import trace as trace_file
from kvviz.files.trace import Pin, heads_holding

PROMPT = " ".join(f"w{i}" for i in range(40))  # 110 tokens on the tiny model's tokenizer
EARLY, LATE = Pin(4, 10, "early"), Pin(100, 106, "late")


def run(tiny_model, choice, steps=8, switches=None, pins=(EARLY, LATE)):
    settings = decode.GenerationSettings(max_new_tokens=steps, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(tiny_model, choice, settings, PROMPT, pins=list(pins))
    records = []
    for step in decoder:
        records.append((step, [list(held_by_head(decoder.run, pin)) for pin in pins]))
        if switches and step.index + 1 in switches:
            decoder.request_switch(switches[step.index + 1])
    return decoder, records


def held_by_head(run, pin):
    """What the cache holds of the pin, per layer and KV head, read from its layers directly."""
    for layer in run.cache.layers:
        positions = getattr(layer, "positions", None)
        if positions is not None:  # an evicting layer: its own positions, per KV head
            yield [int(torch.isin(row, torch.arange(pin.start, pin.end)).sum()) for row in positions[0]]


def test_an_eviction_shows_the_span_gone_per_head(tiny_model):
    decoder, records = run(tiny_model, choose("h2o", {"budget": 24}))
    heads = tiny_model.model.config.num_key_value_heads
    for step, direct in records:
        assert step.pins_held == direct  # what each head holds, as its layer holds it
    last = records[-1][0]
    assert len(last.pins_held[0]) == tiny_model.model.config.num_hidden_layers
    assert all(len(layer) == heads for layer in last.pins_held[0])
    holding = [heads_holding(counts, pin.size) for counts, pin in zip(last.pins_held, (EARLY, LATE), strict=True)]
    assert any(h.held < h.layer_heads for h in holding)  # the budget of 24 cannot hold both spans everywhere


def test_a_window_keeps_the_late_span_and_drops_the_early_one(tiny_model):
    decoder, records = run(tiny_model, choose("sliding", {"window": 33}))
    layers = tiny_model.model.config.num_hidden_layers
    heads = tiny_model.model.config.num_key_value_heads
    early, late = records[0][0].pins_held
    assert early == [[0] * heads] * layers and late == [[LATE.size] * heads] * layers
    summary = decoder.trace.summary()["pins"]
    assert summary[1] == {"start": 100, "end": 106, "label": "late", "held": layers * heads, "layers": layers,
                          "heads": heads}
    assert trace_file.Holding(0, layers, heads).text() == f"held in 0 of {layers} x {heads} layer-heads"


def test_live_switches_keep_the_span_where_the_cache_keeps_it(tiny_model):
    switches = {2: choose("h2o", {"budget": 20}), 5: choose("dynamic")}
    decoder, records = run(tiny_model, choose("dynamic"), switches=switches)
    full = [[[pin.size] * tiny_model.model.config.num_key_value_heads] * tiny_model.model.config.num_hidden_layers
            for pin in (EARLY, LATE)]
    assert records[0][0].pins_held == records[1][0].pins_held == full  # the dynamic cache holds everything
    for step, direct in records[2:5]:  # h2o from step 2: what each head kept
        assert step.pins_held == direct
    after = records[4][0].pins_held
    for step, _ in records[5:]:  # back to dynamic: what h2o kept stays, at the positions it kept it
        assert step.pins_held == after
    assert after != full


def test_the_pins_are_kept_in_the_trace_and_checked(tiny_model, tmp_path):
    decoder, records = run(tiny_model, choose("sink", {"sink_tokens": 4, "window": 20}), steps=3)
    path = decoder.trace.save(tmp_path / "pinned.json")
    kept = trace_file.load(path)
    assert kept.pins == [EARLY, LATE]
    assert [s.pins_held for s in kept.steps] == [s.pins_held for s in decoder.trace.steps]
    damaged = kept.to_dict()
    damaged["pins"][1]["end"] = 500
    with pytest.raises(trace_file.TraceError, match=r"pins\[1\]: expected a span"):
        trace_file.from_dict(damaged)
    with pytest.raises(OptionError, match="not within the prompt"):
        decode.Decoder(tiny_model, choose("dynamic"), decode.GenerationSettings(raw=True), PROMPT,
                       pins=[Pin(100, 120)])


def test_a_span_is_pinned_by_its_text(tiny_model):
    decoder = decode.Decoder(tiny_model, choose("dynamic"), decode.GenerationSettings(raw=True), PROMPT)
    pin = decoder.pin_text("w12 w13")
    assert "".join(decoder.trace.prompt_pieces[pin.start : pin.end]).strip() == "w12 w13"
    with pytest.raises(OptionError, match="does not occur in the prompt"):
        decoder.pin_text("w99")


def test_a_task_item_runs_with_its_needle_pinned(tiny_model):
    from kvviz.engine import tasks
    from kvviz.engine.qa_prompt import Rendering

    rendering = Rendering(tiny_model.tokenizer, raw=False)
    (item,) = tasks.generate(["niah_single_1"], 1, 400, seed=1, turns=1, tokens=rendering.tokens)
    ids, pins = rendering.prompt(item)
    assert len(pins) == 1 and pins[0].label.startswith("One of the special magic numbers")
    settings = decode.GenerationSettings(max_new_tokens=2, raw=True)
    decoder = decode.Decoder(tiny_model, choose("sliding", {"window": 64}), settings, "", prompt_ids=ids, pins=pins)
    (first, _) = list(decoder)
    kept = sum(1 for p in range(pins[0].start, pins[0].end) if p >= len(ids) - 63)  # the window keeps the last 63
    assert first.pins_held[0] == [[kept] * tiny_model.model.config.num_key_value_heads] * 4
    assert decoder.trace.pins == pins
