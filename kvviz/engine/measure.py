"""The only code that reads cache internals. Returns plain records (ints), never tensors.

Every kind of transformers cache layer is read as what it holds: keys and values; a linear-attention or
state-space layer's convolution and recurrent states (fixed size, `state_bytes`); a hybrid layer's both; an
indexed-attention layer's indexer keys beside its keys and values (`indexer_bytes`); a KV-shared layer's nothing
(a `DummyLayer`: it reads another layer's keys and values).

Bytes are the real allocation: each tensor's `untyped_storage().nbytes()`, with storages shared
between tensors (views) counted once. optimum-quanto's packed tensors report their dense size
there, so tensor subclasses are walked through `__tensor_flatten__()` down to plain tensors (the
packed payload, its scale and its shift). HQQ stores ``(W_q, meta)``: `W_q` plus the tensors in
`meta` (scale, zero). fp8 stores ``(payload, scale)``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable

import psutil
import torch
from transformers.cache_utils import (
    BaseQuantizedLayer,
    DummyLayer,
    DynamicLayer,
    EncoderDecoderCache,
    LinearAttentionCacheLayerMixin,
    StaticLayer,
    StaticSlidingWindowLayer,
)

from kvviz.engine import held_positions
from kvviz.engine.held_positions import Carried
from kvviz.engine.layers import KvvizLayer
from kvviz.engine.own_caches import StateBesideLayers, layers_of
from kvviz.files.trace import LayerRecord, SlotState

_PROCESS = psutil.Process(os.getpid())


def plain_tensors(obj) -> Iterable[torch.Tensor]:
    """The plain tensors that hold the data of `obj` (a tensor, tensor subclass, tuple or dict)."""
    if obj is None:
        return
    if isinstance(obj, torch.Tensor):
        if type(obj) is not torch.Tensor and hasattr(obj, "__tensor_flatten__"):
            names, _ = obj.__tensor_flatten__()
            for name in names:
                yield from plain_tensors(getattr(obj, name))
        else:
            yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from plain_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from plain_tensors(item)


class StorageCounter:
    """Adds up storage bytes, counting each storage once across everything it is shown."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()

    def bytes_of(self, obj) -> int:
        total = 0
        for tensor in plain_tensors(obj):
            storage = tensor.untyped_storage()
            if storage.nbytes() == 0:
                continue
            key = (tensor.device, storage.data_ptr())
            if key not in self.seen:
                self.seen.add(key)
                total += storage.nbytes()
        return total


# What measuring reads from a layer, by its class: several of the classes are abstract (ABC), whose isinstance checks
# are slow, and every layer is measured at every step; a class's kind is worked out once.
SHARED, STATE, QUANTIZED, STATIC_SLIDING, STATIC, KVVIZ, DYNAMIC, UNKNOWN = range(8)


@functools.cache
def _kind(layer_class: type) -> int:
    if issubclass(layer_class, DummyLayer):  # a KV-shared layer (or one without attention): nothing of its own
        return SHARED
    if issubclass(layer_class, StateBesideLayers) or (issubclass(layer_class, LinearAttentionCacheLayerMixin)
                                                      and not issubclass(layer_class, (DynamicLayer, StaticLayer))):
        return STATE  # a linear-attention or state-space layer without attention of its own (not a hybrid one)
    for kind, base in ((QUANTIZED, BaseQuantizedLayer), (STATIC_SLIDING, StaticSlidingWindowLayer),
                       (STATIC, StaticLayer), (KVVIZ, KvvizLayer), (DYNAMIC, DynamicLayer)):
        if issubclass(layer_class, base):
            return kind
    return UNKNOWN


def held_tokens(layer) -> int:
    """Tokens a cache layer holds (in each KV head; a quantized layer's quantized and residual ones together)."""
    kind = _kind(type(layer))
    if kind in (SHARED, STATE) or not layer.is_initialized:
        return 0
    if kind == QUANTIZED:
        return layer.cumulative_length
    if kind == STATIC_SLIDING:
        return min(layer.cumulative_length_int, layer.max_cache_len)
    if kind == STATIC:
        return int(layer.cumulative_length)
    if kind == KVVIZ:
        return layer.tokens_held()
    if kind == DYNAMIC:
        return layer.keys.shape[-2] if layer.keys is not None and layer.keys.dim() == 4 else 0
    raise TypeError(f"kvviz cannot measure cache layers of type {type(layer).__name__}")


