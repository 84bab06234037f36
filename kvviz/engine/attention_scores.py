"""Attention probabilities on demand, without switching the model to eager attention.

kvviz registers one attention function with transformers (`AttentionInterface`, name `kvviz_sdpa`): it runs
transformers' own SDPA attention unchanged and, only when someone asked for this layer's attention in this
forward, also hands the layer's post-RoPE queries and cached keys to that consumer, which recomputes the
softmax of just the queries it needs (`attention_received`). Nobody asking costs one dictionary look-up per
layer.

Two kinds of consumers ask:
- a cache layer that evicts by attention: its `update()` calls `expect(layer_index, keys, layer)`; the keys
  it returned are checked by identity, so a stale request never reaches another cache's forward;
- the attention view: `watching(view)` around a forward hands every layer's attention to `view` first.

Requests live in thread-local storage: a forward runs on one thread, and runs on other threads (another
decoder, a reference) never see them. A request stands for one forward: `one_forward()` around it drops what
was left unanswered, so that no request keeps a cache's keys alive after the forward that made it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from kvviz.errors import OptionError

NAME = "kvviz_sdpa"
QUERY_CHUNK = 256  # queries scored at once: bounds the [heads, queries, keys] block of a long prefill

_local = threading.local()


class AttentionConsumer(Protocol):
    def attended(self, layer_index: int, query: torch.Tensor, key: torch.Tensor, mask, scaling: float) -> None:
        """`query` ``[batch, heads, new, head_dim]`` (after RoPE), `key` ``[batch, kv_heads, keys, head_dim]`` as
        attention saw them, `mask` None (causal) or the boolean/additive mask ``[batch, 1, new, keys]``."""


def _requests() -> dict[int, dict[int, tuple[torch.Tensor, AttentionConsumer]]]:
    """Per layer index, per consumer (by id): the keys it asked about. Several caches fed in one forward
    (`cache_rows`) each ask for their own row."""
    pending = getattr(_local, "pending", None)
    if pending is None:
        pending = _local.pending = {}
    return pending


def expect(layer_index: int, keys: torch.Tensor, consumer: AttentionConsumer) -> None:
    """Ask for the attention that layer `layer_index` pays to `keys` (the tensor its cache just returned); a
    consumer's newer request replaces its older one."""
    _requests().setdefault(layer_index, {})[id(consumer)] = (keys, consumer)


def answered_with(layer_index: int, returned: list[torch.Tensor], used: torch.Tensor) -> None:
    """Requests made for layer `layer_index` with any of `returned` are answered by the attention on `used` instead:
    caches fed the same tokens in one forward each return their own tensor of the same keys, and attention runs on
    one of them (`shared_prefill`)."""
    requests = _requests().get(layer_index)
    if not requests:
        return
    mine = {id(tensor) for tensor in returned}
    for asker, (keys, consumer) in list(requests.items()):
        if id(keys) in mine:
            requests[asker] = (used, consumer)


@contextmanager
def one_forward() -> Iterator[None]:
    """Around one forward: the requests made inside and still unanswered at its end are dropped, and the last
    attention computed (`attention_received`) with them."""
    try:
        yield
    finally:
        pending = getattr(_local, "pending", None)
        if pending:
            pending.clear()
        _local.received = None


@contextmanager
def watching(view: AttentionConsumer | None) -> Iterator[None]:
    """Hand every layer's attention in the forwards inside to `view` (None: nothing to do)."""
    previous = getattr(_local, "view", None)
    _local.view = view
    try:
        yield
    finally:
        _local.view = previous


