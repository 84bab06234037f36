"""kvpress's presses as kvviz strategies: when a layer compresses (the schedule), AdaKV's head budgets, ThinK's
thinner keys and KVzip's reading again, each measured against what it should hold. What each keeps is proved against
kvpress itself in tests/kvpress (make test-kvpress)."""

import pytest
import torch

from kvviz.engine import decode, strategies
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.geometry import Geometry
from kvviz.engine.scorers import Schedule, ScheduleState, chunk_kept
from kvviz.engine.strategies.eviction import kvpress_ratio
from kvviz.engine.strategies.pyramidkv import PyramidSchedule
from kvviz.errors import OptionError

PROMPT = "The cache grows by one token at every step of decoding. " * 2  # 24 tokens, raw


def run(loaded, spec, new_tokens=10, prompt=PROMPT):
    settings = decode.GenerationSettings(max_new_tokens=new_tokens, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(loaded, strategies.parse_spec(spec), settings, prompt)
    steps = list(decoder)
    assert all(s.cache_bytes == s.predicted_cache_bytes for s in steps), spec
    assert all(s.policy_bytes == s.predicted_policy_bytes for s in steps), spec
    return steps, decoder


def test_the_schedule_cuts_the_prompt_then_every_interval():
    schedule, state = Schedule(budget=8, interval=3, target=5), ScheduleState()
    assert schedule.compress_to(state, 0, held=20, new=20, seen=20) == 8  # the prompt
    assert [schedule.compress_to(state, 0, held=8 + k, new=1, seen=20 + k) for k in (1, 2, 3)] == [None, None, 5]
    fraction, state = Schedule(budget=8, interval=2, fraction=0.25), ScheduleState()
    assert fraction.compress_to(state, 0, held=6, new=6, seen=6) is None  # a prompt within the budget is kept
    assert fraction.compress_to(state, 0, held=7, new=1, seen=40) is None
    assert fraction.compress_to(state, 0, held=12, new=1, seen=41) == 10  # a quarter of all seen
    assert kvpress_ratio(256, 1024) == 0.75 and kvpress_ratio(256, 100) == 0.0
    # kvpress's count: the target's share of the 55 chunks (the partial one, 3 tokens, counted as one), floored
    assert chunk_kept(held=1083, target=256, chunk=20) == 243  # 13 chunks: the partial one and 12 whole ones
    assert chunk_kept(held=1083, target=128, chunk=20) == 103  # 6 chunks (filling the target would take 7)
    assert chunk_kept(held=1080, target=128, chunk=20) == 120  # 54 whole chunks, 6 kept


def test_decoding_compresses_every_interval_to_its_target(tiny_model):
    steps, decoder = run(tiny_model, "snapkv:budget=12:window=4:decode_interval=4:decode_target=10", new_tokens=10)
    held = [s.layers[0].seq_len for s in steps]
    assert held == [12, 13, 14, 15, 10, 11, 12, 13, 10, 11]  # the prompt cut to 12, then every 4th step to 10
    steps, decoder = run(tiny_model, "keydiff:budget=12:decode_interval=2:decode_fraction=0.5", new_tokens=6)
    seen = [decoder.prompt_tokens + s.index for s in steps]
    assert [s.layers[0].seq_len for s in steps] == [12, 13, seen[2] // 2, seen[2] // 2 + 1, seen[4] // 2,
                                                    seen[4] // 2 + 1]
    evicted = run(tiny_model, "tova:budget=12", new_tokens=4)[0]  # TOVA's own: every step over the budget
    assert [s.layers[0].seq_len for s in evicted] == [12, 12, 12, 12]


def test_adaptive_heads_keep_different_numbers_under_the_same_total(tiny_model):
    steps, decoder = run(tiny_model, "snapkv:budget=12:window=4:adaptive=true", new_tokens=3)
    kv_heads = tiny_model.card["num_kv_heads"]
    layers = decoder.run.cache.layers
    assert any(len(set(layer.lengths[0].tolist())) > 1 for layer in layers)  # the heads' budgets differ
    for layer, record in zip(layers, steps[-1].layers, strict=True):
        assert int(layer.lengths.sum()) == kv_heads * (12 + 2)  # the same total, and decoding appends in every head
        assert record.seq_len == 12 + 2
        assert sum(heads * n for heads, n in record.head_spans) == kv_heads * record.seq_len  # the cache map


def test_think_keys_lose_channels_and_nothing_else(tiny_model):
    steps, decoder = run(tiny_model, "think:key_channels=0.5", new_tokens=3)
    dynamic, _ = run(tiny_model, "dynamic", new_tokens=3)
    geometry = Geometry.of(tiny_model.model.config, tiny_model.model.dtype)
    pruned = geometry.num_layers * geometry.kv_heads * geometry.head_dim // 2 * geometry.element
    assert [d.cache_bytes - t.cache_bytes for d, t in zip(dynamic, steps, strict=True)] == [
        decoder.prompt_tokens * pruned] * 3  # the prompt's keys at half width, later keys whole
    assert all(layer.seq_len == decoder.prompt_tokens + 2 for layer in steps[-1].layers)  # every token kept
    nothing = CacheRun(tiny_model.model, strategies.parse_spec("think:key_channels=0"), 40)
    exact = CacheRun(tiny_model.model, strategies.parse_spec("dynamic"), 40)
    ids = torch.tensor([tiny_model.tokenizer(PROMPT)["input_ids"][:30]])
    with torch.inference_mode():
        for feed in (ids[:, :20], ids[:, 20:21], ids[:, 21:22]):
            torch.testing.assert_close(nothing.forward(feed), exact.forward(feed))


def test_kvzip_reads_the_prompt_again_and_keeps_one_budget_for_all_layers(tiny_model):
    steps, decoder = run(tiny_model, "kvzip:budget=12", new_tokens=3)
    kv_heads, layers = tiny_model.card["num_kv_heads"], decoder.run.cache.layers
    totals = [int(layer.lengths.sum()) for layer in layers]
    assert sum(totals) == len(layers) * kv_heads * 12 + 2 * len(layers) * kv_heads  # the total, then decoding
    assert len(set(totals)) > 1  # layers keep different numbers (layerwise=false, as kvpress)
    assert steps[0].scoring_ms > 0  # the reading again is scoring time
    assert all(0 in layer.held_positions()[head].tolist() for layer in layers for head in range(kv_heads))  # sinks
    run(tiny_model, "kvzip:budget=12:layerwise=true", new_tokens=2)


def test_kvzip_counts_its_reading_once_within_the_prefill(tiny_model, monkeypatch):
    """Each layer times its own observing while the prompt is read again, inside the reading's own time: counted
    both ways, the scoring came out longer than the prefill it is part of."""
    import time

    from kvviz.engine.strategies.kvzip import ReadingAgain

    observe = ReadingAgain.observe

    def slow_observe(self, *args):  # the observing outweighs everything else in the prefill
        time.sleep(0.02)
        observe(self, *args)

    monkeypatch.setattr(ReadingAgain, "observe", slow_observe)
    steps, _ = run(tiny_model, "kvzip:budget=12", new_tokens=1)
    assert 0 < steps[0].scoring_ms <= steps[0].wall_ms


def test_pyramid_budgets_fall_with_depth_and_keep_the_total():
    schedule = PyramidSchedule(budget=256, window=8, beta=20, layers=30)
    budgets = [schedule.prompt_budget(i, 2000) for i in range(30)]
    assert budgets == sorted(budgets, reverse=True) and budgets[0] > 256 > budgets[-1]
    assert abs(sum(budgets) - 30 * 256) <= 30  # rounding, per layer
    assert PyramidSchedule(budget=256, window=64, beta=20, layers=30).prompt_budget(0, 2000) == 256  # SnapKV's


@pytest.mark.parametrize("spec,message", [
    ("snapkv:adaptive=true:chunk=20", "options 'chunk' and 'adaptive' of strategy 'snapkv' cannot go together"),
    ("tova:budget=16:chunk=20", "option 'chunk' of strategy 'tova' (20) must be at most 'budget' (16)"),
    ("knorm:decode_interval=0:decode_target=64", "option 'decode_interval' of strategy 'knorm' is 0"),
    ("h2o:decode_interval=8:decode_target=64:decode_fraction=0.5", "both set the size after a compression"),
    ("snapkv:budget=64:decode_interval=4:decode_target=16:window=32", "must be smaller than 'decode_target' (16)"),
    ("lagkv:adaptive=true:decode_interval=4", "options 'adaptive' and 'decode_interval' of strategy 'lagkv'"),
    ("kvzip:budget=4:sink_tokens=4", "option 'sink_tokens' of strategy 'kvzip' (4) must be smaller than 'budget'"),
    ("think:key_channels=1", "option 'key_channels' of strategy 'think' must be at most 0.99"),
])
def test_options_that_cannot_work_are_refused_by_name(spec, message):
    with pytest.raises(OptionError) as refused:
        strategies.parse_spec(spec)
    assert message in str(refused.value)


def test_kvzip_needs_the_tokenizer_to_ask_for_the_repetition(tiny_model):
    with pytest.raises(OptionError, match="has the model read text of its own, and this run was given no tokenizer"):
        CacheRun(tiny_model.model, strategies.parse_spec("kvzip"), 64)
