"""Live strategy switching: turn the cache of one strategy into the cache of another.

Besides `measure.py`, this is the only code that reads cache internals: it takes out what each
layer holds in full precision (dequantizing a quantized layer), with the position of each key's token,
and feeds it, layer by layer, through the new cache's own `update()` (kvviz's own layers `receive()` it
with its positions). Evicted tokens stay gone, and the positions of what is kept travel with it. A linear-attention or
state-space layer's fixed-size state goes over as it is (every strategy leaves those layers to transformers).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import (
    BaseQuantizedLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionCacheLayerMixin,
    StaticLayer,
)

from kvviz.engine import held_positions
from kvviz.engine.geometry import Geometry
from kvviz.engine.held_positions import Carried, fed_positions
from kvviz.engine.layers import KvvizLayer
from kvviz.engine.measure import held_tokens
from kvviz.engine.own_caches import keeps_state_in_modules
from kvviz.engine.strategies import StrategyChoice, get


def refusal(running: StrategyChoice, target: StrategyChoice, model, evicted: bool | None) -> str | None:
    """Why the live cache of strategy `running` cannot become `target` now, or None if it can.

    `evicted` says whether the current cache has dropped any token already, as measured (`CacheRun.evicted`);
    None before a run, when it is not known yet: what depends on it is then left to the switch itself.
    """
    current, source, strategy = running.name, get(running.name), get(target.name)
    ok, reason = strategy.available()
    if not ok:
        return f"{target.name!r} is not available here: {reason}"
    problem = strategy.unsupported(model, target.options)
    if problem:
        return f"{target.name!r} {problem}"
    if not source.has_cache:
        return "a run without a cache has nothing to convert; start a new run with a cache instead"
    if evicted:
        problem = source.switch_from_problem(running.options)
        if problem:
            return problem
    if not strategy.has_cache:
        return f"switching to no cache would recompute every step from scratch; start a new run with {target.name!r}"
    problem = strategy.switch_to_problem(target.options)
    if problem:
        return problem
    if keeps_state_in_modules(model.config):
        return (f"a switch moves what the cache's layers hold, and this model ({type(model).__name__}) keeps the "
                "states of its recurrent layers in its own modules; start a new run")
    geometry = Geometry.of(model.config, model.dtype)
    if any(kind not in ("attention", "sliding", "state") for kind in geometry.kinds):
        unusual = geometry.unusual_layers(("state",), latent=True)
        return f"a switch moves keys and values layer by layer, and this model has {unusual}; start a new run"
    if geometry.hybrid and (source.preallocates or strategy.preallocates):
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
        held = held_tokens(layer)
        return layer.keys[:, :, :held], layer.values[:, :, :held]
    if isinstance(layer, KvvizLayer):
        return layer.held_states()
    return layer.keys, layer.values


def positions_of(layer, carried_in: Carried | None, seen: int, held: int) -> torch.Tensor:
    """Positions of the `held` keys `held_states` returns, ``[kv_heads or 1, held]`` (`kvviz.engine.held_positions`)."""
    if isinstance(layer, KvvizLayer):
        return layer.held_positions()
    fed = fed_positions(carried_in, seen)
    return fed[:, fed.shape[-1] - held :]


def convert(cache, new_cache, carried: list[Carried | None], position: int, seen: int) -> tuple[list[int], list]:
    """Fill `new_cache` with what `cache` holds, each key with the position of its token; returns, per layer, the
    tokens moved and what the new layer carries (`held_positions.Carried`, None for kvviz's layers,
    which keep their positions, and where the moved keys are every token seen).

    `carried` says the same of the old cache. `position` is the next position id the model will number a token
    with (fewer than `seen`, the tokens processed so far, after attention sinks re-rotated the cache). Sliding-window
    layers derive their mask offsets from the tokens they have seen, so theirs is set to `position`.
    """
    moved, carries = [], []
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, LinearAttentionCacheLayerMixin):  # a state layer: every strategy keeps it as it is
            new_cache.layers[index] = layer
            moved.append(0)
            carries.append(None)
            continue
        keys, values = held_states(layer)
        moved.append(keys.shape[-2])
        positions = positions_of(layer, carried[index], seen, keys.shape[-2])
        target = new_cache.layers[index]
        if isinstance(target, KvvizLayer):
            target.receive(keys.contiguous(), values.contiguous(), positions, seen)
            carries.append(None)
            continue
        target.update(keys.contiguous(), values.contiguous())
        if isinstance(target, DynamicSlidingWindowLayer):
            target.cumulative_length = position
        carries.append(held_positions.carried(positions, seen))
    return moved, carries
