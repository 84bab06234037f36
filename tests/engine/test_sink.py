"""The sink layer evicts the middle and re-rotates kept keys to their new positions."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb, rotate_half

from kvviz.engine.layers import SinkLayer, rotate_keys


def rope():
    config = LlamaConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    return LlamaRotaryEmbedding(config)


def rotated(rotary, raw, positions):
    cos, sin = rotary(raw, torch.tensor([positions]))
    k, _ = apply_rotary_pos_emb(raw, raw, cos, sin)
    return k


def test_rotate_keys_moves_positions():
    rotary = rope()
    raw = torch.randn(1, 1, 5, 32)
    at_20 = rotated(rotary, raw, list(range(20, 25)))
    at_7 = rotated(rotary, raw, list(range(7, 12)))
    torch.testing.assert_close(rotate_keys(at_20, -13, rotary.inv_freq), at_7, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [32, 16])
def test_rotate_keys_gives_the_bits_of_the_rotate_half_formula(dtype, rotary_dim):
    # the sink cache's perplexities stay those of transformers' former SinkCache only if every step's rotation rounds
    # as `x * cos + rotate_half(x) * sin` in float32 does; rotate_keys computes it without building rotate_half
    inv_freq = rope().inv_freq[: rotary_dim // 2]
    keys = (torch.randn(1, 3, 40, 32) * 4).to(dtype)
    for shift in (-1, -5, 9):
        angle = shift * inv_freq.float()
        cos, sin = torch.cat((angle.cos(), angle.cos())), torch.cat((angle.sin(), angle.sin()))
        part = keys[..., :rotary_dim].float()
        expected = torch.cat([(part * cos + rotate_half(part) * sin).to(dtype), keys[..., rotary_dim:]], dim=-1)
        assert torch.equal(rotate_keys(keys, shift, inv_freq), expected)
        into = torch.empty_like(keys)
        assert rotate_keys(keys, shift, inv_freq, out=into) is into and torch.equal(into, expected)


def test_sink_layer_keeps_first_and_recent_with_contiguous_positions():
    rotary = rope()
    raw = torch.randn(1, 1, 30, 32)
    values = torch.randn(1, 1, 30, 32)
    layer = SinkLayer(sink_tokens=3, window=5, inv_freq=rotary.inv_freq)
    for pos in range(30):
        held = layer.get_seq_length()
        layer.update(rotated(rotary, raw[:, :, pos : pos + 1], [held]), values[:, :, pos : pos + 1])
    assert layer.get_seq_length() == 8 and layer.evicted == 22
    kept = [0, 1, 2, 25, 26, 27, 28, 29]
    torch.testing.assert_close(layer.values, values[:, :, kept])
    # the kept keys are what the model would have produced at cache positions 0..7
    expected = torch.cat([rotated(rotary, raw[:, :, i : i + 1], [p]) for p, i in enumerate(kept)], dim=-2)
    torch.testing.assert_close(layer.keys, expected, atol=1e-4, rtol=1e-4)
