"""SnapKV (Li et al., 2024): compress the prompt once, by what its last queries attend to; decoding appends.

At the prefill, if the prompt is longer than `budget`, each KV head keeps the last `window` prompt tokens (the
observation window) plus the `budget - window` earlier tokens that the window's queries attend to most:
attention summed over the window's queries, averaged over the query heads that share the KV head, then pooled
over neighbouring positions (`kernel` wide, averaged by default as in the reference code, or the maximum) so that
kept tokens come with their context. Tokens fed after the prefill are all kept, so the cache grows again from
`budget` (unless `decode_interval` compresses during decoding: then the feed that compresses observes its own
queries, one at a decoding step).

The prompt is whatever the cache holds at its first forward: fed one token at a time from the start, it never
compresses (an evaluation gives it a prompt: `kvviz.engine.evaluate`). After a live switch the held tokens are the
prompt and the first step's own query is the observation window.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvviz.engine.scorers import Scorer, force_newest
from kvviz.engine.strategies.base import Option
from kvviz.engine.strategies.eviction import EvictionStrategy, budget_option, scoring_options

POOLINGS = ("average", "max")
POOLING = {"average": F.avg_pool1d, "max": F.max_pool1d}


class ObservationWindow(Scorer):
    """SnapKV's scores (PyramidKV's too): what the last `window` queries attend to, pooled; the window kept."""

    def __init__(self, window: int, kernel: int, pooling: str = "average"):
        self.window = window
        self.kernel = kernel
        self.pool = POOLING[pooling]

    def scores(self, layer, query, key, mask, scaling):
        from kvviz.engine.attention_scores import attention_received

        held = key.shape[-2]
        window = min(self.window, held)
        observed = min(self.window, query.shape[2])
        # the mean over the window's queries and over the query heads of a KV head: kvpress's scale, which CriticalKV's
        # epsilon is added at
        received = attention_received(query, key, mask, scaling, last=observed).mean(dim=2) / observed
        candidates = received[..., : held - window]
        pooled = self.pool(candidates, kernel_size=self.kernel, stride=1, padding=self.kernel // 2)
        scores = torch.cat([pooled, received[..., held - window :]], dim=-1)
        return force_newest(scores, window)


def window_options(window: int) -> tuple[Option, ...]:
    return (
        Option("window", "int", window, "last prompt tokens whose queries choose (the observation window), all kept",
               minimum=1),
        Option("kernel", "int", 5, "pooling width over positions (odd)", minimum=1),
        Option("pooling", "choice", "average", "how attention is pooled over neighbouring positions",
               choices=POOLINGS),
    )


def check_window(name: str, options: dict) -> str | None:
    smallest = min(options["budget"], options["decode_target"] or options["budget"])
    if options["window"] >= smallest:
        which = "budget" if smallest == options["budget"] else "decode_target"
        return (
            f"option 'window' of strategy {name!r} ({options['window']}) must be smaller than {which!r} "
            f"({smallest}), to leave room for the tokens it chooses"
        )
    if options["kernel"] % 2 == 0:
        return f"option 'kernel' of strategy {name!r} must be an odd number, not {options['kernel']}"
    return None


class SnapKV(EvictionStrategy):
    name = "snapkv"
    description = "SnapKV: cut the prompt to budget by what its last window queries attend to; decoding appends"
    reference = (
        "SnapKV (Li et al., NeurIPS 2024) and its reference code (window 32, kernel 5, average pooling; kvpress's "
        "SnapKVPress observes 64); with grouped-query attention a KV head averages its query heads' attention (as "
        "kvpress), where the reference repeats the keys per query head"
    )
    compresses_prompt = True
    options = (budget_option(minimum=2), *window_options(32), *scoring_options())
    scorer = ObservationWindow

    def check_options(self, options):
        return check_window(self.name, options) or super().check_options(options)

    def prompt_kept(self, options) -> str:
        return (f"per KV head its last {options['window']:,} tokens and the {options['budget'] - options['window']:,} "
                f"that those tokens' queries attend to most ({options['pooling']}-pooled over {options['kernel']} "
                "neighbours)")

    def make_scorer(self, index, options, model):
        return ObservationWindow(options["window"], options["kernel"], options["pooling"])
