"""Models that keep their cache in a class of their own rather than in transformers' DynamicCache.

MiniMax (the original, linear-attention one) caches keys and values of its softmax-attention layers in the layers of
its `MiniMaxCache` (a DynamicCache) and the state of its lightning-attention layers, ``[batch, heads, head_dim,
head_dim]`` in the model's dtype, in a list beside them (`linear_cache`); its forward refuses any other cache, so
generate builds that one. kvviz builds it too and reads each linear layer's state as a layer of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

OWN_CACHE_TYPES = ("minimax",)  # model types whose forward accepts only their own cache class


def keeps_own_cache(config) -> bool:
    return getattr(config, "model_type", None) in OWN_CACHE_TYPES


def dynamic_cache(config):
    """The cache generate would build for a model of `config`: its own class, or transformers' DynamicCache."""
    if keeps_own_cache(config):
        from transformers.models.minimax.modeling_minimax import MiniMaxCache

        return MiniMaxCache()
    from transformers import DynamicCache

    return DynamicCache(config=config)


@dataclass
class StateBesideLayers:
    """The state of a linear-attention layer that a cache class of a model's own keeps beside its layers."""

    tensors: list[torch.Tensor]


def layers_of(cache) -> list:
    """Per decoder layer, what `cache` holds for it: its cache layer, or the state kept beside the layers."""
    linear = getattr(cache, "linear_cache", None)
    if linear is None:
        return cache.layers
    layers = []
    for index in range(len(cache)):
        state = linear[index] if index < len(linear) else None
        if isinstance(state, torch.Tensor):
            layers.append(StateBesideLayers([state]))
        else:
            layers.append(cache.layers[index])
    return layers