def measure_layer(layer, counter: StorageCounter, seen: int, carried: Carried | None = None,
                  slots: bool = True) -> LayerRecord:
    """Bytes, tokens and slot states of one cache layer once `seen` tokens were processed. `carried`: what a live
    switch put into a transformers layer (None: the run filled it from the first token). `slots` False leaves the
    slot states out (reading which positions an evicting layer holds costs milliseconds once its choices are
    scattered)."""
    held = held_tokens(layer)
    kind = _kind(type(layer))
    if kind == SHARED:  # a KV-shared layer (or one without attention): nothing of its own
        return LayerRecord(0, 0, 0, 0, spans=[[int(SlotState.SHARED), seen]] if slots and seen else [])
    if kind == STATE:  # no keys, no values: a convolution and a recurrent state of fixed size
        states = _state_tensors(layer)
        state = counter.bytes_of(states)
        spans = [[int(SlotState.STATE), seen]] if slots and seen else []
        return LayerRecord(0, 0, 0, 0, storage={"state": state} if state else {}, spans=spans, state_bytes=state,
                           state_shapes=[list(t.shape) for t in states] or None)
    if kind == QUANTIZED:
        q_keys, q_values = counter.bytes_of(layer._quantized_keys), counter.bytes_of(layer._quantized_values)
        r_keys, r_values = counter.bytes_of(layer.keys), counter.bytes_of(layer.values)
        residual = layer.keys.shape[-2] if layer.keys is not None and layer.keys.dim() == 4 else 0
        record = LayerRecord(q_keys + r_keys, q_values + r_values, held, held,
                             storage={"quantized": q_keys + q_values, "residual": r_keys + r_values})
        states = [(SlotState.QUANTIZED, held - residual), (SlotState.RESIDUAL, residual)]
    else:
        keys, values = counter.bytes_of(layer.keys), counter.bytes_of(layer.values)
        capacity = layer.max_cache_len if kind in (STATIC, STATIC_SLIDING) and layer.is_initialized else held
        record = LayerRecord(keys, values, held, capacity, storage={"full": keys + values})
        record.indexer_bytes = counter.bytes_of(getattr(layer, "indexer_keys", None))
        states = _state_tensors(layer)
        record.state_bytes = counter.bytes_of(states)
        record.state_shapes = [list(t.shape) for t in states] or None
        extra = {"indexer": record.indexer_bytes, "state": record.state_bytes}
        record.storage.update({kind: count for kind, count in extra.items() if count})
        states = [(SlotState.FULL, held)]
    if slots and layer.is_initialized:
        record.spans, record.head_spans = _layer_spans(layer, held, states, seen, carried)
        if record.capacity > held:
            record.spans.append([int(SlotState.PREALLOCATED), record.capacity - held])
    return record


def _state_tensors(layer) -> list[torch.Tensor]:
    """The convolution and recurrent states a linear-attention or state-space layer holds (none for other layers)."""
    if isinstance(layer, StateBesideLayers):
        return layer.tensors
    if not _linear_attention(type(layer)):
        return []
    held = [*layer.conv_states.values(), *layer.recurrent_states.values()]
    return [tensor for tensor in held if isinstance(tensor, torch.Tensor)]


def _layer_spans(layer, held: int, states, seen: int, carried: Carried | None):
    """The cache map of one layer over positions 0 .. seen-1 (`held_positions.spans`)."""
    own = _kind(type(layer)) == KVVIZ
    if own or carried is not None:
        slots = layer.held_slots() if own else states
        return held_positions.spans(layer_positions(layer, held, seen, carried), slots, seen)
    # filled by the run from the first token: the newest `held` tokens seen
    runs = [(SlotState.EVICTED, seen - held), *states]
    return [[int(state), int(count)] for state, count in runs if count > 0], None


def layer_positions(layer, held: int, seen: int, carried: Carried | None) -> torch.Tensor:
    """The positions (0 .. seen-1) of the tokens a layer holding `held` of them keeps, ``[kv_heads or 1, held]`` in
    key order (one row when every KV head holds the same)."""
    if _kind(type(layer)) == KVVIZ:
        return layer.held_positions()
    if carried is not None:  # what the switch moved in, then what was fed since: the newest `held` of them
        fed = held_positions.fed_positions(carried, seen)
        return fed[:, fed.shape[-1] - held :]
    return torch.arange(seen - held, seen)[None]  # filled by the run from the first token: the newest `held`


