"""SnapKV (Li et al., 2024): compress the prompt once, by what its last queries attend to; decoding appends.

At the prefill, if the prompt is longer than `budget`, each KV head keeps the last `window` prompt tokens (the
observation window) plus the `budget - window` earlier tokens that the window's queries attend to most:
attention summed over the window's queries, averaged over the query heads that share the KV head, then pooled
over neighbouring positions (`kernel` wide, averaged by default as in the reference code, or the maximum) so that
kept tokens come with their context. Tokens fed after the prefill are all kept, so the cache grows again from
`budget`.

The prompt is whatever the cache holds at its first forward: fed one token at a time from the start, it never
compresses (an evaluation gives it a prompt: `kvviz.engine.evaluate`). After a live switch the held tokens are the
prompt and the first step's own queries are the observation window.
"""

from __future__ import annotations

from kvviz.engine.strategies.base import Option
from kvviz.engine.strategies.eviction import BudgetPredictor, EvictionStrategy, budget_option

POOLINGS = ("average", "max")


class SnapKVPredictor(BudgetPredictor):
    """The first feed (the prompt, or what a live switch moved in, with the first step's tokens) is cut to `budget`
    when longer; later feeds are added."""

    def __init__(self, geometry, budget: int):
        super().__init__(geometry, budget)
        self.compressed = [False] * geometry.num_layers

    def kept(self, i, new):
        returned = self.returned[i]
        if self.compressed[i]:
            return returned, False
        self.compressed[i] = True
        if returned <= self.budget:
            return returned, False
        prompt = returned if returned == new else returned - new
        return self.budget + returned - prompt, True


class SnapKV(EvictionStrategy):
    name = "snapkv"
    description = "SnapKV: cut the prompt to budget by what its last window queries attend to; decoding appends"
    reference = (
        "SnapKV (Li et al., NeurIPS 2024) and its reference code (window 32, kernel 5, average pooling); with "
        "grouped-query attention a KV head averages its query heads' attention (as kvpress), where the reference "
        "repeats the keys per query head"
    )
    compresses_prompt = True
    options = (
        budget_option(minimum=2),
        Option("window", "int", 32, "last prompt tokens whose queries choose (the observation window), all kept",
               minimum=1),
        Option("kernel", "int", 5, "pooling width over positions (odd)", minimum=1),
        Option("pooling", "choice", "average", "how attention is pooled over neighbouring positions",
               choices=POOLINGS),
    )

    def check_options(self, options):
        if options["window"] >= options["budget"]:
            return (
                f"option 'window' of strategy 'snapkv' ({options['window']}) must be smaller than 'budget' "
                f"({options['budget']}), to leave room for the tokens it chooses"
            )
        if options["kernel"] % 2 == 0:
            return f"option 'kernel' of strategy 'snapkv' must be an odd number, not {options['kernel']}"
        return None

    def prompt_kept(self, options) -> str:
        return (f"per KV head its last {options['window']:,} tokens and the {options['budget'] - options['window']:,} "
                f"that those tokens' queries attend to most ({options['pooling']}-pooled over {options['kernel']} "
                "neighbours)")

    def make_layer(self, index, options):
        from kvviz.engine.eviction_layers import SnapKVLayer

        return SnapKVLayer(index, options["budget"], options["window"], options["kernel"], options["pooling"])

    def predictor(self, options, geometry, capacity):
        return SnapKVPredictor(geometry, options["budget"])
