"""LagKV (Liang et al., 2025, "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are Important"):
score each token against the next partition, no attention needed.

The held tokens after the first `sink_tokens` are cut into partitions of `lag` tokens; the last whole partition
and what follows it are kept (they have no next partition to be compared with), and so are the sinks. A token of any
other partition is scored by how much its key and value stand out against the next partition: each channel is
min-max normalized by the next partition's range, the standard deviation over channels is taken, and the
partition's scores go through a softmax; the key's and the value's scores are averaged, and (as kvpress does by
default) replaced by their rank within the partition, so that every partition gives up the same share. A prompt
shorter than `sink_tokens + 2 * lag` has nothing to compare: its sinks and its newest tokens are kept.
"""

from __future__ import annotations

import torch

from kvviz.engine.scorers import Scorer
from kvviz.engine.strategies.base import Option
from kvviz.engine.strategies.eviction import EvictionStrategy, budget_option, scoring_options


class LagRelative(Scorer):
    reads_attention = False

    def __init__(self, sinks: int, lag: int):
        self.sinks = sinks
        self.lag = lag

    def scores(self, layer, query, key, mask, scaling):
        keys, values = layer.keys, layer.values
        batch, kv_heads, held, dim = keys.shape
        sinks, lag = self.sinks, self.lag
        if held < sinks + 2 * lag:  # nothing to compare with: the sinks, then the newest first
            scores = torch.ones((batch, kv_heads, held), dtype=keys.dtype, device=keys.device)
            if held > sinks:
                scores[..., sinks:] = (torch.arange(held - sinks, device=keys.device) / (held - sinks)).to(keys.dtype)
            return scores
        end = sinks + (held - sinks) // lag * lag
        partitions = (batch, kv_heads, -1, lag, dim)
        score = (self.lag_score(keys[:, :, sinks:end].reshape(partitions))
                 + self.lag_score(values[:, :, sinks:end].reshape(partitions))) / 2
        ranks = (score.argsort(dim=-1).argsort(dim=-1) / lag).to(keys.dtype)  # within each partition
        sink_scores = torch.ones((batch, kv_heads, sinks), dtype=keys.dtype, device=keys.device)
        tail = torch.ones((batch, kv_heads, lag + held - end), dtype=keys.dtype, device=keys.device)
        return torch.cat([sink_scores, ranks.reshape(batch, kv_heads, -1), tail], dim=-1)

    @staticmethod
    def lag_score(states: torch.Tensor) -> torch.Tensor:
        """``[batch, kv_heads, partitions, lag, dim]`` -> scores of every partition but the last, against the next."""
        reference, scored = states[:, :, 1:], states[:, :, :-1]
        low = reference.min(dim=-2, keepdim=True).values
        high = reference.max(dim=-2, keepdim=True).values
        return ((scored - low) / (high - low)).std(dim=-1).softmax(dim=-1)


class LagKV(EvictionStrategy):
    name = "lagkv"
    description = "LagKV: score each partition's tokens against the next partition's range (no attention needed)"
    reference = ("LagKV (Liang et al., 2025), as kvpress's LagKVPress (lag 128, 4 sinks, scores ranked within each "
                 "partition)")
    compresses_prompt = True
    options = (
        budget_option(),
        Option("lag", "int", 128, "tokens per partition; each is scored against the next", minimum=2),
        Option("sink_tokens", "int", 4, "first tokens always kept", minimum=0),
        *scoring_options(),
    )
    scorer = LagRelative

    def check_options(self, options):
        if options["adaptive"] and options["decode_interval"]:
            return ("options 'adaptive' and 'decode_interval' of strategy 'lagkv' cannot go together: LagKV cuts each "
                    "KV head's tokens into partitions from its first, and after an adaptive choice the heads hold "
                    "different numbers; compress the prompt only (decode_interval=0) or drop adaptive")
        return super().check_options(options)

    def prompt_kept(self, options) -> str:
        return (f"its first {options['sink_tokens']} tokens, its last whole partition of {options['lag']} and what "
                f"follows, and the rest of {options['budget']:,} by the partition scores")

    def make_scorer(self, index, options, model):
        return LagRelative(options["sink_tokens"], options["lag"])
