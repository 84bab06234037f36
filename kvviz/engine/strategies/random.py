"""Random eviction: the baseline every comparison needs (kvpress's RandomPress).

Once over its target, each KV head keeps tokens drawn at random: every held token gets a uniform random score, drawn
afresh from a generator seeded with `seed` at each compression (as kvpress draws them), and the highest are kept. A
run with the same seed keeps the same positions.
"""

from __future__ import annotations

import torch

from kvviz.engine.scorers import Scorer
from kvviz.engine.strategies.base import Option
from kvviz.engine.strategies.eviction import EvictionStrategy, budget_option, scoring_options


class Uniform(Scorer):
    reads_attention = False

    def __init__(self, seed: int):
        self.seed = seed

    def scores(self, layer, query, key, mask, scaling):
        generator = torch.Generator(device=layer.device).manual_seed(self.seed)
        return torch.rand(*layer.keys.shape[:-1], generator=generator, device=layer.device, dtype=layer.keys.dtype)


class Random(EvictionStrategy):
    name = "random"
    description = "random: per KV head, keep the budget tokens at random (the baseline)"
    reference = ("kvpress's RandomPress: a uniform random score per token and KV head; seeded (kvpress's default draws "
                 "unseeded), so that a run can be repeated")
    compresses_prompt = True
    options = (
        budget_option(),
        Option("seed", "int", 0, "seed of the random scores, drawn afresh at each compression", minimum=0),
        *scoring_options(),
    )

    scorer = Uniform

    def prompt_kept(self, options) -> str:
        return f"per KV head {options['budget']:,} tokens drawn at random"

    def make_scorer(self, index, options, model):
        return Uniform(options["seed"])
