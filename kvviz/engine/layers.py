"""Cache layers that transformers lacks, written on its `CacheLayerMixin` API."""

from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicSlidingWindowLayer

from kvviz.files.trace import SlotState


class KvvizLayer(CacheLayerMixin):
    """A cache layer of kvviz's own: `keys` and `values` hold what it keeps, and it knows the position of the token
    behind each kept key (`kvviz.engine.held_positions`), so that `measure.py` can draw it without knowing the class
    and a live switch can hand those positions on."""

    def held_positions(self) -> torch.Tensor:
        """Positions of the held keys, ``[kv_heads or 1, held]`` (batch row 0; one row stands for every KV head), in
        key order."""
        raise NotImplementedError

    def held_slots(self) -> list[tuple[SlotState, int]]:
        """Run-length pairs (state, count) giving what each held key is on the cache map, in key order."""
        return [(SlotState.FULL, self.get_seq_length())]

    def tokens_held(self) -> int:
        """Tokens each KV head holds (on average, where heads hold different numbers: AdaKV)."""
        return self.get_seq_length()

    def held_states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values held, ``[batch, kv_heads, held, head_dim]`` at full width, in key order (what a live
        switch moves to another cache)."""
        return self.keys, self.values

    def attended_positions(self, n_keys: int, total: int) -> torch.Tensor:
        """Absolute positions of the `n_keys` keys the last `update()` returned, ``[kv_heads or 1, n_keys]``,
        once `total` positions are numbered (what the attention view draws them at)."""
        raise NotImplementedError

    def receive(self, key_states: torch.Tensor, value_states: torch.Tensor, positions: torch.Tensor,
                seen: int) -> None:
        """A live switch fills this empty layer with what another cache held: keys and values ``[batch, kv_heads,
        n, head_dim]`` of the tokens at `positions` ``[kv_heads or 1, n]``, once `seen` tokens were processed."""
        raise NotImplementedError

    def policy_tensors(self) -> tuple[torch.Tensor | None, ...]:
        """What the layer's policy keeps beside keys and values (its bookkeeping), measured as its own bytes."""
        return ()

    def take_scoring_ms(self) -> float | None:
        """Milliseconds spent choosing what to keep since the last call; None for layers that choose nothing."""
        return None


