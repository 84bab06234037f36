"""What the importance-based eviction strategies share: a token budget per layer, full-attention models only,
kvviz's attention function installed when a policy reads attention, and the size rule of keys, values and the
policy's own bookkeeping.

Each policy (h2o, tova, snapkv, knorm) is a module of its own with its layer (an `EvictionLayer`) and its
strategy (an `EvictionStrategy`). A policy may leave its first layers whole, as plain DynamicLayers (key norm,
as its authors do).

At a live switch the held tokens are handed to the new layers (`EvictionLayer.receive`) without a forward, so
there is no attention to score them with: every policy chooses at the first step after the switch, from that
step's attention (H2O's sums start there; SnapKV takes that step's queries as its observation window; key norm
needs none). That step's record shows the budget.
"""

from __future__ import annotations

from typing import ClassVar

from kvviz.engine.geometry import Geometry
from kvviz.engine.predict import CachePredictor
from kvviz.engine.strategies.base import (
    Option,
    Strategy,
    attention_layers_problem,
    keep_own_layers,
    only_full_attention,
)

POSITION_BYTES = 8  # an int64 position, what an EvictionLayer keeps per token and KV head


def budget_option(minimum: int = 1) -> Option:
    return Option("budget", "int", 256, "tokens each layer keeps", minimum=minimum)


class BudgetPredictor(CachePredictor):
    """Each compressed layer holds what it was fed up to `budget` tokens, then exactly `budget`; the first `whole`
    layers keep everything (DynamicLayer). Beside keys and values a compressed layer's policy keeps the position of
    every token it holds and of every key the latest feed returned (one tensor when the policy chose nothing in that
    feed; `EvictionLayer`), and `score_bytes` per token held and KV head (H2O's accumulated attention)."""

    def __init__(self, geometry, budget: int, score_bytes: int = 0, whole: int = 0):
        super().__init__(geometry)
        self.budget = budget
        self.score_bytes = score_bytes
        self.whole = whole
        n = geometry.num_layers
        self.held = [0] * n  # per layer: tokens held
        self.returned = [0] * n  # per layer: tokens the latest feed returned to attention (held before it, and new)
        self.chose = [False] * n  # per layer: whether the policy gathered what it keeps in the latest feed
        self.scored = [0] * n  # per layer: tokens with a score

    def advance(self, i, new, received) -> None:
        if received:  # kept as given, unscored, until the next feed chooses
            self.held[i], self.returned[i], self.chose[i], self.scored[i] = new, new, False, 0
            return
        self.returned[i] = self.held[i] + new
        self.held[i], self.chose[i] = self.kept(i, new)
        self.scored[i] = self.held[i]

    def kept(self, i: int, new: int) -> tuple[int, bool]:
        """Tokens layer i holds after a feed of `new` tokens returned `returned[i]`, and whether its policy chose."""
        return min(self.returned[i], self.budget), self.returned[i] > self.budget

    def layer_bytes(self, i, window) -> int:
        tokens = self.seen[i] if i < self.whole else self.held[i]
        return tokens * self.token_bytes(i)

    def policy_bytes(self) -> int:
        total = 0
        for i in range(self.whole, self.geometry.num_layers):
            if not self.geometry.layer_token_bytes[i]:  # a state layer: transformers' own, no policy
                continue
            positions = self.returned[i] + (self.held[i] if self.chose[i] else 0)
            total += POSITION_BYTES * positions + self.score_bytes * self.scored[i]
        return total * self.geometry.batch * self.geometry.kv_heads


class EvictionStrategy(Strategy):
    evicts = True
    reads_attention: ClassVar[bool] = True  # False: the policy chooses from the keys alone

    def make_layer(self, index: int, options: dict):
        """The policy's EvictionLayer for decoder layer `index` (kvviz.engine.eviction_layers)."""
        raise NotImplementedError

    def whole_layers(self, options: dict) -> int:
        """The first layers the policy leaves whole (plain DynamicLayers)."""
        return 0

    def model_problem(self, model, geometry, options):
        from kvviz.engine import attention_scores

        problem = attention_layers_problem(geometry, "evicts keys and values by importance")
        problem = problem or only_full_attention(geometry)
        if problem is None and self.reads_attention:
            problem = attention_scores.unsupported(model)
        return problem

    def make_cache(self, model, options, capacity):
        from transformers.cache_utils import Cache, DynamicLayer

        from kvviz.engine import attention_scores

        if self.reads_attention:
            attention_scores.install(model)
        n_layers = Geometry.of(model.config, model.dtype).num_layers
        whole = self.whole_layers(options)
        layers = [DynamicLayer() if i < whole else self.make_layer(i, options) for i in range(n_layers)]
        return Cache(layers=keep_own_layers(model, layers))

    def predictor(self, options, geometry, capacity):
        return BudgetPredictor(geometry, options["budget"], whole=self.whole_layers(options))

    def prompt_capacity(self, options) -> int:
        return options["budget"]
