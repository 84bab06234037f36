"""The pinned spans on the cache map: each span outlined, its edges layer by layer in the colour of what that layer's
KV heads still hold of it at the step drawn (`StepRecord.pins_held`: per span, per layer, per KV head, the span's
tokens held).

A layer is "held" when every KV head holds every token of the span, "evicted" when no KV head holds any of
them, "partly held" otherwise (some heads, or some tokens). A layer that holds no tokens at all (a linear-attention
layer's state) gets no outline.
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
    """Per state, the (x, y) points of the lines to draw (NaN rows between lines): around each span, its left and
    right edges layer by layer (x = start and x = end, y from i - 0.5 to i + 0.5, as the map's cells), each in the
    state of that layer, the top edge with the first layer and the bottom edge with the last. Only the edges: a layer
    a pixel or two high would be filled by a box, hiding the cells inside. `held`: the step's `pins_held`. Two lines
    per layer outlined."""
    points: dict[Held, list[tuple[float, float]]] = {state: [] for state in Held}
    gap = (np.nan, np.nan)
    for pin, counts in zip(pins, held, strict=True):
        states = layer_states(counts, pin.size)[:layers]
        drawn = [layer for layer, state in enumerate(states) if state is not None]
        for layer in drawn:
            top, bottom = layer - 0.5, layer + 0.5
            left = [(pin.start, top), (pin.start, bottom)]
            if layer == drawn[0]:
                left.insert(0, (pin.end, top))
            if layer == drawn[-1]:
                left.append((pin.end, bottom))
            points[states[layer]] += [*left, gap, (pin.end, top), (pin.end, bottom), gap]
    return {state: np.asarray(p, dtype=float).reshape(-1, 2) for state, p in points.items()}


def pin_at(pins: list[Pin], position: int) -> int | None:
    """The index of the first span holding `position`, or None."""
    return next((i for i, pin in enumerate(pins) if pin.start <= position < pin.end), None)
