"""The only code that reads cache internals. Returns plain records (ints), never tensors.

Bytes are the real allocation: each tensor's `untyped_storage().nbytes()`, with storages shared
between tensors (views) counted once. optimum-quanto's packed tensors report their dense size
there, so tensor subclasses are walked through `__tensor_flatten__()` down to plain tensors (the
packed payload, its scale and its shift). HQQ stores ``(W_q, meta)``: `W_q` plus the tensors in
`meta` (scale, zero). fp8 stores ``(payload, scale)``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil
import torch
from transformers.cache_utils import (
    BaseQuantizedLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    StaticLayer,
    StaticSlidingWindowLayer,
)

from kvviz.engine.layers import KvvizLayer
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
            key = (str(tensor.device), storage.data_ptr())
            if key not in self.seen:
                self.seen.add(key)
                total += storage.nbytes()
        return total


def _spans(*runs: tuple[SlotState, int]) -> list[list[int]]:
    return [[int(state), int(count)] for state, count in runs if count > 0]


def measure_layer(layer, counter: StorageCounter, slots: bool = True) -> LayerRecord:
    """Bytes, tokens and slot states of one cache layer (slots False: an evicting layer's slot states are left
    empty; reading which positions it holds costs milliseconds once its choices are scattered)."""
    if isinstance(layer, BaseQuantizedLayer):
        return _measure_quantized(layer, counter)
    keys = counter.bytes_of(layer.keys)
    values = counter.bytes_of(layer.values)
    storage = {"full": keys + values}
    if not layer.is_initialized:
        return LayerRecord(0, 0, 0, 0, storage={"full": 0}, spans=[])
    if isinstance(layer, StaticSlidingWindowLayer):
        seen = layer.cumulative_length_int
        held = min(seen, layer.max_cache_len)
        spans = _spans(
            (SlotState.EVICTED, seen - held),
            (SlotState.FULL, held),
            (SlotState.PREALLOCATED, layer.max_cache_len - held),
        )
        return LayerRecord(keys, values, held, layer.max_cache_len, storage=storage, spans=spans)
    if isinstance(layer, StaticLayer):
        seen = int(layer.cumulative_length)
        spans = _spans((SlotState.FULL, seen), (SlotState.PREALLOCATED, layer.max_cache_len - seen))
        return LayerRecord(keys, values, seen, layer.max_cache_len, storage=storage, spans=spans)
    held = layer.keys.shape[-2] if layer.keys.dim() == 4 else 0
    if isinstance(layer, KvvizLayer):
        if not slots:
            return LayerRecord(keys, values, held, held, storage=storage, spans=[])
        return LayerRecord(keys, values, held, held, storage=storage, spans=_spans(*layer.slot_spans()),
                           head_spans=layer.head_spans())
    if isinstance(layer, DynamicSlidingWindowLayer):
        seen = layer.cumulative_length
        spans = _spans((SlotState.EVICTED, seen - held), (SlotState.FULL, held))
        return LayerRecord(keys, values, held, held, storage=storage, spans=spans)
    if isinstance(layer, DynamicLayer):
        return LayerRecord(keys, values, held, held, storage=storage, spans=_spans((SlotState.FULL, held)))
    raise TypeError(f"kvviz cannot measure cache layers of type {type(layer).__name__}")


def _measure_quantized(layer: BaseQuantizedLayer, counter: StorageCounter) -> LayerRecord:
    q_keys = counter.bytes_of(layer._quantized_keys)
    q_values = counter.bytes_of(layer._quantized_values)
    r_keys = counter.bytes_of(layer.keys)
    r_values = counter.bytes_of(layer.values)
    seen = layer.cumulative_length
    residual = layer.keys.shape[-2] if layer.keys is not None and layer.keys.dim() == 4 else 0
    spans = _spans((SlotState.QUANTIZED, seen - residual), (SlotState.RESIDUAL, residual))
    return LayerRecord(
        keys_bytes=q_keys + r_keys,
        values_bytes=q_values + r_values,
        seq_len=seen,
        capacity=seen,
        storage={"quantized": q_keys + q_values, "residual": r_keys + r_values},
        spans=spans,
    )


def measure_cache(cache, seen: int, slots: bool = True) -> list[LayerRecord]:
    """One record per layer; an empty list when there is no cache (strategy `none`). `slots`: as for
    `measure_layer`.

    `seen` is the number of tokens processed so far: positions a layer does not account for
    were dropped before it got them (by an evicting strategy before a live switch).
    """
    if cache is None:
        return []
    counter = StorageCounter()
    records = [measure_layer(layer, counter, slots) for layer in cache.layers]
    for record in records:
        covered = sum(n for state, n in record.spans if state != SlotState.PREALLOCATED)
        if record.spans and covered < seen:
            record.spans.insert(0, [int(SlotState.EVICTED), seen - covered])
    return records


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


def scoring_ms(cache) -> float | None:
    """Milliseconds the cache's layers spent choosing what to keep since last asked; None if none of them chooses."""
    spent = [layer.take_scoring_ms() for layer in getattr(cache, "layers", ()) if isinstance(layer, KvvizLayer)]
    spent = [ms for ms in spent if ms is not None]
    return sum(spent) if spent else None


def rss_bytes() -> int:
    return _PROCESS.memory_info().rss


def cuda_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(device)
