"""Models that keep part of their cache outside transformers' DynamicCache layers.

MiniMax (the original, linear-attention one) caches keys and values of its softmax-attention layers in the layers of
its `MiniMaxCache` (a DynamicCache) and the state of its lightning-attention layers, ``[batch, heads, head_dim,
head_dim]`` in the model's dtype, in a list beside them (`linear_cache`); its forward refuses any other cache, so
generate builds that one. kvviz builds it too and reads each linear layer's state as a layer of its own.

RecurrentGemma caches keys and values of its (local, sliding-window) attention layers in the DynamicCache it is
given, and its recurrent blocks keep their states as attributes of their own modules: the convolution state
``conv1d_state`` ``[batch, lru_width, conv1d_width - 1]`` in the model's dtype (after a one-token step, a view into
the ``conv1d_width`` columns it convolved) and the RG-LRU's ``recurrent_states`` ``[batch, lru_width]`` in float32.
Those would carry from one run into the next (a one-token prompt convolves the last run's leftovers) and be shared by
a run and the reference beside it, so kvviz keeps them with the cache they belong to (`module_states`): handed to the
blocks for each forward through that cache and taken back after it. A new cache starts from none, as in a freshly
loaded model, and its states are measured beside its layers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

OWN_CACHE_TYPES = ("minimax",)  # model types whose forward accepts only their own cache class
MODULE_STATE_TYPES = ("recurrent_gemma",)  # model types whose recurrent blocks keep their states in the modules
MODULE_STATES = "kvviz_module_states"  # the cache's attribute: per layer index, the states its block keeps


def keeps_own_cache(config) -> bool:
    return getattr(config, "model_type", None) in OWN_CACHE_TYPES


def keeps_state_in_modules(config) -> bool:
    return getattr(config, "model_type", None) in MODULE_STATE_TYPES


def dynamic_cache(config):
    """The cache generate would build for a model of `config`: its own class, or transformers' DynamicCache."""
    if keeps_own_cache(config):
        from transformers.models.minimax.modeling_minimax import MiniMaxCache

        return MiniMaxCache()
    from transformers import DynamicCache

    return DynamicCache(config=config)


def strategy_refusal(model) -> str | None:
    """Why a strategy other than dynamic (and none) cannot run on `model`, or None: the model keeps its cache where
    only its own forward and `dynamic_cache` keep it."""
    name = type(model).__name__
    if keeps_own_cache(model.config):
        return (f"needs transformers' own cache layers, and this model ({name}) keeps its cache in a class of its own "
                "whose linear-attention states only its forward pass updates; run dynamic or none")
    if keeps_state_in_modules(model.config):
        return (f"needs transformers' own cache layers, and this model ({name}) keeps the states of its recurrent "
                "layers in its own modules, which kvviz keeps only with a DynamicCache; run dynamic or none")
    return None


def feed_refusal(model) -> str | None:
    """Why `model` cannot be fed more than one token at once into a cache that already holds some, or None."""
    if keeps_state_in_modules(model.config):
        return (f"this model ({type(model).__name__}) reads a feed of more than one token as a new prompt: its "
                "recurrent layers start their convolution afresh, so after the prompt it takes one token at a time")
    return None


def _recurrent_blocks(model) -> dict[int, torch.nn.Module]:
    """Per decoder layer index, the recurrent block that keeps its states in its own attributes."""
    layers = model.get_decoder().layers
    return {i: layer.temporal_block for i, layer in enumerate(layers) if hasattr(layer.temporal_block, "rg_lru")}


@contextlib.contextmanager
def module_states(model, cache):
    """Around one forward of `model` through `cache`: the recurrent blocks hold the states `cache` keeps (none for a
    new cache), and take nothing from this forward into the next one."""
    if cache is None or not keeps_state_in_modules(model.config):
        yield
        return
    states = cache.__dict__.setdefault(MODULE_STATES, {})
    blocks = _recurrent_blocks(model)
    for i, block in blocks.items():
        block.conv1d_state, block.rg_lru.recurrent_states = states.get(i, (None, None))
    try:
        yield
    finally:
        for i, block in blocks.items():
            if block.conv1d_state is not None:
                states[i] = (block.conv1d_state, block.rg_lru.recurrent_states)
            block.conv1d_state = block.rg_lru.recurrent_states = None


@dataclass
class StateBesideLayers:
    """The state of a linear-attention or recurrent layer kept beside a cache's layers (by a cache class of a
    model's own, or by the model's modules)."""

    tensors: list[torch.Tensor]


def _states_beside(cache) -> list[list[torch.Tensor]] | None:
    """Per decoder layer, the state tensors kept beside `cache`'s layers (empty: none), or None if nothing is."""
    linear = getattr(cache, "linear_cache", None)  # MiniMax (len(cache) counts these, which may pass cache.layers)
    if linear is not None:
        return [[linear[i]] if i < len(linear) and isinstance(linear[i], torch.Tensor) else []
                for i in range(len(cache))]
    held = getattr(cache, MODULE_STATES, None)  # RecurrentGemma
    if held is not None:
        return [[t for t in held.get(i, ()) if isinstance(t, torch.Tensor)] for i in range(len(cache))]
    return None


def layers_of(cache) -> list:
    """Per decoder layer, what `cache` holds for it: its cache layer, or the state kept beside the layers."""
    beside = _states_beside(cache)
    if beside is None:
        return cache.layers
    return [StateBesideLayers(state) if state else cache.layers[index] for index, state in enumerate(beside)]
