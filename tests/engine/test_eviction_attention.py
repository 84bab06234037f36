"""The attention that eviction policies and the attention view read: against eager attention, and what each
policy keeps from it."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import eager_attention_forward

from kvviz.engine import decode, models, strategies
from kvviz.engine.attention_scores import attention_received, one_forward
from kvviz.files import trace as trace_format
from kvviz.files.trace import ATTENTION_SINK_POSITIONS, SlotState

HEADS, KV_HEADS, DIM = 6, 2, 16
SCALE = DIM**-0.5


def eager_weights(query, key, additive_mask=None):
    """transformers' eager attention probabilities ``[batch, heads, queries, keys]``."""
    module = SimpleNamespace(num_key_value_groups=query.shape[1] // key.shape[1], training=False)
    return eager_attention_forward(module, query, key, key, additive_mask, scaling=SCALE)[1]


def causal_additive(new, n_keys):
    visible = torch.arange(n_keys)[None, :] <= torch.arange(new)[:, None] + (n_keys - new)
    return torch.zeros(new, n_keys).masked_fill(~visible, float("-inf"))[None, None]


def grouped(weights):
    """[batch, heads, queries, keys] summed over queries -> [batch, kv_heads, group, keys]."""
    b, h, _, k = weights.shape
    return weights.sum(dim=2).view(b, KV_HEADS, h // KV_HEADS, k)


@pytest.mark.parametrize("new,past", [(1, 40), (7, 40), (300, 0)], ids=["decode", "chunk", "long-prefill"])
def test_attention_received_equals_eager(new, past):
    torch.manual_seed(0)
    query = torch.randn(1, HEADS, new, DIM)
    key = torch.randn(1, KV_HEADS, past + new, DIM)
    causal = causal_additive(new, past + new)
    expected = grouped(eager_weights(query, key, causal))
    # with transformers' boolean mask, and without one where transformers leaves it out (one query, or no past)
    torch.testing.assert_close(attention_received(query, key, causal == 0, SCALE, last=new), expected)
    if new == 1 or past == 0:
        torch.testing.assert_close(attention_received(query, key, None, SCALE, last=new), expected)
    # only the newest query
    newest = grouped(eager_weights(query, key, causal)[:, :, -1:])
    torch.testing.assert_close(attention_received(query, key, causal == 0, SCALE, last=1), newest)


def test_consumers_asking_the_same_attention_share_one_computation_within_a_forward():
    torch.manual_seed(0)
    query, key = torch.randn(1, HEADS, 5, DIM), torch.randn(1, KV_HEADS, 20, DIM)
    mask = causal_additive(5, 20) == 0
    with one_forward():
        first = attention_received(query, key, mask, SCALE, last=5)
        assert attention_received(query, key, mask, SCALE, last=5) is first  # a second H2O cache of the prefill
        newest = attention_received(query, key, mask, SCALE, last=1)  # another question: computed
        torch.testing.assert_close(newest, grouped(eager_weights(query, key, causal_additive(5, 20))[:, :, -1:]))
        assert attention_received(query.clone(), key, mask, SCALE, last=1) is not newest  # other tensors
    with one_forward():
        assert attention_received(query, key, mask, SCALE, last=5) is not first  # a forward's results end with it


def feed(layer, n, query_heads=HEADS, seed=0):
    """One forward's worth for a layer: update with n new tokens, then hand it attention like the model does."""
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, KV_HEADS, n, DIM, generator=generator)
    full_keys, _ = layer.update(keys, torch.randn(1, KV_HEADS, n, DIM, generator=generator))
    query = torch.randn(1, query_heads, n, DIM, generator=generator)
    n_keys = full_keys.shape[-2]
    mask = causal_additive(n, n_keys) == 0 if 1 < n < n_keys else None  # as transformers builds it for SDPA
    layer.attended(layer.index, query, full_keys, mask, SCALE)
    return query, full_keys


def policy_layer(name, **options):
    """Decoder layer 0's cache layer of policy `name` with `options`, built without a model."""
    return strategies.get(name).make_layer(0, strategies.choose(name, options).options)


def kept(layer):
    return [sorted(row.tolist()) for row in layer.positions[0]]


def test_tova_keeps_what_the_newest_query_attends_to_most_in_every_head():
    layer = policy_layer("tova", budget=10)
    feed(layer, 8)
    query, keys = feed(layer, 5, seed=1)
    newest = eager_weights(query, keys, causal_additive(5, 13))[0, :, -1].mean(dim=0)  # over all query heads
    expected = sorted(newest.topk(10).indices.tolist())
    assert kept(layer) == [expected, expected]
    assert layer.keys.shape == (1, KV_HEADS, 10, DIM)
    # a decoding step: the one token the newest query attends to least goes
    query, keys = feed(layer, 1, seed=2)
    newest = eager_weights(query, keys)[0, :, -1].mean(dim=0)
    candidates = expected + [13]
    expected = sorted(p for i, p in enumerate(candidates) if i != int(newest.argmin()))
    assert kept(layer) == [expected, expected]


@pytest.mark.parametrize("recent", [4, 0], ids=["recent-and-heavy", "heavy-only"])
def test_h2o_keeps_recent_and_heaviest_by_accumulated_attention_per_head(recent):
    layer = policy_layer("h2o", budget=10, recent=recent)
    group = HEADS // KV_HEADS
    positions = [[] for _ in range(KV_HEADS)]
    sums = [torch.zeros(0) for _ in range(KV_HEADS)]
    seen = 0
    for step, n in enumerate([8, 1, 1, 1, 1]):
        query, keys = feed(layer, n, seed=step)
        received = eager_weights(query, keys, causal_additive(n, keys.shape[-2]))[0].sum(dim=1)  # [heads, keys]
        for head in range(KV_HEADS):
            positions[head] += list(range(seen, seen + n))
            sums[head] = torch.cat([sums[head], torch.zeros(n)]) + received[head * group : (head + 1) * group].sum(0)
            if len(positions[head]) > 10:
                older = len(positions[head]) - recent
                heavy = sorted(sums[head][:older].topk(10 - recent).indices.tolist())
                index = heavy + list(range(older, older + recent))
                positions[head] = [positions[head][i] for i in index]
                sums[head] = sums[head][index]
        seen += n
        assert kept(layer) == positions, step
        torch.testing.assert_close(layer.token_state["sums"][0], torch.stack(sums))
    if recent:
        assert positions[0] != positions[1]  # chosen per head
    else:  # no recent window: the newest token, attended by one query only, is the lightest and goes at once
        assert all(seen - 1 not in kept_by_head for kept_by_head in positions)


@pytest.mark.parametrize("pooling,pool", [("average", F.avg_pool1d), ("max", F.max_pool1d)])
def test_snapkv_keeps_window_and_pooled_top_of_the_prompt_then_appends(pooling, pool):
    layer = policy_layer("snapkv", budget=12, window=4, kernel=3, pooling=pooling)
    query, keys = feed(layer, 30)
    weights = eager_weights(query, keys, causal_additive(30, 30))[0, :, -4:, :26]  # window's queries on the rest
    per_kv_head = weights.sum(dim=1).view(KV_HEADS, HEADS // KV_HEADS, 26).mean(dim=1)
    pooled = pool(per_kv_head[None], kernel_size=3, stride=1, padding=1)[0]
    expected = [sorted(row.topk(8).indices.tolist()) + [26, 27, 28, 29] for row in pooled]
    assert kept(layer) == expected
    feed(layer, 1, seed=1)
    assert kept(layer) == [row + [30] for row in expected]  # decoding appends


def test_knorm_keeps_the_lowest_norm_keys_per_head():
    layer = policy_layer("knorm", budget=6)
    keys = torch.randn(1, KV_HEADS, 15, DIM)
    layer.update(keys, torch.randn(1, KV_HEADS, 15, DIM))
    expected = [sorted((-keys[0, head].norm(dim=-1)).topk(6).indices.tolist()) for head in range(KV_HEADS)]
    assert kept(layer) == expected
    torch.testing.assert_close(layer.keys[0, 0], keys[0, 0, expected[0]])
    # a decoding step: the highest norm of the seven goes
    new_key = torch.randn(1, KV_HEADS, 1, DIM)
    layer.update(new_key, torch.randn(1, KV_HEADS, 1, DIM))
    keys = torch.cat([keys, new_key], dim=2)
    for head in range(KV_HEADS):
        candidates = expected[head] + [15]
        norms = keys[0, head, candidates].norm(dim=-1)
        expected[head] = [p for i, p in enumerate(candidates) if i != int(norms.argmax())]
    assert kept(layer) == expected


@pytest.fixture(scope="module")
def eager_model():
    loaded = models.load_model("default")
    loaded.model.set_attn_implementation("eager")
    return loaded


def watched_run(loaded, name, options=None, new_tokens=8, watch=True):
    settings = decode.GenerationSettings(max_new_tokens=new_tokens, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(loaded, strategies.choose(name, options or {}), settings,
                             "The quick brown fox jumps over the lazy dog because it was bored.")
    decoder.watch_attention(watch)
    return list(decoder), decoder


def test_attention_view_matches_eager_attention(default_model, eager_model):
    steps, decoder = watched_run(default_model, "dynamic")
    ids = decoder.prompt_ids + [s.token_id for s in steps]
    cache = DynamicCache(config=eager_model.model.config)
    worst = 0.0
    with torch.inference_mode():
        for step in steps:
            fed = ids[: decoder.prompt_tokens] if step.index == 0 else [ids[step.position - 1]]
            out = eager_model.model(input_ids=torch.tensor([fed]), cache=cache, use_cache=True, output_attentions=True)
            expected = np.stack([a[0, :, -1].mean(dim=0).numpy() for a in out.attentions])
            assert step.attention.shape == expected.shape == (default_model.card["num_layers"], step.position)
            worst = max(worst, float(np.abs(step.attention - expected).max()))
            sinks = expected[:, :ATTENTION_SINK_POSITIONS].sum(axis=1)
            np.testing.assert_allclose(step.attention_sink, sinks, atol=1e-4)
    assert worst < 1e-4


def test_attention_view_off_costs_nothing_and_changes_nothing(default_model):
    watched, _ = watched_run(default_model, "dynamic")
    plain, _ = watched_run(default_model, "dynamic", watch=False)
    assert [s.token_id for s in watched] == [s.token_id for s in plain]
    assert all(s.attention is None and s.attention_sink is None and s.scoring_ms is None for s in plain)


@pytest.mark.parametrize(
    "name,options",
    [("h2o", {"budget": 12, "recent": 4}), ("knorm", {"budget": 12}), ("sink", {"window": 8}), ("static", {})],
)
def test_attention_view_follows_what_caches_hold(default_model, name, options):
    steps, _ = watched_run(default_model, name, options)
    np.testing.assert_allclose(steps[0].attention.sum(axis=1), 1.0, rtol=1e-5)
    for before, step in zip(steps, steps[1:], strict=False):
        np.testing.assert_allclose(step.attention.sum(axis=1), 1.0, rtol=1e-5)
        # attention only on what the cache held before this step, and on the new token itself
        held = np.zeros(step.position, dtype=bool)
        held[-1] = True
        for layer_index, layer in enumerate(before.layers):
            start = 0
            held_here = held.copy()
            for state, count in layer.spans:
                if state != SlotState.EVICTED:
                    held_here[start : start + count] = True
                start += count
            assert not step.attention[layer_index][~held_here].any()


def test_records_keep_scoring_time_and_shares_not_the_attention_rows(default_model, tmp_path):
    steps, decoder = watched_run(default_model, "h2o", {"budget": 12, "recent": 4}, new_tokens=3)
    loaded = trace_format.load(decoder.trace.save(tmp_path / "h2o.json"))
    assert [s.scoring_ms for s in loaded.steps] == [s.scoring_ms for s in steps]
    assert all(math.isfinite(s.scoring_ms) for s in loaded.steps)
    assert loaded.steps[-1].layers[3].head_spans == steps[-1].layers[3].head_spans is not None
    assert loaded.steps[-1].attention_sink == steps[-1].attention_sink is not None
    assert all(s.attention is None for s in loaded.steps)
    assert '"attention":' not in (tmp_path / "h2o.json").read_text()
