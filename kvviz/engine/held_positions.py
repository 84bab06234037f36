"""Which tokens a cache layer holds: the position of the token behind each key it keeps.

Positions here count the tokens the model has processed, 0 .. seen-1, whatever position ids numbered them
(a sink cache renumbers its keys): they are the columns of the cache map, what its hover texts name and
where the attention view draws attention. A live switch hands the positions of what it moves to the new
cache, so that all three stay right after any number of switches.

kvviz's own layers keep their positions (`KvvizLayer.held_positions`). transformers' layers keep what they
were fed, in order, or the newest part of it (a sliding window): filled by the run itself that is tokens
0, 1, 2, ...; filled by a live switch, the positions the old cache held (`Carried`) and then every token
fed since.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvviz.files.trace import SlotState


@dataclass(frozen=True)
class Carried:
    """What a live switch put into a transformers layer: the positions of the keys it moved, ``[kv_heads or 1,
    moved]`` in key order (one row when every KV head held the same), and `since`, the tokens seen then."""

    positions: torch.Tensor
    since: int

    def fed(self, total: int) -> torch.Tensor:
        """Positions of everything the layer was fed, in order, once `total` tokens are seen ``[rows, n]``."""
        later = torch.arange(self.since, total).expand(self.positions.shape[0], -1)
        return torch.cat([self.positions, later], dim=-1)


def carried(positions: torch.Tensor, seen: int) -> Carried | None:
    """What a switch carries into a transformers layer; None when the moved keys are tokens 0 .. seen-1 in every
    KV head, which is what the layer's own filling would give."""
    positions = positions.cpu()
    if positions.shape[-1] == seen and bool((positions == torch.arange(seen)).all()):
        return None
    return Carried(positions, seen)


def fed_positions(carried_in: Carried | None, total: int) -> torch.Tensor:
    """Positions of everything a transformers layer was fed, in order, once `total` tokens are seen ``[rows, n]``."""
    return torch.arange(total)[None] if carried_in is None else carried_in.fed(total)


def run_lengths(values: torch.Tensor) -> list[list[int]]:
    """``[value, count]`` pairs of the runs of equal values in a 1-D tensor."""
    kinds, counts = torch.unique_consecutive(values, return_counts=True)
    # lists first: reading hundreds of runs element by element from tensors cost ~1 ms
    return [list(pair) for pair in zip(kinds.tolist(), counts.tolist(), strict=True)]


def spans(positions: torch.Tensor, states: list[tuple[SlotState, int]],
          seen: int) -> tuple[list[list[int]], list[list[int]] | None]:
    """The cache map of one layer: slot-state spans over positions 0 .. seen-1, and, where KV heads hold different
    positions, spans of how many KV heads hold each position (None where every head holds the same).

    `positions` ``[kv_heads or 1, held]``: the position of each held key (past `seen` in a slot that holds none: the
    padding of KV heads that hold fewer than others); `states`: run-length pairs giving the state of the held keys in
    key order (the same in every head). A position no head holds is EVICTED.
    """
    positions = positions.cpu()
    held = (positions < seen).reshape(-1)
    kept = positions.reshape(-1)[held]
    state = torch.full((seen,), int(SlotState.EVICTED), dtype=torch.int8)
    entries = torch.tensor([int(s) for s, _ in states], dtype=torch.int8).repeat_interleave(
        torch.tensor([n for _, n in states]))
    state[kept] = entries.repeat(positions.shape[0])[held]
    if not bool((positions != positions[:1]).any()):
        return run_lengths(state), None
    holders = torch.zeros(seen, dtype=torch.long).index_add_(0, kept, torch.ones(kept.numel(), dtype=torch.long))
    return run_lengths(state), run_lengths(holders)
