"""The size a cache should have, from the model config and the strategy alone.

Nothing here looks at a live cache: `measure.py` reads the real allocation, and the two are drawn
next to each other. `CachePredictor.after_step(n)` replays each strategy's storage rule (what it
allocates when a step adds n tokens) per layer and returns the bytes it should hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _kv_heads(config) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def layer_windows(config) -> list[int | None]:
    """Per decoder layer: its sliding window, or None for full attention."""
    config = config.get_text_config(decoder=True)
    layer_types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if layer_types is None:
        return [window] * config.num_hidden_layers
    return [window if kind in ("sliding_attention", "chunked_attention") else None for kind in layer_types]


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Keys plus values of one token across all layers, in the model's dtype."""
    config = config.get_text_config(decoder=True)
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * _kv_heads(config) * _head_dim(config) * element * config.num_hidden_layers


@dataclass
class Geometry:
    """What sizes every layer's cache: [batch, kv_heads, tokens, head_dim] of `element` bytes."""

    kv_heads: int
    head_dim: int
    element: int
    windows: list[int | None]
    batch: int = 1

    @classmethod
    def of(cls, config, dtype: torch.dtype) -> Geometry:
        text = config.get_text_config(decoder=True)
        return cls(
            kv_heads=_kv_heads(text),
            head_dim=_head_dim(text),
            element=torch.empty((), dtype=dtype).element_size(),
            windows=layer_windows(config),
        )

    @property
    def token_bytes(self) -> int:
        """Keys or values of one token in one layer."""
        return self.batch * self.kv_heads * self.head_dim * self.element


def quantized_bytes(geometry: Geometry, tokens: int, backend: str, nbits: int, group_size: int) -> int:
    """Keys or values of `tokens` tokens in one layer after quantization, with scales and zero points.

    quanto and HQQ pack `nbits` per element and keep one scale and one zero point (in the model's
    dtype) per group of `group_size` elements; HQQ packs 3-bit values ten to an int32. fp8 keeps one
    byte per element and a float32 scale per tensor.
    """
    if tokens == 0:
        return 0
    elements = geometry.batch * geometry.kv_heads * tokens * geometry.head_dim
    if backend == "fp8":
        return elements + 4
    groups = math.ceil(elements / group_size)
    if backend == "hqq" and nbits == 3:
        payload = math.ceil(groups / 10) * group_size * 4
    else:
        payload = math.ceil(elements * nbits / 8)
    return payload + 2 * groups * geometry.element


class CachePredictor:
    """Replays a strategy's allocation rule step by step.

    `after_step(new_tokens)` is called once per model forward with the number of tokens that
    forward fed, and returns the predicted cache bytes afterwards.
    """

    def __init__(self, strategy: str, options: dict, geometry: Geometry, capacity: int = 0):
        self.strategy = strategy
        self.options = options
        self.geometry = geometry
        self.capacity = capacity  # static caches: max_cache_len
        self.seen = 0
        layers = len(geometry.windows)
        self.stored = [0] * layers  # tokens of storage per layer (full precision)
        self.quantized = [0] * layers  # quantized tokens per layer
        self.residual = [0] * layers

    def after_step(self, new_tokens: int) -> int:
        g = self.geometry
        total = 0
        for i, native_window in enumerate(g.windows):
            total += 2 * self._layer(i, native_window, new_tokens)
        self.seen += new_tokens
        return total

    def _layer(self, i: int, native_window: int | None, new: int) -> int:
        """Bytes of keys (== values) in layer i after a step of `new` tokens."""
        g = self.geometry
        s = self.strategy
        if s == "none":
            return 0
        if s in ("static", "offloaded-static"):
            slots = self.capacity if native_window is None else min(native_window, self.capacity)
            return slots * g.token_bytes
        if s == "quantized":
            return self._quantized_layer(i, new)
        if s == "sink":
            held = min(self.seen + new, self.options["sink_tokens"] + self.options["window"])
            return held * g.token_bytes
        window = native_window
        if s == "sliding":
            window = self.options["window"] if window is None else min(window, self.options["window"])
        if window is None:  # DynamicLayer: one tensor of everything seen
            return (self.seen + new) * g.token_bytes
        # DynamicSlidingWindowLayer keeps a view of the last window-1 tokens into the
        # concatenation of what it held and the new tokens; that concatenation is the allocation.
        self.stored[i] = min(self.seen, window - 1) + new
        return self.stored[i] * g.token_bytes

    def _quantized_layer(self, i: int, new: int) -> int:
        o = self.options
        backend = o["backend"]
        if backend == "fp8":
            self.quantized[i] += new
        elif self.seen == 0:  # the first update quantizes everything it gets
            self.quantized[i] = new
        elif self.residual[i] + new >= o["residual_length"]:
            self.quantized[i] += self.residual[i] + new
            self.residual[i] = 0
        else:
            self.residual[i] += new
        q = quantized_bytes(self.geometry, self.quantized[i], backend, o.get("nbits", 8), o.get("q_group_size", 64))
        return q + self.residual[i] * self.geometry.token_bytes
