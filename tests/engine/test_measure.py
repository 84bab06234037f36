"""Measured bytes are the real allocation and match the size predicted from the config."""

import pytest
import torch

from kvviz.engine import decode, measure, strategies
from kvviz.files.trace import SlotState

from .families import CONFIGS, tiny_family

LONG_PROMPT = " ".join(["The cache grows by one token at every step of decoding."] * 6)


def run(loaded, name, options=None, new_tokens=24, prompt=LONG_PROMPT):
    settings = decode.GenerationSettings(max_new_tokens=new_tokens, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(loaded, strategies.choose(name, options or {}), settings, prompt)
    return list(decoder), decoder


def span_total(spans, state=None):
    return sum(n for s, n in spans if state is None or s == state)


@pytest.mark.parametrize("name", ["dynamic", "static"])
def test_measured_equals_predicted_every_step(default_model, name):
    steps, decoder = run(default_model, name)
    per_token = default_model.card["kv_bytes_per_token"]
    for step in steps:
        assert step.cache_bytes == step.predicted_cache_bytes
    if name == "dynamic":
        # after step i the cache holds the prompt and the i tokens fed since
        assert steps[-1].cache_bytes == (decoder.prompt_tokens + len(steps) - 1) * per_token
    else:
        assert steps[0].cache_bytes == decoder.capacity * per_token == steps[-1].cache_bytes


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_measured_equals_predicted_on_families(tiny_model, family):
    loaded = tiny_family(family, tiny_model.tokenizer)
    for name in ("dynamic", "static", "sliding"):
        steps, _ = run(loaded, name, {"window": 8} if name == "sliding" else None, new_tokens=20)
        assert [s.cache_bytes for s in steps] == [s.predicted_cache_bytes for s in steps], (family, name)


@pytest.mark.parametrize(
    "options",
    [{"backend": "hqq", "nbits": 4}, {"backend": "hqq", "nbits": 2}, {"backend": "fp8"}, {"backend": "quanto"}],
    ids=["hqq4", "hqq2", "fp8", "quanto4"],
)
def test_quantized_storage_split(default_model, options):
    residual = {} if options["backend"] == "fp8" else {"residual_length": 16}
    steps, _ = run(default_model, "quantized", {**options, **residual}, new_tokens=24)
    last = steps[-1]
    assert last.cache_bytes == last.predicted_cache_bytes
    full = last.predicted_cache_bytes  # sanity: quantized is far below full precision
    dense = (steps[0].layers[0].seq_len + len(steps) - 1) * default_model.card["kv_bytes_per_token"]
    assert full < dense / 2
    layer = last.layers[0]
    assert layer.storage["quantized"] > 0
    assert layer.storage["quantized"] + layer.storage["residual"] == layer.total_bytes
    quantized = span_total(layer.spans, SlotState.QUANTIZED)
    assert quantized + span_total(layer.spans, SlotState.RESIDUAL) == layer.seq_len


def test_sliding_window_keeps_only_the_window(default_model):
    steps, decoder = run(default_model, "sliding", {"window": 32})
    last = steps[-1].layers[0]
    assert last.seq_len == 31  # the window includes the token being decoded
    assert span_total(last.spans, SlotState.EVICTED) == decoder.prompt_tokens + len(steps) - 1 - 31
    assert steps[-1].cache_bytes == steps[-1].predicted_cache_bytes


def test_sink_keeps_sinks_and_window(default_model):
    steps, decoder = run(default_model, "sink", {"sink_tokens": 4, "window": 20})
    layer = steps[-1].layers[0]
    assert layer.seq_len == 24
    assert span_total(layer.spans, SlotState.SINK) == 4
    assert span_total(layer.spans) == decoder.prompt_tokens + len(steps) - 1
    assert all(s.cache_bytes == s.predicted_cache_bytes for s in steps)


def test_layer_times_are_recorded(default_model):
    steps, _ = run(default_model, "dynamic", new_tokens=4)
    for step in steps:
        times = [layer.layer_ms for layer in step.layers]
        assert len(times) == default_model.card["num_layers"]
        assert all(t is not None and t > 0 for t in times)
        assert sum(times) < step.wall_ms


def test_shared_storage_counted_once():
    base = torch.zeros(4, 16)
    counter = measure.StorageCounter()
    assert counter.bytes_of([base[:2], base[2:], base]) == base.numel() * 4


def test_quanto_payload_walked_not_dense():
    from optimum.quanto import MaxOptimizer, qint4, quantize_weight

    tensor = torch.randn(1, 2, 64, 64)
    scale, shift = MaxOptimizer()(tensor, qint4, 0, 64)
    packed = quantize_weight(tensor, qint4, 0, scale, shift, 64)
    real = measure.StorageCounter().bytes_of(packed)
    elements = tensor.numel()
    assert real == elements // 2 + 2 * (elements // 64) * 4  # 4-bit payload + fp32 scale and shift per group
    assert real < packed.untyped_storage().nbytes()
