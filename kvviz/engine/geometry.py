"""The shape of a model's KV cache, read from its config in one place.

Every layer's cache holds keys and values of shape ``[batch, kv_heads, tokens, head_dim]`` in the
model's dtype; layers of sliding-window attention keep at most `window` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SLIDING_TYPES = ("sliding_attention", "chunked_attention")


def text_config(config):
    """The decoder's own config (multimodal configs nest it)."""
    return config.get_text_config(decoder=True)


def layer_types(config) -> list[str]:
    """Per decoder layer: "full_attention", "sliding_attention", ... as the config declares or implies."""
    config = text_config(config)
    declared = getattr(config, "layer_types", None)
    if declared:
        return list(declared)
    kind = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
    return [kind] * config.num_hidden_layers


@dataclass(frozen=True)
class Geometry:
    """What sizes every layer's cache: [batch, kv_heads, tokens, head_dim] of `element` bytes."""

    num_layers: int
    num_attention_heads: int
    kv_heads: int
    head_dim: int
    element: int
    windows: tuple[int | None, ...]  # per layer: its sliding window, None for full attention
    layer_types: tuple[str, ...]
    context: int | None  # the positions the model was built for (max_position_embeddings), None if unsaid
    batch: int = 1

    @classmethod
    def of(cls, config, dtype: torch.dtype) -> Geometry:
        text = text_config(config)
        kinds = layer_types(config)
        window = getattr(text, "sliding_window", None)
        return cls(
            num_layers=text.num_hidden_layers,
            num_attention_heads=text.num_attention_heads,
            kv_heads=getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
            element=torch.empty((), dtype=dtype).element_size(),
            windows=tuple(window if kind in SLIDING_TYPES else None for kind in kinds),
            layer_types=tuple(kinds),
            context=getattr(text, "max_position_embeddings", None) or None,
        )

    @property
    def hybrid(self) -> bool:
        """True when some layers use sliding-window attention."""
        return any(w is not None for w in self.windows)

    @property
    def values_per_token(self) -> int:
        """Key (or value) elements of one token in one layer."""
        return self.kv_heads * self.head_dim

    @property
    def token_bytes(self) -> int:
        """Keys or values of one token in one layer."""
        return self.batch * self.values_per_token * self.element

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys plus values of one token across all layers."""
        return 2 * self.token_bytes * self.num_layers
