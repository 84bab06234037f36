"""Many tokens in one forward through a cache that changes what it holds at every token (eviction by importance),
each token attending to exactly what it would attend to fed alone.

Fed one token per forward, a reading is bound by reading the model's weights once per token. Here the weights are
read once for a chunk of tokens: the projections, norms and MLPs run on all of them together, and each attention
layer steps through them one at a time. It feeds its cache layer one token's keys and values, as a forward of that
token alone would, and attends that token's query to what the cache returned (handing the attention to a cache that
evicts by it, `attention_scores`), before the next token's turn. A layer's cache sees the same updates, in the same
order, as fed token by token: only what the layer is given differs, by the float rounding of matrix products over
many rows.

A stepped forward runs the model with attention implementation `kvviz_steps` (registered here, with no mask
function: transformers then builds no mask), so it serves models whose every layer attends to all it holds (no
sliding-window layers) through SDPA (`cache_rows.unsupported`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface

from kvviz.engine import attention_scores, measure
from kvviz.engine.forward import attention_implementation

NAME = "kvviz_steps"

_local = threading.local()


class CacheSteps:
    """Stands in for a transformers cache in one stepped forward: a layer's update keeps the chunk's keys and values
    for `steps_attention`, which feeds them to `cache` one token at a time. `first_drop` is the index in the chunk of
    the first token after whose step some layer held fewer tokens than it had been fed (None: none did); `fed` is
    how many tokens the cache had been fed before the chunk."""

    def __init__(self, cache, fed: int, watch_drops: bool):
        self.cache = cache
        self.fed = fed
        self.watch_drops = watch_drops
        self.first_drop: int | None = None
        self.pending: dict[int, tuple] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.pending[layer_idx] = (key_states, value_states, args, kwargs)
        return key_states, value_states  # unused: `steps_attention` attends to what the cache returns at each step

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.cache.get_seq_length(layer_idx)

    def feed(self, layer_idx: int, token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the cache's layer `layer_idx` the chunk's token `token`; the keys and values it returns."""
        keys, values, args, kwargs = self.pending[layer_idx]
        return self.cache.update(keys[:, :, token : token + 1], values[:, :, token : token + 1], layer_idx, *args,
                                 **_one_token(kwargs, token))

    def attended(self, layer_idx: int, token: int) -> None:
        """Token `token`'s step of layer `layer_idx` is over (a layer that evicts by attention has evicted)."""
        if self.watch_drops and (self.first_drop is None or token < self.first_drop):
            layer = measure.cache_layers(self.cache)[layer_idx]
            if measure.held_tokens(layer) < self.fed + token + 1:
                self.first_drop = token


def _one_token(kwargs: dict, token: int) -> dict:
    """The keyword arguments a cache update of the whole chunk was given, as a forward of its token `token` alone
    gives them: the position ids of that token (the only per-token argument kvviz's layers read)."""
    inner = kwargs.get("kwargs")
    positions = inner.get("position_ids") if inner else None
    if positions is None:
        return kwargs
    return {**kwargs, "kwargs": {**inner, "position_ids": positions[:, token : token + 1]}}


def steps_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Each of the chunk's tokens in turn: fed to the cache, then its query attended to what the cache returned, as
    `attention_scores.sdpa_with_scores` does for one token fed alone (no mask: one query sees every key)."""
    steps: CacheSteps = _local.steps
    outputs = []
    for token in range(query.shape[2]):
        keys, values = steps.feed(module.layer_idx, token)
        outputs.append(attention_scores.sdpa_with_scores(module, query[:, :, token : token + 1], keys, values, None,
                                                         dropout=dropout, scaling=scaling, **kwargs)[0])
        steps.attended(module.layer_idx, token)
    del steps.pending[module.layer_idx]
    return torch.cat(outputs, dim=1), None  # SDPA's output is [batch, new, heads, head_dim]


AttentionInterface.register(NAME, steps_attention)


@contextmanager
def stepping(model, cache, fed: int, watch_drops: bool) -> Iterator[CacheSteps]:
    """Around one forward of `model`: gives the cache to pass it, which steps every attention layer through the
    fed tokens one at a time into `cache` (fed `fed` tokens before). `watch_drops`: find the first token after which
    the cache holds fewer than it was fed (`CacheSteps.first_drop`)."""
    steps = _local.steps = CacheSteps(cache, fed, watch_drops)
    try:
        with attention_implementation(model, NAME):
            yield steps
    finally:
        _local.steps = None
