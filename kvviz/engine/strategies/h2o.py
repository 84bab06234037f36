"""H2O (Zhang et al., 2023, "Heavy-Hitter Oracle"): keep the tokens that have received the most attention.

Every token held carries its accumulated attention: the sum of the attention probabilities every query has
paid it since it entered the cache (at the prefill, all prompt queries, causally). Once a layer holds more
than `budget`, each KV head keeps the `recent` newest tokens plus the `budget - recent` older ones with the
highest sums (the heavy hitters), and the sums of what is dropped are forgotten. As in the paper's
implementation the choice is per head, and the budget is split between heavy hitters and recent tokens
(half each by default, `recent=-1`; `recent=0` keeps heavy hitters only); with grouped-query attention a KV
head's sums add up the attention of the query heads that share it. The sums are float32, one per token held and
KV head: the policy's state beside the positions every `EvictionLayer` keeps.

kvpress's ObservedAttentionPress, its H2O, ranks by the mean instead (`average=true`): the sum divided by the number
of queries that attended to the token since it entered, which a token that entered late is not penalised by.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvviz.engine.scorers import Scorer, force_newest
from kvviz.engine.strategies.base import Option
from kvviz.engine.strategies.eviction import EvictionStrategy, budget_option, scoring_options

SCORE_BYTES = 4  # a float32 sum per token held and KV head


class HeavyHitters(Scorer):
    every_feed = True  # the sums grow below the budget too

    def __init__(self, recent: int, average: bool):
        self.recent = recent
        self.average = average
        self.summed_from = 0  # tokens seen when the sums started (0, or a live switch)
        self.group = 1  # query heads per KV head

    def appended(self, layer, new):
        sums = layer.token_state.get("sums")
        if sums is None:  # the first feed, or the first after a live switch: the sums start here
            layer.token_state["sums"] = torch.zeros(layer.positions.shape, dtype=torch.float32, device=layer.device)
            self.summed_from = layer.seen - new
        else:
            layer.token_state["sums"] = F.pad(sums, (0, new))

    def observe(self, layer, query, key, mask, scaling):
        from kvviz.engine.attention_scores import attention_received

        self.group = query.shape[1] // key.shape[1]
        layer.token_state["sums"] += attention_received(query, key, mask, scaling, last=query.shape[2]).sum(dim=2)

    def scores(self, layer, query, key, mask, scaling):
        scores = layer.token_state["sums"]
        if self.average:  # per query that attended to it since it entered (or since the sums started), and per query
            # head of the KV head: kvpress's ObservedAttention, at its scale
            scores = scores / (layer.seen - layer.positions.clamp(min=self.summed_from)) / self.group
        return force_newest(scores, self.recent)


class H2O(EvictionStrategy):
    name = "h2o"
    description = "H2O heavy hitters: per KV head, the most-attended tokens so far plus the most recent ones"
    reference = (
        "H2O (Zhang et al., NeurIPS 2023), as the authors' code: attention summed over every query since a token "
        "entered, per KV head; heavy hitters and recent tokens share the budget. kvpress's ObservedAttentionPress: "
        "recent=0, average=true"
    )
    options = (
        budget_option(minimum=2),
        Option("recent", "int", -1, "most recent tokens always kept; -1 means half the budget, 0 none (heavy hitters "
               "only)", minimum=-1),
        Option("average", "bool", False, "rank by the mean attention each token received (the sum over the queries "
               "that saw it, divided by their number), as kvpress's ObservedAttentionPress; false: the sum, as H2O"),
        *scoring_options(decode_interval=1),
    )
    scorer = HeavyHitters
    score_bytes = SCORE_BYTES

    def check_options(self, options):
        if options["recent"] >= options["budget"]:
            return (
                f"option 'recent' of strategy 'h2o' ({options['recent']}) must be smaller than 'budget' "
                f"({options['budget']}), to leave room for heavy hitters"
            )
        return super().check_options(options)

    def prompt_kept(self, options) -> str:
        recent = recent_tokens(options)
        kept = f"per KV head the {options['budget']:,} tokens that drew the most attention"
        return kept + (f", its last {recent:,} among them" if recent else "")

    def make_scorer(self, index, options, model):
        return HeavyHitters(recent_tokens(options), options["average"])


def recent_tokens(options: dict) -> int:
    return options["budget"] // 2 if options["recent"] == -1 else options["recent"]