def positions_held(cache, seen: int, positions: list[int], kv_heads: int,
                   carried: list[Carried | None] | None = None) -> list[list[int] | None]:
    """Per layer, per KV head (`kv_heads` of them): how many of `positions` (tokens 0 .. seen-1) the cache still
    holds once `seen` tokens were processed; None for a layer that holds no tokens (a state or KV-shared layer).
    `carried` as in `measure_cache`."""
    layers = cache_layers(cache) if cache is not None else []
    carried = carried or [None] * len(layers)
    wanted = torch.tensor(sorted(set(positions)), dtype=torch.long)
    counts: list[list[int] | None] = []
    for layer, moved in zip(layers, carried, strict=True):
        if not _keeps_tokens(layer):
            counts.append(None)
            continue
        held = layer_positions(layer, held_tokens(layer), seen, moved).cpu()
        found = torch.isin(held, wanted).sum(dim=-1)  # [kv_heads or 1]
        counts.append(found.expand(kv_heads).tolist() if found.shape[0] == 1 else found.tolist())
    return counts


def measure_cache(cache, seen: int, slots: bool = True,
                  carried: list[Carried | None] | None = None) -> list[LayerRecord]:
    """One record per layer once `seen` tokens were processed; an empty list when there is no cache (strategy
    `none`). `carried`: per layer, what a live switch put into it (see `measure_layer`); `slots` as there."""
    if cache is None:
        return []
    counter = StorageCounter()
    layers = cache_layers(cache)
    carried = carried or [None] * len(layers)
    records = [measure_layer(layer, counter, seen, c, slots) for layer, c in zip(layers, carried, strict=True)]
    if isinstance(cache, EncoderDecoderCache):
        for record, cross in zip(records, cache.cross_attention_cache.layers, strict=True):
            record.cross_tokens = held_tokens(cross)
            record.cross_bytes = counter.bytes_of([cross.keys, cross.values]) if record.cross_tokens else 0
            if record.cross_bytes:
                record.storage["cross"] = record.cross_bytes
    return records


def cache_layers(cache) -> list:
    """The layers of a cache that hold what the decoder's own tokens add: an encoder-decoder's self-attention
    layers (its cross-attention layers are measured beside them), every layer of any other cache."""
    return cache.self_attention_cache.layers if isinstance(cache, EncoderDecoderCache) else layers_of(cache)


def tokens_dropped(cache, seen: int, windows: tuple[int | None, ...]) -> int:
    """The most tokens any layer has dropped of those the model's own cache would hold once `seen` tokens were
    processed: all of them in a full-attention layer, the last window - 1 in a layer with a native sliding window
    (what transformers' DynamicCache keeps). 0: nothing was evicted."""
    if cache is None:
        return 0
    return max((min(seen, seen if window is None else window - 1) - held_tokens(layer)
                for layer, window in zip(cache_layers(cache), windows, strict=True) if _keeps_tokens(layer)), default=0)


@functools.cache
def _linear_attention(layer_class: type) -> bool:
    """Whether layers of this class hold a linear-attention or state-space layer's states (hybrids too)."""
    return issubclass(layer_class, LinearAttentionCacheLayerMixin)


def _keeps_tokens(layer) -> bool:
    """Whether the layer holds keys and values of the tokens it has seen (state and KV-shared layers hold none)."""
    return _kind(type(layer)) not in (SHARED, STATE) and layer.is_initialized


def policy_bytes(cache) -> int:
    """Bytes the cache's policies keep beside keys and values (`KvvizLayer.policy_tensors`): 0 for caches without
    a policy of their own."""
    counter = StorageCounter()
    return sum(counter.bytes_of(layer.policy_tensors()) for layer in getattr(cache, "layers", ())
               if _kind(type(layer)) == KVVIZ)


def weight_read_bytes(model) -> int:
    """Bytes of weights a decode step reads: every parameter once, except an input embedding table that is
    not also the output head (a step reads one row of it)."""
    counter = StorageCounter()
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight.untyped_storage().data_ptr() == embedding.untyped_storage().data_ptr()
    total = 0
    for parameter in model.parameters():
        if parameter is embedding and not tied:
            total += embedding.shape[-1] * embedding.element_size()
            counter.bytes_of(parameter)
            continue
        total += counter.bytes_of(parameter)
    return total


def model_bytes(model) -> int:
    """Bytes the model itself holds (every parameter and buffer, each storage once): what a process serving it holds
    before any request."""
    counter = StorageCounter()
    return sum(counter.bytes_of(tensor) for tensor in (*model.parameters(), *model.buffers()))


def scoring_ms(cache) -> float | None:
    """Milliseconds the cache's layers spent choosing what to keep since last asked; None if none of them chooses."""
    spent = [layer.take_scoring_ms() for layer in getattr(cache, "layers", ()) if _kind(type(layer)) == KVVIZ]
    spent = [ms for ms in spent if ms is not None]
    return sum(spent) if spent else None


def rss_bytes() -> int:
    return _PROCESS.memory_info().rss


def cuda_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(device)
