"""The cache layer that keeps a budget of tokens chosen by importance: the mechanism here, each policy's scores and
reasons in its strategy module (kvviz.engine.strategies.h2o, tova, ...: a `Scorer`), which imports this one only when
it builds a cache, so that listing the strategies needs no transformers.

An `EvictionLayer` holds keys and values ``[batch, kv_heads, held, head_dim]`` and, beside them, the
absolute position of every token each KV head holds (``positions``, ``[batch, kv_heads, held]``). Policies
that choose per KV head keep different positions in different heads, the same number in each, so the
tensors stay rectangular; kept tokens are gathered into new, smaller tensors (real memory reduction). The
positions, those of the keys the latest `update()` returned and a scorer's own per-token state are its
bookkeeping (`policy_tensors`): measured apart from keys and values, as the policy's state.

Each feed goes like this: `update()` appends the new tokens and returns everything held plus them, so this
step attends to all of them; then the layer's schedule (`strategies.eviction.Schedule`) says whether this feed
compresses and to how many tokens. A scorer that needs no attention (key norm) chooses at once in `appended()`. One
that needs it asks `attention_scores.expect()` and chooses in `attended()`, called by kvviz's attention function right
after the layer's attention ran (H2O asks at every feed: its sums grow below the budget too). The choice: the scorer's
scores ``[batch, kv_heads or 1, held]`` (one row: one choice for every KV head, TOVA's), weighted by the value norms
through the output projection first where `critical` (CriticalKV), then the top `target` per row, or whole chunks
(`chunk`: ChunkKV). Tokens a policy always keeps (a window, sinks) score one more than the highest other score, as
kvpress writes it, so that a chunk or a head budget counts them the same way.

A live switch fills a layer with `receive()`, which keeps what it is given at the positions it is given; the choice
comes with the next feed, from that feed's attention. Kept keys keep their RoPE rotation: nothing is renumbered, so
the caller numbers new tokens (position ids), and `get_seq_length()` is the number held, which makes transformers'
causal mask right for the new tokens (offset 0: every held token is older than every new one).

Time spent scoring and choosing is added up per layer and read with `take_scoring_ms()`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from kvviz.engine import attention_scores
from kvviz.engine.layers import KvvizLayer
from kvviz.engine.scorers import (
    ADAPTIVE_SAFEGUARD,
    CRITICAL_EPSILON,
    CRITICAL_FIRST_STAGE,
    Schedule,
    ScheduleState,
    Scorer,
    chunk_kept,
)

PAD = 2**62  # the position of a padding slot of a ragged layer laid out as a rectangle: past any position


class EvictionLayer(KvvizLayer):
    """Keeps what its scorer ranks highest, when its schedule says (see the module docstring)."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, index: int, scorer: Scorer, schedule: Schedule, chunk: int = 0,
                 critical: torch.Tensor | None = None, adaptive: bool = False):
        super().__init__()
        self.index = index  # the decoder layer this cache layer belongs to (attention requests name it)
        self.scorer = scorer
        self.schedule = schedule
        self.chunk = chunk  # ChunkKV's chunk length (0: single tokens)
        self.output_weight = critical  # CriticalKV: the attention's output projection weight (None: not critical)
        self.adaptive = adaptive  # AdaKV: the budget shared among the KV heads, which then hold different numbers
        # ragged (after an adaptive choice): tokens each batch row's KV heads hold [batch, kv_heads], their keys,
        # values, positions and token state laid end to end ([held tokens of every head, ...]); None: rectangular
        self.lengths: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None  # during a ragged feed: the slots of the returned keys that hold tokens
        self.state = ScheduleState()
        self.positions: torch.Tensor | None = None  # [batch, kv_heads, held], absolute positions
        self.fed_positions: torch.Tensor | None = None  # positions of the keys the last update() returned
        self.token_state: dict[str, torch.Tensor] = {}  # [batch, kv_heads, held, ...]: what follows the kept tokens
        self.position_ids: torch.Tensor | None = None  # of the last feed, as the model numbered it (when it says)
        self.seen = 0  # positions numbered so far
        self.target: int | None = None  # tokens to keep once this feed's attention arrives (None: no choice)
        self.unscored = 0  # feeds since the last time attention arrived
        self.scoring_ms = 0.0
        self.stopped = False  # `stop()`: evicts no more, only appends

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
        if self.lengths is not None:  # ragged: laid out as a rectangle for this feed's attention
            laid_out = self.lay_out()
            self.valid = torch.cat([laid_out, laid_out.new_ones((batch, kv_heads, new))], dim=-1)
        fresh = torch.arange(self.seen, self.seen + new, device=self.device).expand(batch, kv_heads, new)
        full_keys = torch.cat([self.keys, key_states], dim=-2)
        full_values = torch.cat([self.values, value_states], dim=-2)
        self.keys, self.values = full_keys, full_values
        self.positions = self.fed_positions = torch.cat([self.positions, fresh], dim=-1)
        self.position_ids = (kwargs.get("kwargs") or {}).get("position_ids")
        self.seen += new
        self.appended(new)
        return full_keys, full_values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        """Key slots the next feed's attention sees before its own tokens (a ragged layer's longest head)."""
        if self.keys is None:
            return 0
        return int(self.lengths.max()) if self.keys.dim() == 2 else self.keys.shape[-2]

    def tokens_held(self) -> int:
        if self.keys is not None and self.keys.dim() == 2:  # ragged: the same total as a rectangle of the budget
            return self.keys.shape[0] // self.lengths.numel()
        if self.valid is not None:
            return int(self.valid.sum()) // (self.valid.shape[0] * self.valid.shape[1])
        return self.get_seq_length()

    @property
    def key_mask(self) -> torch.Tensor | None:
        """During a ragged feed, which key slots hold tokens ``[batch, kv_heads, keys]`` (the padding is masked out
        of attention: `attention_scores.sdpa_with_scores`); None otherwise."""
        return self.valid

    def lay_out(self) -> torch.Tensor:
        """Lay the ragged storage out as rectangles ``[batch, kv_heads, longest, ...]``, each head's tokens last and
        padding before them (zeros, at position PAD), so that every head's newest tokens share the last slots;
        returns which slots hold tokens."""
        batch, kv_heads = self.lengths.shape
        valid = self.valid_slots()
        longest = valid.shape[-1]
        slots = valid.reshape(-1).nonzero()[:, 0]  # each stored token's slot, found once for every tensor

        def rectangle(flat: torch.Tensor, fill) -> torch.Tensor:
            out = flat.new_full((batch * kv_heads * longest, *flat.shape[1:]), fill)
            return out.index_copy_(0, slots, flat).view(batch, kv_heads, longest, *flat.shape[1:])

        self.keys, self.values = rectangle(self.keys, 0), rectangle(self.values, 0)
        self.positions = rectangle(self.positions, PAD)
        self.token_state = {name: rectangle(tensor, 0) for name, tensor in self.token_state.items()}
        return valid

    def drop_newest(self, n: int) -> None:
        """Forget the `n` newest tokens (KVzip's reading again, whose keys are not the context's)."""
        self.keys, self.values = self.keys[:, :, :-n].clone(), self.values[:, :, :-n].clone()
        self.positions = self.fed_positions = self.positions[..., :-n].clone()
        self.seen -= n

    def keep_ragged(self, kept: torch.Tensor) -> None:
        """Keep the slots where `kept` ``[batch, kv_heads, slots]``, each head its own number, laid end to end."""
        slots = kept.reshape(-1).nonzero()[:, 0]  # found once for every tensor (a boolean index finds them each time)

        def laid_end_to_end(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.reshape(-1, *tensor.shape[3:]).index_select(0, slots)

        self.keys, self.values = laid_end_to_end(self.keys), laid_end_to_end(self.values)
        self.positions = laid_end_to_end(self.positions)
        self.token_state = {name: laid_end_to_end(tensor) for name, tensor in self.token_state.items()}
        self.lengths = kept.sum(dim=-1)
        self.valid = self.fed_positions = None

    def get_max_length(self) -> int:
        schedule = self.schedule  # the most it holds after a compression; -1 where it grows between them
        return -1 if not schedule.interval or schedule.fraction else max(schedule.budget, schedule.target)

    def reset(self) -> None:
        self.keys = self.values = self.positions = self.fed_positions = self.position_ids = None
        self.lengths = self.valid = None
        self.is_initialized = False
        self.token_state = {}
        self.state = ScheduleState()
        self.seen = self.unscored = 0
        self.target = None
        self.scoring_ms = 0.0
        self.stopped = False

    def receive(self, key_states, value_states, positions, seen) -> None:
        self.lazy_initialization(key_states, value_states)
        batch, kv_heads, n = key_states.shape[:3]
        self.keys, self.values = key_states, value_states
        self.positions = positions.to(self.device).expand(batch, kv_heads, n).contiguous()
        self.token_state = {}
        self.state = ScheduleState()  # what it was given is its prompt: the next feed compresses it
        self.seen = seen

    def stop(self) -> None:
        """Evict no more: from now on the layer appends what it is fed to what it holds (a ragged layer still masks
        its padding in attention). The scorer's state per token is dropped: nothing reads it any more."""
        self.stopped = True
        self.token_state = {}
        self.target = None

    # -- the choice --------------------------------------------------------------------------------

    def appended(self, new: int) -> None:
        """Called by `update()` once `new` tokens were appended: choose now, or ask for attention."""
        if self.stopped:
            if self.valid is not None:
                self.ask_for_attention()
            return
        self.scorer.appended(self, new)
        if self.output_weight is not None:
            self._add_output_norms()
        self.target = self.schedule.compress_to(self.state, self.index, self.tokens_held(), new, self.seen)
        # a ragged layer's padding must be masked out of attention, and its storage laid end to end again after it
        attention = self.scorer.every_feed or (self.target is not None and self.scorer.reads_attention)
        if attention or self.valid is not None:
            self.ask_for_attention()
        elif self.target is not None:
            with self.timed():
                self.keep_top(self.scorer.scores(self, None, None, None, 1.0))

    def attended(self, layer_index: int, query, key, mask, scaling: float) -> None:
        self.unscored = 0
        with self.timed():
            if self.scorer.every_feed and not self.stopped:
                self.scorer.observe(self, query, key, mask, scaling)
            if self.target is not None:
                self.keep_top(self.scorer.scores(self, query, key, mask, scaling))
            elif self.valid is not None:
                self.keep_ragged(self.valid)

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

    def keep_top(self, scores: torch.Tensor) -> None:
        """Keep the `target` tokens the scores rank highest (as chunks where `chunk`), the output norms first
        weighing them where `critical`."""
        target, self.target = self.target, None
        norms = self.token_state.get("output_norms")
        if self.adaptive:
            valid = self.valid if self.valid is not None else torch.ones_like(self.positions, dtype=torch.bool)
            scores = scores.expand(valid.shape).masked_fill(~valid, float("-inf"))
            self.keep_ragged(adaptive_kept(scores, target, norms, valid))
            return
        if norms is not None:
            scores = critical_scores(scores, norms, target)
        if self.chunk:
            self.keep(chunk_indices(scores, target, self.chunk))
        elif scores.shape[-1] == target + 1:  # one token goes (a decoding step): cheaper than a top-k
            self.drop(scores.argmin(dim=-1, keepdim=True))
        else:
            self.keep(top_indices(scores, target))

    def _add_output_norms(self) -> None:
        """CriticalKV's per-token weights of the tokens that have none yet (those just fed, or all that a live switch
        moved in): the L1 norm of each value through the output projection, averaged over the query heads of its KV
        head (kvpress's `vwl1norm`), kept as they enter."""
        before = self.token_state.get("output_norms")
        values = self.values[:, :, 0 if before is None else before.shape[-1] :]
        batch, kv_heads, _, head_dim = values.shape
        heads = self.output_weight.shape[1] // head_dim
        group = heads // kv_heads
        # o_proj: hidden = W @ concat(heads); head h's block maps its head_dim channels to the hidden size
        weight = self.output_weight.t().reshape(kv_heads, group, head_dim, -1).to(values.dtype)
        norms = torch.einsum("bktd,kgdh->bkgth", values, weight).abs().sum(dim=-1).mean(dim=2)
        self.token_state["output_norms"] = norms if before is None else torch.cat([before, norms], dim=-1)

    @contextmanager
    def timed(self):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.scoring_ms += (time.perf_counter() - started) * 1000.0

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the held tokens at `index` ``[batch, kv_heads or 1, kept]`` in each KV head.

        Every row selects from the heads laid end to end, which copies only what is kept: faster than `gather` with
        an expanded index, and than selecting along the token axis (45 against 17 microseconds for 500 tokens of 3
        KV heads here). Every per-token tensor in `token_state` goes along.
        """
        batch, kv_heads, held = self.positions.shape
        names = ("keys", "values", "positions")
        tensors = {name: getattr(self, name) for name in names} | self.token_state
        index = index.expand(batch, kv_heads, index.shape[-1])  # one row per layer: the same in every head
        heads = torch.arange(batch * kv_heads, device=index.device).view(batch, kv_heads, 1)
        flat = (index + heads * held).view(-1)
        kept = {name: tensor.reshape(batch * kv_heads * held, -1).index_select(0, flat).view(
            *index.shape, *tensor.shape[3:]) for name, tensor in tensors.items()}
        for name in names:
            setattr(self, name, kept.pop(name))
        self.token_state = kept

    def drop(self, index: torch.Tensor) -> None:
        """Drop one held token per KV head, at `index` ``[batch, kv_heads or 1, 1]`` (a decoding step)."""
        stays = torch.arange(self.positions.shape[-1] - 1, device=index.device)
        self.keep(stays + (stays >= index))

    # -- what kvviz reads --------------------------------------------------------------------------

    def take_scoring_ms(self) -> float | None:
        spent, self.scoring_ms = self.scoring_ms, 0.0
        return spent

    def held_positions(self) -> torch.Tensor:
        if self.positions.dim() == 1:  # ragged: each head's positions, padded at the front with PAD
            return self.positions.new_full(self.valid_slots().shape, PAD).masked_scatter(self.valid_slots(),
                                                                                         self.positions)[0]
        return self.positions[0]

    def valid_slots(self) -> torch.Tensor:
        """Of a ragged layer laid out as a rectangle, the slots that hold tokens ``[batch, kv_heads, longest]``."""
        longest = int(self.lengths.max())
        return torch.arange(longest, device=self.device) >= (longest - self.lengths)[..., None]

    def attended_positions(self, n_keys: int, total: int) -> torch.Tensor:
        return self.fed_positions[0]

    def policy_tensors(self) -> tuple[torch.Tensor | None, ...]:
        return (self.positions, self.fed_positions, self.lengths, *self.token_state.values())

    def query_positions(self, new: int) -> torch.Tensor:
        """Position ids of the last feed's `new` tokens ``[1, new]``: as the model numbered them when it said so,
        else the positions seen (they are the same unless an earlier cache renumbered: attention sinks)."""
        if self.position_ids is not None:
            return self.position_ids[:1, -new:]
        return torch.arange(self.seen - new, self.seen, device=self.device)[None]


def top_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the `k` highest scores along the last axis, in ascending order (kept tokens stay in order)."""
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values


def chunk_indices(scores: torch.Tensor, target: int, chunk: int) -> torch.Tensor:
    """ChunkKV's choice: the held tokens in key order cut into chunks of `chunk` from the oldest; the newest partial
    chunk (still filling) kept, and of the whole chunks the best by their mean score summed over KV heads, as many as
    kvpress keeps for `target` (`scorers.chunk_kept`); the same chunks in every KV head ``[batch, 1,
    kept]``."""
    batch, _, held = scores.shape
    whole = held // chunk
    kept_chunks = (chunk_kept(held, target, chunk) - held % chunk) // chunk
    chunk_scores = scores[..., : whole * chunk].sum(dim=1).view(batch, whole, chunk).mean(dim=-1)
    best = chunk_scores.topk(kept_chunks, dim=-1).indices.sort(dim=-1).values  # [batch, kept chunks]
    tokens = (best[..., None] * chunk + torch.arange(chunk, device=scores.device)).flatten(1)
    partial = torch.arange(whole * chunk, held, device=scores.device).expand(batch, -1)
    return torch.cat([tokens, partial], dim=-1)[:, None]


def critical_scores(scores: torch.Tensor, norms: torch.Tensor, target: int) -> torch.Tensor:
    """CriticalKV's two stages (kvpress's `CriticalKVPress.score`): the `target * CRITICAL_FIRST_STAGE` best by the
    scores alone are kept whatever follows; the rest are ranked by the scores weighted by the value norms through the
    output projection (`norms`, ``[batch, kv_heads, held]``)."""
    scores = scores.expand_as(norms)
    first = max(1, int(target * CRITICAL_FIRST_STAGE))
    chosen = scores.topk(first, dim=-1).indices
    weighted = (scores + CRITICAL_EPSILON) * norms
    return weighted.scatter(-1, chosen, torch.finfo(weighted.dtype).max)


def adaptive_kept(scores: torch.Tensor, target: int, norms: torch.Tensor | None, valid: torch.Tensor) -> torch.Tensor:
    """AdaKV's choice (kvpress's `AdaKVPress`, with `norms` its `CriticalAdaKVPress`): which slots of ``[batch,
    kv_heads, slots]`` to keep, `target` per KV head on average. Each head's best `ADAPTIVE_SAFEGUARD` share of the
    target is kept first; then the worst of all heads together are dropped, `kv_heads * target` kept in all. Scores
    of padding slots (not `valid`) are -inf: they go first."""
    batch, kv_heads, slots = scores.shape
    top = torch.finfo(scores.dtype).max
    safe = max(1, int(target * ADAPTIVE_SAFEGUARD))
    scores = scores.scatter(-1, scores.topk(safe, dim=-1).indices, top)
    if norms is not None:  # CriticalKV per head: each head's budget, half of it by the scores, the rest weighted
        chosen = scores.reshape(batch, -1).topk(target * kv_heads, dim=-1).indices // slots
        budgets = torch.bincount(chosen.flatten(), minlength=kv_heads)  # one batch row, as kvpress
        first = (budgets * CRITICAL_FIRST_STAGE).long().tolist()
        best = scores.topk(max(first), dim=-1, sorted=True).indices
        for head, count in enumerate(first):
            scores[:, head].scatter_(-1, best[:, head, :count], top)
        scores = ((scores + CRITICAL_EPSILON) * norms).masked_fill(~valid, float("-inf"))
        best = scores.topk(int(budgets.max()), dim=-1, sorted=True).indices
        for head, count in enumerate(budgets.tolist()):
            scores[:, head].scatter_(-1, best[:, head, :count], top)
    pruned = (-scores.reshape(batch, -1)).topk(kv_heads * (slots - target), dim=1).indices
    return torch.ones((batch, kv_heads * slots), dtype=torch.bool, device=scores.device).scatter(
        1, pruned, False).view(batch, kv_heads, slots)
