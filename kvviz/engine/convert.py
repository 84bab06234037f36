"""Live strategy switching: turn the cache of one strategy into the cache of another.

Besides `measure.py`, this is the only code that reads cache internals: it takes out what each
layer holds in full precision (dequantizing a quantized layer) and feeds it, layer by layer,
through the new cache's own `update()`. Evicted tokens stay gone.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import BaseQuantizedLayer, DynamicSlidingWindowLayer, StaticLayer

from kvviz.engine.layers import SinkLayer
from kvviz.engine.predict import layer_windows
from kvviz.engine.strategies import Strategy, StrategyChoice, get

# Strategies whose cache holds every token seen so far, at its absolute position.
COMPLETE = {"dynamic", "static", "quantized", "offloaded", "offloaded-static"}
PREALLOCATING = {"static", "offloaded-static"}


def refusal(current: str, target: StrategyChoice, model, evicted: bool) -> str | None:
    """Why the live cache of `current` cannot become `target` now, or None if it can.

    `evicted` says whether the current cache has dropped any token already.
    """
    strategy: Strategy = get(target.name)
    ok, reason = strategy.available()
    if not ok:
        return f"{target.name!r} is not available here: {reason}"
    problem = strategy.unsupported(model, target.options)
    if problem:
        return f"{target.name!r} {problem}"
    if current == "none":
        return "a run without a cache has nothing to convert; start a new run with a cache instead"
    if target.name == "none":
        return "switching to no cache would recompute every step from scratch; start a new run with 'none'"
    hybrid = any(w is not None for w in layer_windows(model.config))
    if hybrid and (current in PREALLOCATING or target.name in PREALLOCATING):
        return (
            "on models with sliding-window layers, static caches index slots by absolute position "
            "and cannot be refilled live"
        )
    if target.name in PREALLOCATING and evicted:
        return f"{current!r} has already evicted tokens, and a static cache cannot hold the gaps they leave"
    if target.name == "sink" and current not in COMPLETE and evicted:
        return f"the attention sinks are the first tokens, and {current!r} has already evicted them"
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
        if isinstance(target, SinkLayer):
            target.evicted += seen - moved
    return moved
