"""A quantized cache dequantized once per quantization inside `memoized()`: the same logits bit for bit, the same
measured bytes, and transformers' own dequantization everywhere else."""

import threading

import pytest
import torch
from transformers.cache_utils import QuantizedLayer

from kvviz.engine.cache_run import CacheRun
from kvviz.engine.dequantize_memo import memoized
from kvviz.engine.strategies import parse_spec

SPECS = ["quantized:backend=hqq:nbits=2:residual_length=8", "quantized:backend=quanto:nbits=4:residual_length=8"]


@pytest.mark.parametrize("spec", SPECS)
def test_memoized_reading_is_bit_for_bit_transformers_own(tiny_model, spec):
    ids = torch.randint(0, 1000, (1, 40), generator=torch.Generator().manual_seed(3))
    plain, memo = (CacheRun(tiny_model.model, parse_spec(spec), 64) for _ in range(2))
    with torch.inference_mode():
        plain.forward(ids[:, :12])
        with memoized():
            memo.forward(ids[:, :12])
        for position in range(12, 40):  # past three re-quantizations
            theirs = plain.forward(ids[:, position : position + 1])
            with memoized():
                ours = memo.forward(ids[:, position : position + 1])
            assert torch.equal(ours, theirs), position
            assert [r.total_bytes for r in memo.measure()] == [r.total_bytes for r in plain.measure()]


def test_a_dequantization_is_kept_until_the_layer_quantizes_again(tiny_model):
    run = CacheRun(tiny_model.model, parse_spec(SPECS[0]), 64)
    with torch.inference_mode():
        run.forward(torch.arange(12)[None])
    layer = run.cache.layers[0]
    assert isinstance(layer, QuantizedLayer)
    with memoized():
        first = layer._dequantize(layer._quantized_keys)
        assert layer._dequantize(layer._quantized_keys) is first
        seen = []
        other = threading.Thread(target=lambda: seen.append(layer._dequantize(layer._quantized_keys)))
        other.start()
        other.join()
        assert seen[0] is not first and torch.equal(seen[0], first)  # another thread: transformers' own
        layer._quantized_keys = layer._quantize(first.contiguous(), axis=layer.axis_key)  # quantized again
        assert layer._dequantize(layer._quantized_keys) is not first
    assert layer._dequantize(layer._quantized_keys) is not layer._dequantize(layer._quantized_keys)  # outside
