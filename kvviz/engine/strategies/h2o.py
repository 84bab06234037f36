"""H2O (Zhang et al., 2023, "Heavy-Hitter Oracle"): keep the tokens that have received the most attention.

Every token held carries its accumulated attention: the sum of the attention probabilities every query has
paid it since it entered the cache (at the prefill, all prompt queries, causally). Once a layer holds more
than `budget`, each KV head keeps the `recent` newest tokens plus the `budget - recent` older ones with the
highest sums (the heavy hitters), and the sums of what is dropped are forgotten. As in the paper's
implementation the choice is per head, and the budget is split between heavy hitters and recent tokens
(half each by default, `recent=-1`; `recent=0` keeps heavy hitters only); with grouped-query attention a KV
head's sums add up the attention of the query heads that share it. The sums are float32, one per token held and
KV head: the policy's state beside the positions every `EvictionLayer` keeps.
"""

from __future__ import annotations

from kvviz.engine.strategies.base import Option
from kvviz.engine.strategies.eviction import BudgetPredictor, EvictionStrategy, budget_option

SCORE_BYTES = 4  # a float32 sum per token held and KV head


class H2O(EvictionStrategy):
    name = "h2o"
    description = "H2O heavy hitters: per KV head, the most-attended tokens so far plus the most recent ones"
    reference = (
        "H2O (Zhang et al., NeurIPS 2023), as the authors' code: attention summed over every query since a token "
        "entered, per KV head; heavy hitters and recent tokens share the budget"
    )
    options = (
        budget_option(minimum=2),
        Option("recent", "int", -1, "most recent tokens always kept; -1 means half the budget, 0 none (heavy hitters "
               "only)", minimum=-1),
    )

    def check_options(self, options):
        if options["recent"] >= options["budget"]:
            return (
                f"option 'recent' of strategy 'h2o' ({options['recent']}) must be smaller than 'budget' "
                f"({options['budget']}), to leave room for heavy hitters"
            )
        return None

    def prompt_kept(self, options) -> str:
        recent = options["budget"] // 2 if options["recent"] == -1 else options["recent"]
        kept = f"per KV head the {options['budget']:,} tokens that drew the most attention"
        return kept + (f", its last {recent:,} among them" if recent else "")

    def make_layer(self, index, options):
        recent = options["budget"] // 2 if options["recent"] == -1 else options["recent"]
        from kvviz.engine.eviction_layers import H2OLayer

        return H2OLayer(index, options["budget"], recent)

    def predictor(self, options, geometry, capacity):
        return BudgetPredictor(geometry, options["budget"], score_bytes=SCORE_BYTES)
