"""The size a cache should have, from the model config and the strategy alone.

Nothing here looks at a live cache: `measure.py` reads the real allocation, and the two are drawn
next to each other. A `CachePredictor` replays a strategy's storage rule (what it allocates when a
step adds n tokens) per layer; `after_step(n)` returns the bytes the cache should hold. This base
class is transformers' `DynamicCache`: each full-attention layer keeps everything it has seen, each
sliding-window layer of a hybrid model its window. Strategies subclass it for their own rule.
"""

from __future__ import annotations

from kvviz.engine.geometry import Geometry


class CachePredictor:
    def __init__(self, geometry: Geometry):
        self.geometry = geometry
        self.seen = 0  # tokens fed so far

    def after_step(self, new_tokens: int) -> int:
        """Bytes of the whole cache after a forward that fed `new_tokens` tokens."""
        total = 0
        for i, window in enumerate(self.geometry.windows):
            total += 2 * self.layer_bytes(i, window, new_tokens)
        self.seen += new_tokens
        return total

    def layer_bytes(self, i: int, window: int | None, new: int) -> int:
        """Bytes of keys (== values) in layer i, whose native sliding window is `window`, after `new` tokens."""
        return self.growing_tokens(window, new) * self.geometry.token_bytes

    def growing_tokens(self, window: int | None, new: int) -> int:
        """Tokens allocated by a growing layer: DynamicLayer, or DynamicSlidingWindowLayer of `window`."""
        if window is None:  # DynamicLayer: one tensor of everything seen
            return self.seen + new
        # DynamicSlidingWindowLayer keeps a view of the last window-1 tokens into the concatenation
        # of what it held and the new tokens; that concatenation is the allocation.
        return min(self.seen, window - 1) + new
