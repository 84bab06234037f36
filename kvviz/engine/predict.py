"""The size a cache should have, from the model config and the strategy alone.

Nothing here looks at a live cache: `measure.py` reads the real allocation, and the two are drawn
next to each other. A `CachePredictor` replays a strategy's storage rule (what it allocates when a
feed adds n tokens) per layer. `feed(n)`, `more_prompt()` (a prompt read in chunks goes on) and
`receive(moved)` (a live switch's filling, which may differ by layer) are the only calls that change its state;
`cache_bytes()` and `policy_bytes()` answer from that state, as often as asked. This base class is transformers'
`DynamicCache`: each full-attention layer keeps everything it has seen, each sliding-window layer of a hybrid model
its window, and no policy keeps anything beside keys and values. Strategies subclass it for their own rule.
"""

from __future__ import annotations

from kvviz.engine.geometry import Geometry


class CachePredictor:
    def __init__(self, geometry: Geometry):
        self.geometry = geometry
        self.seen = [0] * geometry.num_layers  # per layer: tokens fed to it, the latest feed included
        self.last = [0] * geometry.num_layers  # per layer: tokens of its latest feed
        self.holds_state = [False] * geometry.num_layers  # per layer: its fixed-size state is allocated
        self.encoder_tokens = 0  # an encoder-decoder's: what its cross-attention keys and values hold

    def encoded(self, tokens: int) -> None:
        """An encoder-decoder's encoder read `tokens` tokens: the cross-attention layers will hold them all."""
        self.encoder_tokens = tokens

    def feed(self, new_tokens: int) -> None:
        """A forward fed `new_tokens` tokens through every layer."""
        for i in range(len(self.seen)):
            self._fed(i, new_tokens, received=False)

    def more_prompt(self) -> None:
        """The next feed is more of a prompt read in chunks (`Strategy.prompt_continues`): no change for a cache without
        a policy."""

    def receive(self, moved: list[int]) -> None:
        """A live switch filled the new cache, layer i with the `moved[i]` tokens the old cache held there.
        transformers' layers take them through their own `update()`, as a feed; kvviz's layers keep them as given
        until the next feed."""
        for i, tokens in enumerate(moved):
            self._fed(i, tokens, received=True)
        self.holds_state = [bool(size) for size in self.geometry.layer_state_bytes]  # moved over as they were

    def _fed(self, i: int, new: int, received: bool) -> None:
        self.seen[i] += new
        self.last[i] = new
        self.holds_state[i] = self.holds_state[i] or new > 0
        self.advance(i, new, received)

    def advance(self, i: int, new: int, received: bool) -> None:
        """A subclass's own state of layer i after a feed of `new` tokens (`seen` and `last` already count it)."""

    def cache_bytes(self) -> int | None:
        """Bytes the whole cache should hold now: every layer's tokens (`layer_bytes`), the fixed states of the
        layers fed so far (and what a one-token feed leaves beside a state, `geometry.step_state_bytes`) and an
        encoder-decoder's cross-attention keys and values; None where a state's size has no formula
        (`geometry.state_bytes`) or the model's layers have no size rule (`geometry.unknown`)."""
        geometry = self.geometry
        if geometry.unknown:
            return None
        sizes = zip(geometry.layer_state_bytes, geometry.layer_step_state_bytes, self.holds_state, self.last,
                    strict=True)
        states = [size if size is None or last != 1 else size + step for size, step, held, last in sizes if held]
        if any(size is None for size in states):
            return None
        tokens = sum(self.layer_bytes(i, window) for i, window in enumerate(self.geometry.windows))
        return tokens + self.geometry.batch * sum(states) + self.geometry.cross_bytes(self.encoder_tokens)

    def layer_bytes(self, i: int, window: int | None) -> int:
        """Bytes of what layer i keeps per token (keys, values, indexer keys), whose native sliding window is
        `window`."""
        return self.growing_tokens(i, window) * self.token_bytes(i)

    def token_bytes(self, i: int) -> int:
        """Keys, values and indexer keys one token takes in layer i (0 in state and KV-shared layers)."""
        return self.geometry.batch * self.geometry.layer_token_bytes[i]

    def growing_tokens(self, i: int, window: int | None) -> int:
        """Tokens allocated by layer i if it grows: a DynamicLayer, or a DynamicSlidingWindowLayer of `window`."""
        if window is None:  # DynamicLayer: one tensor of everything seen
            return self.seen[i]
        # DynamicSlidingWindowLayer keeps a view of the last window-1 tokens into the concatenation
        # of what it held and the new tokens; that concatenation is the allocation.
        return min(self.seen[i] - self.last[i], window - 1) + self.last[i]

    def policy_bytes(self) -> int:
        """Bytes a policy keeps beside keys and values (its bookkeeping); none here."""
        return 0
