"""Attention sinks fed many tokens in one forward, each attending as it would if fed alone.

Fed one token at a time, a sink cache (`layers.SinkLayer`: its first `sink_tokens` tokens and its `window` most
recent, renumbered to consecutive positions) gives each new token the position after what it holds. The token sees
every recent key at its true distance, and sink j as if it stood (position - j) before it. Fed n tokens at once, the
layer returns what it holds and the new keys, numbered on from there: every distance to a recent or new key is still
the true one, and a mask keeps each token to the window it would have seen. But once the cache is full, the i-th new
token stands i positions further from the sinks than it would alone. RoPE scores depend on the difference of
positions alone, so the sinks' scores are computed with each query turned back by that many positions, in an
attention of kvviz's own (`sink_attention`): transformers' eager formula (scores, mask, float32 softmax), the sinks'
columns from the turned queries. The cache then evicts and re-rotates as after n single tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv

from kvviz.engine.forward import attention_implementation
from kvviz.engine.layers import SinkLayer, rotate_keys, rotation

NAME = "kvviz_sinks"

_local = threading.local()  # .turn: (sink_tokens, inv_freq, the queries' rotation) inside `fed_alone`


def sink_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Eager attention of the fed tokens on the keys the sink cache returned (its sinks first), the sinks scored by
    the queries turned back to where each would have stood fed alone."""
    sinks, inv_freq, turn = _local.turn
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    held = min(sinks, key.shape[2])
    turned = rotate_keys(query, 0, inv_freq, turn)
    scores[..., :held] = torch.matmul(turned, key[:, :, :held].transpose(2, 3)) * scaling
    scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, sink_attention)


@contextmanager
def fed_alone(run, n: int) -> Iterator[torch.Tensor]:
    """Around a forward that feeds `n` tokens to `run`'s sink cache: each attends as it would if fed alone. Gives
    the mask ``[1, 1, n, keys]`` of the keys each attends to among those the cache returns (its sinks, and the
    recent ones it would have held)."""
    layer = next(layer for layer in run.cache.layers if isinstance(layer, SinkLayer))
    sinks, kept = layer.sink_tokens, layer.sink_tokens + layer.window
    device = run.model.device
    held = min(run.seen, kept)  # what each layer holds: the first fed token's position
    fed = torch.arange(n, device=device)
    alone = torch.clamp(run.seen + fed, max=kept)  # each token's position had it been fed alone
    query = (held + fed)[:, None]
    keys = torch.arange(held + n, device=device)[None]
    recent = keys >= query - (alone[:, None] - sinks)  # the window each would have seen: alone - sinks keys back
    mask = (keys <= query) & ((keys < sinks) | recent)
    _local.turn = (sinks, layer.inv_freq, rotation(-(held + fed - alone), layer.inv_freq, device))
    try:
        with attention_implementation(run.model, NAME):
            yield mask[None, None]
    finally:
        _local.turn = None
