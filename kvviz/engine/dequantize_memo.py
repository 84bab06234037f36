"""A quantized cache dequantized once per quantization, not once per step, while a sweep or the questions read.

transformers' quantized layers (KIVI's residual scheme, `QuantizedLayer`) dequantize their whole quantized part at
every update, though it changes only when the residual is quantized again, every `residual_length` tokens. Inside
`memoized()` each layer's dequantization is kept until its quantized tensors change: the same computation on the same
tensors, so the result is bit for bit what dequantizing again gives. Only the readings that measure quality use it
(`kvviz.engine.sweep`, `kvviz.engine.answering`); everything timed as a user's decode, and every other thread, runs
transformers' own code unchanged. What is kept lives in the context, never in the cache: the cache's measured bytes
do not change, and it goes when the reading ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from transformers.cache_utils import QuantizedLayer

_local = threading.local()  # .memo: {id(layer): {id(quantized): (quantized, dequantized)}} inside `memoized()`
_installed: set[type] = set()


def _kinds(base: type) -> Iterator[type]:
    for kind in base.__subclasses__():
        yield kind
        yield from _kinds(kind)


def _memoizing(original):
    def dequantize(layer, quantized):
        memo = getattr(_local, "memo", None)
        if memo is None:
            return original(layer, quantized)
        mine = memo.setdefault(id(layer), {})
        held = mine.get(id(quantized))
        if held is not None and held[0] is quantized:
            return held[1]
        current = (layer._quantized_keys, layer._quantized_values)
        for key in [k for k, (q, _) in mine.items() if not any(q is c for c in current)]:
            del mine[key]  # quantized again: the old dequantization is stale
        mine[id(quantized)] = (quantized, original(layer, quantized))  # `quantized` kept: its id is not reused
        return mine[id(quantized)][1]

    return dequantize


def _install() -> None:
    """Route every quantized layer kind's `_dequantize` through the memo (a no-op outside `memoized()`)."""
    for kind in _kinds(QuantizedLayer):
        if "_dequantize" in vars(kind) and kind not in _installed:
            kind._dequantize = _memoizing(vars(kind)["_dequantize"])
            _installed.add(kind)


@contextmanager
def memoized() -> Iterator[None]:
    """On this thread, inside: each quantized layer's dequantization kept until its quantized tensors change."""
    _install()
    previous = getattr(_local, "memo", None)
    _local.memo = {} if previous is None else previous
    try:
        yield
    finally:
        _local.memo = previous
