"""Expected Attention (Devoto et al., 2025, "Expected Attention: KV Cache Compression by Estimating Attention from
Future Queries Distribution"): keep the tokens that the queries still to come are expected to attend to.

The queries of the feed that compresses (the prompt's, its first `sink_tokens` left out), taken back before RoPE,
give a mean and a covariance per query head. Averaging RoPE's rotation over the next `future` positions turns them
into the statistics of a future query, under which the expected attention logit of a key k is
mu . k / sqrt(d) + k^T Sigma k / (2 d) (a Gaussian query). Those are softmaxed over the held keys, averaged over the
query heads of a KV head and, by default, multiplied by each value's norm (what a token can add to the output);
the first `sink_tokens` tokens are always kept. As kvpress's ExpectedAttentionPress, whose defaults these are.

kvviz reads the queries from its attention function (after RoPE) and turns them back with the rotation of their
positions; kvpress projects them again from the layer's input. At a compression during decoding the statistics are
those of the step's own query (kvpress's DecodingPress gives its scorer a buffer of recent inputs instead).
"""

from __future__ import annotations

import math

import torch

from kvviz.engine.scorers import Scorer, force
from kvviz.engine.strategies.base import Option, rotary_embedding, rotary_inv_freq
from kvviz.engine.strategies.eviction import EvictionStrategy, budget_option, scoring_options


class FutureQueries(Scorer):
    def __init__(self, rotary, sinks: int, future: int, covariance: bool, value_norm: bool, epsilon: float):
        self.rotary = rotary  # the model's rotary embedding: (x, position_ids) -> cos, sin [1, n, head_dim]
        self.sinks = sinks
        self.future = future
        self.covariance = covariance
        self.value_norm = value_norm
        self.epsilon = epsilon

    def scores(self, layer, query, key, mask, scaling):
        from transformers.models.llama.modeling_llama import rotate_half

        batch, heads, new, dim = query.shape
        kv_heads, held = key.shape[1], key.shape[2]
        positions = layer.query_positions(new)
        cos, sin = self.rotary(query, positions)  # [1, new, dim]
        before = (query * cos[:, None] - rotate_half(query) * sin[:, None]) / (cos * cos + sin * sin)[:, None]
        statistic = before[:, :, positions[0] >= self.sinks]  # the prompt's first tokens are outliers
        mean = statistic.mean(dim=2)  # [batch, heads, dim]
        rotation = self.average_rotation(query, int(positions[0, -1]) + 1, dim)
        mean = mean @ rotation.T
        # the sinks (positions, which are the first held keys) and the padding of heads that hold fewer (adaptive)
        # are left out of the softmax, as kvpress leaves out its first keys
        left_out = layer.positions < self.sinks
        if layer.key_mask is not None:
            left_out = left_out | ~layer.key_mask
        group = heads // kv_heads
        keys = key.repeat_interleave(group, dim=1)  # [batch, heads, held, dim]
        logits = (keys @ mean[..., None]).squeeze(-1) / math.sqrt(dim)
        if self.covariance:
            centered = statistic - statistic.mean(dim=2, keepdim=True)
            covariance = centered.transpose(-1, -2) @ centered / statistic.shape[2]
            covariance = rotation @ covariance @ rotation.T
            logits = logits + ((keys @ covariance) * keys).sum(dim=-1) / dim / 2
        logits = logits.masked_fill(left_out.repeat_interleave(group, dim=1), float("-inf"))
        scores = logits.softmax(dim=-1).view(batch, kv_heads, group, held).mean(dim=2)
        if self.value_norm:
            scores = (scores + self.epsilon) * layer.values.norm(dim=-1)
        return force(scores, layer.positions < self.sinks)

    def average_rotation(self, like: torch.Tensor, start: int, dim: int) -> torch.Tensor:
        """RoPE's rotation matrix averaged over positions start .. start + future - 1 ``[dim, dim]``."""
        positions = torch.arange(start, start + self.future, device=like.device)[None]
        cos, sin = self.rotary(like, positions)
        cos, sin = cos[0], sin[0]  # [future, dim]
        half = dim // 2
        swap = torch.zeros((dim, dim), device=like.device, dtype=cos.dtype)  # rotate_half as a matrix
        swap[half:, :half], swap[:half, half:] = torch.eye(half), -torch.eye(half)
        eye = torch.eye(dim, device=like.device, dtype=cos.dtype)
        return (cos[:, :, None] * eye + sin[:, :, None] * swap).mean(dim=0)


class ExpectedAttention(EvictionStrategy):
    name = "expected_attention"
    description = ("Expected Attention: keep the tokens the future queries are expected to attend to (from the "
                   "queries' mean and covariance), weighted by value norms")
    reference = ("Expected Attention (Devoto et al., 2025), as kvpress's ExpectedAttentionPress (512 future positions, "
                 "4 sinks, covariance and value norms); statistics from the compressing feed's queries")
    compresses_prompt = True
    options = (
        budget_option(),
        Option("future", "int", 512, "future positions RoPE's rotation is averaged over", minimum=1),
        Option("sink_tokens", "int", 4, "first tokens always kept, and left out of the query statistics", minimum=0),
        Option("covariance", "bool", True, "use the queries' covariance, not only their mean"),
        Option("value_norm", "bool", True, "weight each token by its value's norm"),
        Option("epsilon", "float", 0.0, "added to the expected attention before the value norm weighs it",
               minimum=0.0),
        *scoring_options(),
    )
    scorer = FutureQueries

    def check_options(self, options):
        if options["sink_tokens"] >= options["budget"]:
            return (f"option 'sink_tokens' of strategy {self.name!r} ({options['sink_tokens']}) must be smaller than "
                    f"'budget' ({options['budget']})")
        return super().check_options(options)

    def model_problem(self, model, geometry, options):
        if rotary_inv_freq(model) is None:
            return "needs a model with one rotary position embedding (RoPE) to average over future positions"
        return super().model_problem(model, geometry, options)

    def prompt_kept(self, options) -> str:
        return (f"its first {options['sink_tokens']} tokens and per KV head the {options['budget']:,} tokens the "
                "future queries are expected to attend to most")

    def make_scorer(self, index, options, model):
        return FutureQueries(rotary_embedding(model), options["sink_tokens"], options["future"],
                             options["covariance"], options["value_norm"], options["epsilon"])
