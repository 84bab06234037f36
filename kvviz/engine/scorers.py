"""What an eviction layer (kvviz.engine.eviction_layers) asks of a policy: its scorer (what held tokens are ranked
by), its schedule (when the layer compresses, and to how many tokens), and the constants of the wrappers (AdaKV,
ChunkKV, CriticalKV) as kvpress sets them. The policies themselves are strategies (kvviz.engine.strategies.eviction
and a module each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

ADAPTIVE_SAFEGUARD = 0.2  # AdaKV: each head keeps at least this share of the layer's per-head budget (kvpress's)
CRITICAL_FIRST_STAGE = 0.5  # CriticalKV: share of the budget chosen by the policy's scores alone (kvpress's)
CRITICAL_EPSILON = 1e-4  # CriticalKV: added to the scores before they are weighted by the output norms (kvpress's)


@dataclass
class ScheduleState:
    """Where one layer is in its schedule."""

    prompt: bool = True  # the next feed is the prompt (the first feed, or the first after a live switch)
    since: int = 0  # tokens fed since the prompt or the last compression after it


@dataclass(frozen=True)
class Schedule:
    """When a layer compresses, and to how many tokens; the layer and its size rule both follow it."""

    budget: int
    interval: int = 0
    target: int = 0
    fraction: float = 0.0

    @classmethod
    def of(cls, options: dict) -> Schedule:
        return cls(options["budget"], options.get("decode_interval", 0), options.get("decode_target", 0),
                   options.get("decode_fraction", 0.0))

    def prompt_budget(self, index: int, tokens: int) -> int:
        """Tokens layer `index` keeps of a prompt of `tokens` tokens (PyramidKV gives layers their own)."""
        return self.budget

    def compress_to(self, state: ScheduleState, index: int, held: int, new: int, seen: int) -> int | None:
        """The tokens layer `index` keeps after a feed of `new` tokens left it holding `held` of the `seen` seen, or
        None when it keeps them all (advances `state`)."""
        if state.prompt:
            state.prompt, state.since = False, 0
            target = self.prompt_budget(index, held)
        else:
            state.since += new
            if not self.interval or state.since < self.interval:
                return None
            state.since = 0
            target = max(1, int(seen * self.fraction)) if self.fraction else (self.target or self.budget)
        return target if held > target else None


def chunk_kept(held: int, target: int, chunk: int) -> int:
    """Tokens a chunked choice keeps of `held` for a target of `target`: as kvpress's ChunkKVPress counts them, the
    target's share of all chunks (the newest partial one, still filling, counted as one; at least one chunk), which
    are the partial chunk and the best whole ones. So it keeps up to a chunk less than the target (kvpress 0.5.5 keeps
    int(chunks * (1 - compression ratio)) chunks; with the ratio of `target` of `held` tokens that is this floor)."""
    partial = held % chunk
    chunks = held // chunk + (partial > 0)
    kept = max(1, chunks * target // held)
    return partial + (kept - 1) * chunk if partial else kept * chunk


class Scorer:
    """What a policy ranks held tokens by; each policy's strategy module defines one."""

    reads_attention: ClassVar[bool] = True  # scores from the attention the feed's queries paid (else keys alone)
    every_feed: ClassVar[bool] = False  # observes the attention of every feed, not only of those that compress

    def appended(self, layer, new: int) -> None:
        """`new` tokens were appended to the layer (per-token state grows with them)."""

    def observe(self, layer, query, key, mask, scaling: float) -> None:
        """The attention of a feed that `every_feed` asked for (before `scores`, when the feed compresses)."""

    def scores(self, layer, query, key, mask, scaling: float) -> torch.Tensor:
        """Scores of the held tokens, ``[batch, kv_heads or 1, held]``: the highest are kept. `query` and `key` as the
        feed's attention saw them (`attention_scores.attention_received`), None for a scorer that reads no attention."""
        raise NotImplementedError


def force(scores: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """`scores` with the tokens where `kept` (a mask broadcast to them) raised above every other score, as kvpress
    does (the highest score plus one): a policy's window or sinks, always kept."""
    if not bool(kept.any()) or bool(kept.all()):
        return scores
    return scores.masked_fill(kept, float(scores.masked_fill(kept, float("-inf")).max()) + 1.0)


def force_newest(scores: torch.Tensor, count: int) -> torch.Tensor:
    """`force` of the `count` newest tokens (the last along the token axis), without building their mask: H2O and
    SnapKV call it at every compression, which is every decoding step of H2O."""
    older = scores.shape[-1] - count
    if count <= 0 or older <= 0:
        return scores
    forced = scores.clone()
    forced[..., older:] = float(scores[..., :older].max()) + 1.0
    return forced
