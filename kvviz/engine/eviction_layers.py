"""Cache layers that keep a budget of tokens chosen by importance (H2O, TOVA, SnapKV, key norm): the mechanism here,
each policy's reasons in its strategy module (kvviz.engine.strategies.h2o, ...), which imports this one only when
it builds a cache, so that listing the strategies needs no transformers.

An `EvictionLayer` holds keys and values ``[batch, kv_heads, held, head_dim]`` and, beside them, the
absolute position of every token each KV head holds (``positions``, ``[batch, kv_heads, held]``). Policies
that choose per KV head keep different positions in different heads, the same number in each, so the
tensors stay rectangular; kept tokens are gathered into new, smaller tensors (real memory reduction). The
positions, those of the keys the latest `update()` returned and a policy's own per-token scores are its
bookkeeping (`policy_tensors`): measured apart from keys and values, as the policy's state.

Each feed goes like this: `update()` appends the new tokens and returns everything held plus them, so this
step attends to all of them; then the policy chooses what to keep. A policy that needs no attention (key norm)
chooses at once in `appended()`. One that needs it asks `attention_scores.expect()` and chooses in `attended()`,
called by kvviz's attention function right after the layer's attention ran. A live switch fills a layer with
`receive()`, which keeps what it is given at the positions it is given; the choice comes with the next feed, from
that feed's attention. Kept keys keep their RoPE rotation: nothing is renumbered, so the caller numbers new tokens
(position ids), and `get_seq_length()` is the number held, which makes transformers' causal mask right for the
new tokens (offset 0: every held token is older than every new one).

Time spent scoring and choosing is added up per layer and read with `take_scoring_ms()`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from kvviz.engine import attention_scores
from kvviz.engine.attention_scores import attention_received
from kvviz.engine.layers import KvvizLayer


class EvictionLayer(KvvizLayer):
    """Keeps at most `budget` tokens per KV head; subclasses say which (see the module docstring)."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    token_state: tuple[str, ...] = ()  # attributes [batch, kv_heads, held, ...] that follow the kept tokens

    def __init__(self, index: int, budget: int):
        super().__init__()
        self.index = index  # the decoder layer this cache layer belongs to (attention requests name it)
        self.budget = budget
        self.positions: torch.Tensor | None = None  # [batch, kv_heads, held], absolute positions
        self.fed_positions: torch.Tensor | None = None  # positions of the keys the last update() returned
        self.seen = 0  # positions numbered so far
        self.unscored = 0  # feeds since the last time attention arrived
        self.scoring_ms = 0.0

    # -- the cache-layer API -----------------------------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        batch, kv_heads = key_states.shape[:2]
        self.keys = key_states.new_empty((batch, kv_heads, 0, key_states.shape[-1]))
        self.values = value_states.new_empty((batch, kv_heads, 0, value_states.shape[-1]))
        self.positions = torch.empty((batch, kv_heads, 0), dtype=torch.long, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        batch, kv_heads = key_states.shape[:2]
        fresh = torch.arange(self.seen, self.seen + new, device=self.device).expand(batch, kv_heads, new)
        full_keys = torch.cat([self.keys, key_states], dim=-2)
        full_values = torch.cat([self.values, value_states], dim=-2)
        self.keys, self.values = full_keys, full_values
        self.positions = self.fed_positions = torch.cat([self.positions, fresh], dim=-1)
        self.seen += new
        self.appended(new)
        return full_keys, full_values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def get_max_length(self) -> int:
        return self.budget

    def reset(self) -> None:
        self.keys = self.values = self.positions = self.fed_positions = None
        self.is_initialized = False
        self.seen = self.unscored = 0
        self.scoring_ms = 0.0

    def receive(self, key_states, value_states, positions, seen) -> None:
        self.lazy_initialization(key_states, value_states)
        batch, kv_heads, n = key_states.shape[:3]
        self.keys, self.values = key_states, value_states
        self.positions = positions.to(self.device).expand(batch, kv_heads, n).contiguous()
        self.seen = seen

    # -- what policies use -------------------------------------------------------------------------

    def appended(self, new: int) -> None:
        """Called by `update()` once `new` tokens were appended: choose now, or ask for attention."""
        raise NotImplementedError

    def choose(self, query: torch.Tensor, key: torch.Tensor, mask, scaling: float) -> None:
        """Keep what the policy keeps, from the attention the new queries paid to what `update()` returned
        (`query` and `key` as attention saw them; see `attention_scores.attention_received`)."""
        raise NotImplementedError

    def attended(self, layer_index: int, query, key, mask, scaling: float) -> None:
        self.unscored = 0
        with self.timed():
            self.choose(query, key, mask, scaling)

    def ask_for_attention(self) -> None:
        # a request stands for one forward (`attention_scores.one_forward`): one still unanswered at the next feed
        # means that attention never arrives
        if self.unscored:
            raise RuntimeError(
                "an attention-scored cache got no attention scores: the model's attention does not run through "
                f"kvviz's {attention_scores.NAME!r} function (use the strategy's make_cache, which installs it)"
            )
        self.unscored += 1
        attention_scores.expect(self.index, self.keys, self)

    @contextmanager
    def timed(self):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.scoring_ms += (time.perf_counter() - started) * 1000.0

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the held tokens at `index` ``[batch, kv_heads or 1, kept]`` in each KV head.

        One index row (a per-layer choice) selects along the token axis; per-head rows, or one row per batch
        row, select from the heads laid end to end, which copies only what is kept (faster than `gather` with an
        expanded index). Every per-token tensor named in `token_state` goes along.
        """
        names = ("keys", "values", "positions", *self.token_state)
        batch, kv_heads, held = self.positions.shape
        if index.shape[:2] == (1, 1) and batch == 1:
            row = index[0, 0]
            for name in names:
                setattr(self, name, getattr(self, name).index_select(2, row))
            return
        index = index.expand(batch, kv_heads, index.shape[-1])  # one row per layer: the same in every head
        heads = torch.arange(batch * kv_heads, device=index.device).view(batch, kv_heads, 1)
        flat = (index + heads * held).view(-1)
        for name in names:
            tensor = getattr(self, name)
            rows = tensor.reshape(batch * kv_heads * held, -1).index_select(0, flat)
            setattr(self, name, rows.view(*index.shape, *tensor.shape[3:]))

    def drop(self, index: torch.Tensor) -> None:
        """Drop one held token per KV head, at `index` ``[batch, kv_heads or 1, 1]`` (a decoding step)."""
        stays = torch.arange(self.positions.shape[-1] - 1, device=index.device)
        self.keep(stays + (stays >= index))

    def keep_best(self, scores: torch.Tensor) -> None:
        """Keep the `budget` tokens with the highest `scores` ``[batch, kv_heads or 1, held]``."""
        if scores.shape[-1] == self.budget + 1:
            self.drop(scores.argmin(dim=-1, keepdim=True))
        else:
            self.keep(top_indices(scores, self.budget))

    # -- what kvviz reads --------------------------------------------------------------------------

    def take_scoring_ms(self) -> float | None:
        spent, self.scoring_ms = self.scoring_ms, 0.0
        return spent

    def held_positions(self) -> torch.Tensor:
        return self.positions[0]

    def attended_positions(self, n_keys: int, total: int) -> torch.Tensor:
        return self.fed_positions[0]

    def policy_tensors(self) -> tuple[torch.Tensor | None, ...]:
        return (self.positions, self.fed_positions, *(getattr(self, name) for name in self.token_state))


def top_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the `k` highest scores along the last axis, in ascending order (kept tokens stay in order)."""
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values


# -- the policies (kvviz.engine.strategies.h2o, tova, snapkv, knorm say what each keeps and why) --------------


class H2OLayer(EvictionLayer):
    """H2O: per KV head, the tokens with the most attention summed since they entered, plus the most recent."""
    token_state = ("sums",)

    def __init__(self, index: int, budget: int, recent: int):
        super().__init__(index, budget)
        self.recent = recent
        self.sums: torch.Tensor | None = None  # [batch, kv_heads, held] accumulated attention, float32

    def appended(self, new: int) -> None:
        if self.sums is None:
            self.sums = torch.zeros(self.positions.shape, dtype=torch.float32, device=self.device)
        else:
            self.sums = F.pad(self.sums, (0, new))
        self.ask_for_attention()  # every step: the sums grow below the budget too

    def choose(self, query, key, mask, scaling) -> None:
        self.sums += attention_received(query, key, mask, scaling, last=query.shape[2]).sum(dim=2)
        held = self.sums.shape[-1]
        if held <= self.budget:
            return
        older = held - self.recent
        if held == self.budget + 1:  # a decoding step: the lightest older token of each head goes
            self.drop(self.sums[..., :older].argmin(dim=-1, keepdim=True))
            return
        heavy = top_indices(self.sums[..., :older], self.budget - self.recent)
        recent = torch.arange(older, held, device=self.device).expand(*heavy.shape[:2], self.recent)
        self.keep(torch.cat([heavy, recent], dim=-1))

    def reset(self) -> None:
        super().reset()
        self.sums = None


class TOVALayer(EvictionLayer):
    """TOVA: the tokens the newest query attends to most, averaged over every head: one choice per layer."""
    def appended(self, new: int) -> None:
        if self.get_seq_length() > self.budget:
            self.ask_for_attention()

    def choose(self, query, key, mask, scaling) -> None:
        if key.shape[-2] <= self.budget:
            return
        newest = attention_received(query, key, mask, scaling, last=1)  # [batch, kv_heads, group, keys]
        self.keep_best(newest.mean(dim=(1, 2)).unsqueeze(1))


POOLING = {"average": F.avg_pool1d, "max": F.max_pool1d}  # SnapKV's pooling over neighbouring positions


class SnapKVLayer(EvictionLayer):
    """SnapKV: the prompt cut once, by what its last queries attend to; later tokens all kept."""
    def __init__(self, index: int, budget: int, window: int, kernel: int, pooling: str = "average"):
        super().__init__(index, budget)
        self.window = window
        self.kernel = kernel
        self.pool = POOLING[pooling]
        self.compressed = False  # the prompt has been dealt with; everything after it is kept

    def appended(self, new: int) -> None:
        if self.compressed:
            return
        if self.get_seq_length() <= self.budget:
            self.compressed = True  # the prompt fits
        else:
            self.ask_for_attention()

    def choose(self, query, key, mask, scaling) -> None:
        new, held = query.shape[2], key.shape[-2]
        prompt = held if held == new else held - new  # a prefill, or the tokens a live switch fed
        observed = min(self.window, new)
        received = attention_received(query, key, mask, scaling, last=observed).mean(dim=2)
        candidates = received[..., : prompt - self.window]  # [batch, kv_heads, positions before the window]
        pooled = self.pool(candidates, kernel_size=self.kernel, stride=1, padding=self.kernel // 2)
        chosen = top_indices(pooled, self.budget - self.window)
        kept_tail = torch.arange(prompt - self.window, held, device=self.device).expand(*chosen.shape[:2], -1)
        self.keep(torch.cat([chosen, kept_tail], dim=-1))
        self.compressed = True

    def get_max_length(self) -> int:
        return -1  # decoded tokens are appended without limit

    def reset(self) -> None:
        super().reset()
        self.compressed = False


class KeyNormLayer(EvictionLayer):
    """Key norm: per KV head, the keys with the lowest L2 norm; needs no attention."""
    def appended(self, new: int) -> None:
        if self.get_seq_length() <= self.budget:
            return
        with self.timed():
            self.keep_best(-self.keys.float().norm(dim=-1))  # [batch, kv_heads, held]
