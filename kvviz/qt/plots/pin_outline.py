"""The pinned spans on the cache map: each span outlined layer by layer, in the colour of what that layer's KV heads
still hold of it at the step drawn (`StepRecord.pins_held`: per span, per layer, per KV head, the span's tokens held).

A layer's box is "held" when every KV head holds every token of the span, "evicted" when no KV head holds any of
them, "partly held" otherwise (some heads, or some tokens). A layer that holds no tokens at all (a linear-attention
layer's state) gets no box.
"""

from __future__ import annotations

from enum import Enum

import numpy as np

from kvviz.files.trace import Pin


class Held(Enum):
    ALL = "held by every KV head"
    SOME = "partly held (some KV heads, or some tokens)"
    NONE = "evicted from every KV head"


def layer_states(counts: list[list[int] | None], size: int) -> list[Held | None]:
    """Per layer, how much of a span of `size` tokens its KV heads hold (None: a layer holding no tokens)."""
    states: list[Held | None] = []
    for heads in counts:
        if heads is None:
            states.append(None)
        elif heads and all(c >= size for c in heads):
            states.append(Held.ALL)
        elif not any(heads):
            states.append(Held.NONE)
        else:
            states.append(Held.SOME)
    return states


def outlines(pins: list[Pin], held: list[list[list[int] | None]], layers: int) -> dict[Held, np.ndarray]:
    """Per state, the (x, y) points of the boxes to draw (NaN rows between boxes): a span [start, end) of layer i is
    the box x in [start, end], y in [i - 0.5, i + 0.5], as the map's cells; `held`: the step's `pins_held`."""
    points: dict[Held, list[tuple[float, float]]] = {state: [] for state in Held}
    for pin, counts in zip(pins, held, strict=True):
        for layer, state in enumerate(layer_states(counts, pin.size)[:layers]):
            if state is None:
                continue
            top, bottom = layer - 0.5, layer + 0.5
            points[state] += [(pin.start, top), (pin.end, top), (pin.end, bottom), (pin.start, bottom),
                              (pin.start, top), (np.nan, np.nan)]
    return {state: np.asarray(p, dtype=float).reshape(-1, 2) for state, p in points.items()}


def pin_at(pins: list[Pin], position: int) -> int | None:
    """The index of the first span holding `position`, or None."""
    return next((i for i, pin in enumerate(pins) if pin.start <= position < pin.end), None)