def rotation(shift: int | torch.Tensor, inv_freq: torch.Tensor, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The cosines and sines, in float32 on `device`, of a move by `shift` positions (`rotate_keys`), the sines of
    the first half negated: rotate_half pairs each channel of the first half with the negated second half. A tensor
    of shifts ``[n]`` gives one move per row, ``[n, channels]``, for the rows of what is rotated."""
    shift = torch.as_tensor(shift, dtype=torch.float32, device=device)
    angle = shift[..., None] * inv_freq.to(device=device, dtype=torch.float32)
    return torch.cat((angle.cos(), angle.cos()), dim=-1), torch.cat((-angle.sin(), angle.sin()), dim=-1)


def rotate_keys(keys: torch.Tensor, shift: int, inv_freq: torch.Tensor,
                turn: tuple[torch.Tensor, torch.Tensor] | None = None, out: torch.Tensor | None = None
                ) -> torch.Tensor:
    """Move RoPE-rotated keys by `shift` positions (negative: towards the start); `turn`: its `rotation`, if kept;
    written into `out` (of the keys' shape and dtype) where given.

    Rotations compose, R(p + shift) = R(shift) R(p), so applying the rotation of `shift` to a key
    rotated for position p gives the key for position p + shift. Uses the rotate-half pairing of
    transformers' `apply_rotary_pos_emb`, ``x * cos + rotate_half(x) * sin``; with partial rotary embeddings only
    the first ``2 * len(inv_freq)`` channels rotate. Computed in float32 and cast back.
    """
    rotary_dim = 2 * inv_freq.numel()
    half = rotary_dim // 2
    cos, sin = turn or rotation(shift, inv_freq, keys.device)
    out = torch.empty_like(keys) if out is None else out
    rot = keys[..., :rotary_dim].float()
    # rotate_half(x) * sin without building rotate_half(x) = (-second half, first half): (-a) * s is a * (-s) to the
    # bit, so each half is multiplied in place by its signed sines
    turned = torch.empty_like(rot)
    torch.mul(rot[..., half:], sin[..., :half], out=turned[..., :half])
    torch.mul(rot[..., :half], sin[..., half:], out=turned[..., half:])
    rotated = out[..., :rotary_dim] if out.dtype == torch.float32 else torch.empty_like(rot)
    torch.mul(rot, cos, out=rotated).add_(turned)
    if rotated.dtype != out.dtype:
        out[..., :rotary_dim] = rotated
    if rotary_dim < keys.shape[-1]:
        out[..., rotary_dim:] = keys[..., rotary_dim:]
    return out


class SinkLayer(KvvizLayer):
    """StreamingLLM attention sinks: keep the first `sink_tokens` and the most recent `window`.

    Keys and values have shape ``[batch, kv_heads, held, head_dim]`` with ``held <= sink_tokens +
    window``. Each step attends to everything held plus the new tokens; then the oldest non-sink
    tokens are evicted and the kept recent keys are re-rotated down by the number evicted, so
    that positions inside the cache stay contiguous (as in the paper and transformers' former
    `SinkCache`). `get_seq_length` is the number held, so the model numbers new tokens from there.
    """

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, sink_tokens: int, window: int, inv_freq: torch.Tensor):
        super().__init__()
        self.sink_tokens = sink_tokens
        self.window = window
        self.inv_freq = inv_freq
        self.evicted = 0  # tokens dropped so far
        self.turns: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # `rotation` by shift: a step's is always -1

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.keys = key_states.new_empty((*key_states.shape[:2], 0, key_states.shape[-1]))
        self.values = value_states.new_empty((*value_states.shape[:2], 0, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        full_keys = torch.cat([self.keys, key_states], dim=-2)
        full_values = torch.cat([self.values, value_states], dim=-2)
        drop = full_keys.shape[-2] - (self.sink_tokens + self.window)
        if drop > 0:
            start = self.sink_tokens + drop
            if -drop not in self.turns:
                self.turns[-drop] = rotation(-drop, self.inv_freq, full_keys.device)
            # the sinks, then the recent keys rotated straight into their place: no copy of them between
            self.keys = full_keys.new_empty((*full_keys.shape[:2], full_keys.shape[-2] - drop, full_keys.shape[-1]))
            self.keys[:, :, : self.sink_tokens] = full_keys[:, :, : self.sink_tokens]
            rotate_keys(full_keys[:, :, start:], -drop, self.inv_freq, self.turns[-drop],
                        out=self.keys[:, :, self.sink_tokens :])
            self.values = torch.cat([full_values[:, :, : self.sink_tokens], full_values[:, :, start:]], dim=-2)
            self.evicted += drop
        else:
            self.keys, self.values = full_keys, full_values
        return full_keys, full_values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def held_positions(self) -> torch.Tensor:
        held = self.get_seq_length()
        sinks = min(self.sink_tokens, held)
        seen = self.evicted + held
        return torch.cat([torch.arange(sinks), torch.arange(seen - (held - sinks), seen)])[None]

    def held_slots(self) -> list[tuple[SlotState, int]]:
        held = self.get_seq_length()
        sinks = min(self.sink_tokens, held)
        return [(SlotState.SINK, sinks), (SlotState.FULL, held - sinks)]

    def attended_positions(self, n_keys: int, total: int) -> torch.Tensor:
        sinks = min(self.sink_tokens, n_keys)
        return torch.cat([torch.arange(sinks), torch.arange(total - (n_keys - sinks), total)])[None]

    def receive(self, key_states, value_states, positions, seen) -> None:
        # a sink cache needs the first tokens, so a switch fills it only from a cache that has dropped none
        # (`convert.refusal`): the keys are tokens 0 .. seen-1, which update() evicts from and renumbers as at a prefill
        self.update(key_states, value_states)

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def get_max_length(self) -> int:
        return self.sink_tokens + self.window

    def reset(self) -> None:
        self.keys = self.values = None
        self.is_initialized = False
        self.evicted = 0


class WindowedFullAttentionLayer(DynamicSlidingWindowLayer):
    """A full-attention layer whose cache keeps only the most recent `sliding_window` tokens.

    transformers' `DynamicSlidingWindowLayer` with `is_sliding` False: the model builds one
    attention mask per attention type from the first layer of that type, so on hybrid models the
    windowed full-attention layers must be found as full attention to get their own mask sizes.
    """

    is_sliding = False