def sdpa_with_scores(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' SDPA attention, then the attention handed to whoever asked for this layer's. A cache layer whose
    KV heads hold different numbers of tokens (a `key_mask`: AdaKV's) has its padding masked out first."""
    view = getattr(_local, "view", None)
    pending = getattr(_local, "pending", None)
    requests = pending.get(module.layer_idx) if pending else None
    key_mask = next((getattr(consumer, "key_mask", None) for keys, consumer in (requests or {}).values()
                     if keys is key), None)
    attention_mask = fitted(attention_mask, key.shape[-2])
    if key_mask is not None:
        attention_mask = with_key_mask(attention_mask, key_mask, query)
    output = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                    **kwargs)
    if view is None and not requests:
        return output
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if view is not None:  # first: a layer that evicts replaces what it holds when it is handed its attention
        view.attended(module.layer_idx, query, key, attention_mask, scale)
    for asker, (keys, consumer) in list((requests or {}).items()):
        if keys is key:
            del requests[asker]
            consumer.attended(module.layer_idx, query, key, attention_mask, scale)
    return output


def fitted(mask, n_keys: int):
    """The forward's attention mask fitted to a layer's `n_keys` keys. transformers builds one mask per forward, as
    wide as the cache's first full-attention layer; a layer holding another number of tokens (knorm's whole first
    layers, PyramidKV's budgets per layer, AdaKV's longest head) has it cut or widened at the front: every key a
    layer holds is older than every new token, so each new token sees all of them."""
    if mask is None or mask.shape[-1] == n_keys:
        return mask
    extra = mask.shape[-1] - n_keys
    if extra > 0:
        return mask[..., extra:]
    visible = mask.new_full((*mask.shape[:-1], -extra), True if mask.dtype == torch.bool else 0)
    return torch.cat([visible, mask], dim=-1)


def with_key_mask(mask, key_mask: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Transformers' attention mask (None: causal from the first key, or no mask for one query) combined with
    which keys each KV head holds ``[batch, kv_heads, keys]``: a boolean mask ``[batch, heads, queries, keys]``."""
    batch, heads, new = query.shape[:3]
    kv_heads, n_keys = key_mask.shape[1:]
    if mask is None:  # the newest query sees every key, each earlier one a key fewer
        mask = torch.ones((new, n_keys), dtype=torch.bool, device=query.device).tril(diagonal=n_keys - new)[None, None]
    elif mask.dtype != torch.bool:
        mask = mask == 0
    return mask[..., :n_keys] & key_mask.repeat_interleave(heads // kv_heads, dim=1)[:, :, None, :]


AttentionInterface.register(NAME, sdpa_with_scores)
AttentionMaskInterface.register(NAME, sdpa_mask)


def unsupported(model) -> str | None:
    """Why kvviz cannot read this model's attention, or None."""
    implementation = model.config._attn_implementation
    if implementation in ("sdpa", NAME):
        return None
    return (
        f"needs SDPA attention to score tokens; this model runs {implementation!r} attention "
        "(load it with attn_implementation='sdpa')"
    )


def install(model) -> None:
    """Route the model's attention through `sdpa_with_scores` (checked with `unsupported` first); raises
    OptionError if transformers cannot switch this model's attention. The same SDPA call runs, so outputs do
    not change; runs that ask nothing pay nothing more."""
    if model.config._attn_implementation != NAME:
        model.set_attn_implementation(NAME)
    if model.config._attn_implementation != NAME:  # transformers declined: the model's attention is its own code
        raise OptionError(
            f"cannot read the attention of {type(model).__name__}: its attention does not go through "
            "transformers' AttentionInterface"
        )


def attention_received(query: torch.Tensor, key: torch.Tensor, mask, scaling: float, last: int) -> torch.Tensor:
    """`_received` (below), computed once for the consumers of one layer's attention that ask the same: two H2O caches
    fed one shared prefill each sum every query's attention. The last result is kept, with the very tensors it was
    computed from (held, so that no other tensor can take their identity), until another is asked or the forward
    ends (`one_forward`); consumers read it and never write into it."""
    kept = getattr(_local, "received", None)
    if kept is not None and kept[0] is query and kept[1] is key and kept[2] is mask and kept[3] == (scaling, last):
        return kept[4]
    total = _received(query, key, mask, scaling, last)
    _local.received = (query, key, mask, (scaling, last), total)
    return total


def _received(query: torch.Tensor, key: torch.Tensor, mask, scaling: float, last: int) -> torch.Tensor:
    """Attention probabilities of the `last` newest queries on each key, summed over those queries.

    `query` ``[batch, heads, new, head_dim]``, `key` ``[batch, kv_heads, keys, head_dim]``. Without a mask,
    what SDPA did: a single query sees every key, and several see causally from the first key (transformers
    leaves the mask out only then: no past, or a static cache's unwritten slots after the prompt). Returns
    ``[batch, kv_heads, group, keys]`` in float32, query heads grouped by the KV head they share (the order of
    transformers' `repeat_kv`). Computed as eager attention does (products in the model's dtype, softmax in
    float32), in chunks of queries, without repeating keys for the groups.
    """
    batch, heads, new, head_dim = query.shape
    kv_heads, n_keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    keys_t = key.transpose(-1, -2)  # [batch, kv_heads, head_dim, keys]
    if new == 1 and mask is None:  # a decoding step: the one query sees every key
        newest = query[:, :, -1].reshape(batch, kv_heads, group, head_dim)
        return (torch.matmul(newest, keys_t) * scaling).softmax(dim=-1, dtype=torch.float32)
    total = torch.zeros((batch, kv_heads, group, n_keys), dtype=torch.float32, device=query.device)
    for start in range(new - last, new, QUERY_CHUNK):
        stop = min(start + QUERY_CHUNK, new)
        queries = stop - start
        block = query[:, :, start:stop].reshape(batch, kv_heads, group * queries, head_dim)
        logits = (torch.matmul(block, keys_t) * scaling).view(batch, kv_heads, group, queries, n_keys)
        if mask is None:
            if new > 1:  # SDPA's is_causal: query i sees keys 0 .. i
                hidden = torch.arange(n_keys, device=query.device)[None, :] > torch.arange(start, stop)[:, None]
                logits = logits.masked_fill(hidden, float("-inf"))
        else:  # [batch, 1 or heads, new, keys]: one mask for every head, or one per head (`with_key_mask`)
            part = mask[..., start:stop, :n_keys]
            part = part[:, :, None] if part.shape[1] == 1 else part.view(batch, kv_heads, group, queries, n_keys)
            logits = logits.masked_fill(~part, float("-inf")) if part.dtype == torch.bool else logits + part
        total += logits.softmax(dim=-1, dtype=torch.float32).sum(dim=-2)
    return total
