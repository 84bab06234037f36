"""The cache layer that keeps fewer key channels (ThinK: kvviz.engine.strategies.think says which and why), on
transformers' cache-layer API; the strategy module imports this one only when it builds a cache.

A `ChannelLayer` keeps every token. The prompt's keys are kept with only the channels its queries use most
(``pruned``, ``[batch, kv_heads, prompt, kept channels]``), beside the indices of those channels (``channels``,
``[batch, kv_heads, kept channels]``, int64: the policy's state); keys fed after the prompt are kept whole
(``later``), as kvpress's ThinKPress prunes only the prefill's. Values are kept whole. Attention sees every key at
full width, the pruned channels zero (what kvpress computes with), rebuilt for each feed and dropped after it, so the
memory saving is real: keys cost (head_dim - pruned) / head_dim of their bytes for the prompt.

The channels are chosen once the prompt's attention ran (`attended`, called by kvviz's attention function): per KV
head, channel c scores mean(q_c^2) over the last `window` queries (averaged over the query heads of the KV head)
times mean(k_c^2) over the prompt's keys, and the lowest `int(head_dim * share)` go.
"""

from __future__ import annotations

import time

import torch

from kvviz.engine import attention_scores
from kvviz.engine.layers import KvvizLayer


class ChannelLayer(KvvizLayer):
    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, index: int, share: float, window: int):
        super().__init__()
        self.index = index
        self.share = share  # of the key channels pruned
        self.window = window
        self.reset()

    # -- the cache-layer API -----------------------------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.later = key_states.new_empty((*key_states.shape[:2], 0, key_states.shape[-1]))
        self.values = value_states.new_empty((*value_states.shape[:2], 0, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        full_keys = torch.cat([self.whole_keys(), key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        self.seen += key_states.shape[-2]
        if self.channels is None:  # the prompt: kept whole until its attention chooses the channels
            self.later = full_keys
            attention_scores.expect(self.index, full_keys, self)
        else:
            self.later = torch.cat([self.later, key_states], dim=-2)
        self.keys = (self.pruned, self.later)
        return full_keys, self.values

    def attended(self, layer_index: int, query, key, mask, scaling: float) -> None:
        started = time.perf_counter()
        batch, heads, new, dim = query.shape
        kv_heads = key.shape[1]
        observed = query[:, :, -min(self.window, new):]
        queries = observed.pow(2).mean(dim=2).view(batch, kv_heads, heads // kv_heads, dim).mean(dim=2)
        scores = queries * key.pow(2).mean(dim=2)  # [batch, kv_heads, dim]
        pruned = int(dim * self.share)
        dropped = scores.topk(pruned, dim=-1, largest=False).indices
        kept = torch.ones_like(scores, dtype=torch.bool).scatter(-1, dropped, False)
        self.channels = kept.nonzero()[:, -1].view(batch, kv_heads, dim - pruned).clone()  # not a view of all three
        self.pruned = key.gather(-1, self.channels[:, :, None, :].expand(-1, -1, key.shape[2], -1))
        self.later = key.new_empty((*key.shape[:2], 0, dim))  # not a view: it would keep the whole keys alive
        self.keys = (self.pruned, self.later)
        self.scoring_ms += (time.perf_counter() - started) * 1000.0

    def whole_keys(self) -> torch.Tensor:
        """Every held key at full width ``[batch, kv_heads, held, head_dim]``, the pruned channels zero."""
        if self.pruned is None:
            return self.later
        prompt = self.pruned.new_zeros((*self.pruned.shape[:3], self.later.shape[-1]))
        prompt.scatter_(-1, self.channels[:, :, None, :].expand_as(self.pruned), self.pruned)
        return torch.cat([prompt, self.later], dim=-2)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return 0 if self.values is None else self.values.shape[-2]

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.keys = self.values = self.later = self.pruned = self.channels = None
        self.is_initialized = False
        self.seen = 0
        self.moved: torch.Tensor | None = None  # positions of what a live switch moved in [kv_heads or 1, n]
        self.moved_seen = 0  # tokens seen when it did (every token fed since is held too)
        self.scoring_ms = 0.0

    # -- what kvviz reads --------------------------------------------------------------------------

    def held_positions(self) -> torch.Tensor:
        fed = torch.arange(self.moved_seen, self.seen)[None]
        return fed if self.moved is None else torch.cat([self.moved, fed.expand(self.moved.shape[0], -1)], dim=-1)

    def attended_positions(self, n_keys: int, total: int) -> torch.Tensor:
        return self.held_positions()  # every token held is attended to

    def held_states(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.whole_keys(), self.values

    def receive(self, key_states, value_states, positions, seen) -> None:
        # what a switch moves in is the prompt: the next feed's attention chooses the channels of all of it
        self.reset()
        self.lazy_initialization(key_states, value_states)
        self.later, self.values, self.seen = key_states, value_states, seen
        self.moved, self.moved_seen = positions.cpu(), seen
        self.keys = (self.pruned, self.later)

    def policy_tensors(self) -> tuple[torch.Tensor | None, ...]:
        return (self.channels,)

    def take_scoring_ms(self) -> float | None:
        spent, self.scoring_ms = self.scoring_ms, 0.0
        return spent

    def zeroed_channels(self) -> list[list[int]] | None:
        """Per KV head (batch row 0), the key channels pruned from the prompt's keys, sorted; None before."""
        if self.channels is None:
            return None
        dim = self.later.shape[-1]
        return [sorted(set(range(dim)) - set(row.tolist())) for row in self.channels[0]]
