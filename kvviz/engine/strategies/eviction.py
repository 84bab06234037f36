"""What the importance-based eviction strategies share: a token budget per layer, full-attention models only,
kvviz's attention function installed when a policy reads attention, and the size rule.

Each policy (h2o, tova, snapkv, knorm) is a module of its own with its layer (an `EvictionLayer`) and its
strategy (an `EvictionStrategy`).

At a live switch the held tokens are fed through the new layers' `update()` without a forward, so there is
no attention to score them with: key norm chooses at once, and the attention policies choose at the first
step after the switch, from that step's attention (H2O's sums start there; SnapKV takes that step's queries
as its observation window). The step's record shows the budget either way.
"""

from __future__ import annotations

from typing import ClassVar

from transformers.cache_utils import Cache

from kvviz.engine import attention_scores
from kvviz.engine.eviction_layers import EvictionLayer
from kvviz.engine.geometry import Geometry
from kvviz.engine.predict import CachePredictor
from kvviz.engine.strategies.base import Option, Strategy, only_full_attention


def budget_option(minimum: int = 1) -> Option:
    return Option("budget", "int", 256, "tokens each layer keeps", minimum=minimum)


class BudgetPredictor(CachePredictor):
    """Each layer holds everything it has seen up to `budget` tokens, then exactly `budget`."""

    def __init__(self, geometry, budget: int):
        super().__init__(geometry)
        self.budget = budget

    def layer_bytes(self, i, window, new) -> int:
        return min(self.seen + new, self.budget) * self.geometry.token_bytes


class EvictionStrategy(Strategy):
    evicts = True
    reads_attention: ClassVar[bool] = True  # False: the policy chooses from the keys alone

    def make_layer(self, index: int, options: dict) -> EvictionLayer:
        raise NotImplementedError

    def model_problem(self, model, geometry, options):
        problem = only_full_attention(geometry)
        if problem is None and self.reads_attention:
            problem = attention_scores.unsupported(model)
        return problem

    def make_cache(self, model, options, capacity):
        if self.reads_attention:
            attention_scores.install(model)
        n_layers = Geometry.of(model.config, model.dtype).num_layers
        return Cache(layers=[self.make_layer(i, options) for i in range(n_layers)])

    def predictor(self, options, geometry, capacity):
        return BudgetPredictor(geometry, options["budget"])

    def has_evicted(self, options, seen) -> bool:
        return seen > options["budget"]
