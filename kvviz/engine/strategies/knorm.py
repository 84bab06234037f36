"""Key norm (Devoto et al., 2024, "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression").

Keys with a low L2 norm tend to draw high attention, so once a layer holds more than `budget` tokens each KV
head keeps the `budget` keys with the lowest norm (RoPE rotates keys, which keeps their norm). It needs no
attention scores: the choice is made as soon as the new tokens are appended, after this step's attention
already saw them.
"""

from __future__ import annotations

from kvviz.engine.eviction_layers import EvictionLayer
from kvviz.engine.strategies.eviction import EvictionStrategy, budget_option


class KeyNormLayer(EvictionLayer):
    def appended(self, new: int) -> None:
        if self.get_seq_length() <= self.budget:
            return
        with self.timed():
            self.keep_best(-self.keys.float().norm(dim=-1))  # [batch, kv_heads, held]


class KeyNorm(EvictionStrategy):
    name = "knorm"
    description = "key norm: per KV head, keep the `budget` keys with the lowest L2 norm (no attention needed)"
    options = (budget_option(),)
    reads_attention = False

    def make_layer(self, index, options):
        return KeyNormLayer(index, options["budget"])
