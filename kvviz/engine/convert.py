"""Live strategy switching: turn the cache of one strategy into the cache of another.

Besides `measure.py`, this is the only code that reads cache internals: it takes out what each
layer holds in full precision (dequantizing a quantized layer) and feeds it, layer by layer,
through the new cache's own `update()`. Evicted tokens stay gone.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import BaseQuantizedLayer, DynamicSlidingWindowLayer, StaticLayer

from kvviz.engine.geometry import Geometry
from kvviz.engine.layers import KvvizLayer
from kvviz.engine.strategies import StrategyChoice, get


def refusal(current: str, target: StrategyChoice, model, evicted: bool) -> str | None:
    """Why the live cache of strategy `current` cannot become `target` now, or None if it can.

    `evicted` says whether the current cache has dropped any token already.
    """
    source, strategy = get(current), get(target.name)
    ok, reason = strategy.available()
    if not ok:
        return f"{target.name!r} is not available here: {reason}"
    problem = strategy.unsupported(model, target.options)
    if problem:
        return f"{target.name!r} {problem}"
    if not source.has_cache:
        return "a run without a cache has nothing to convert; start a new run with a cache instead"
    if not strategy.has_cache:
        return f"switching to no cache would recompute every step from scratch; start a new run with {target.name!r}"
    if Geometry.of(model.config, model.dtype).hybrid and (source.preallocates or strategy.preallocates):
        return (
            "on models with sliding-window layers, static caches index slots by absolute position "
            "and cannot be refilled live"
        )
    if strategy.preallocates and evicted:
        return f"{current!r} has already evicted tokens, and a static cache cannot hold the gaps they leave"
    if strategy.keeps_first_tokens and evicted:
        return "the attention sinks are the first tokens, and this run's cache has already evicted them"
    return None


def held_states(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values a layer holds, ``[batch, kv_heads, held, head_dim]``, in full precision."""
    if isinstance(layer, BaseQuantizedLayer):
        parts_k = [layer._dequantize(layer._quantized_keys)]
        parts_v = [layer._dequantize(layer._quantized_values)]
        if layer.keys is not None and layer.keys.dim() == 4:
            parts_k.append(layer.keys)
            parts_v.append(layer.values)
        return torch.cat(parts_k, dim=-2), torch.cat(parts_v, dim=-2)
    if isinstance(layer, StaticLayer):
        seen = int(layer.get_seq_length())
        held = min(seen, layer.max_cache_len)
        return layer.keys[:, :, :held], layer.values[:, :, :held]
    return layer.keys, layer.values


def convert(cache, new_cache, position: int, seen: int) -> int:
    """Fill `new_cache` with what `cache` holds; returns the number of tokens moved per layer.

    `position` is the next position the model will number a token with (after attention sinks
    re-rotated the cache, fewer than `seen`, the tokens processed so far). Sliding-window layers
    derive their mask offsets from the tokens they have seen, so theirs is set to `position`.
    """
    moved = 0
    for index, layer in enumerate(cache.layers):
        keys, values = held_states(layer)
        moved = keys.shape[-2]
        target = new_cache.layers[index]
        target.update(keys.contiguous(), values.contiguous())
        if isinstance(target, DynamicSlidingWindowLayer):
            target.cumulative_length = position
        if isinstance(target, KvvizLayer):
            target.took_over(seen - moved)
    return moved
