"""The attention view: where the current token's attention goes, per layer, at every step.

Off unless asked for. For one forward, `AttentionView` receives every layer's attention (through
`attention_scores.watching`), takes the newest query's probabilities, averages them over the query heads and
lays them out by absolute position (positions a head does not hold count zero for it), so that the rows line up
with the cache map whatever a cache keeps: each layer's row is a distribution over positions 0 .. total-1.
Beside it, the share of that attention on the first `ATTENTION_SINK_POSITIONS` positions: the attention sink of
StreamingLLM.
"""

from __future__ import annotations

import numpy as np
import torch

from kvviz.engine.attention_scores import attention_received
from kvviz.engine.held_positions import Carried, fed_positions
from kvviz.engine.layers import KvvizLayer
from kvviz.files.trace import ATTENTION_SINK_POSITIONS


def cache_positions(layer, carried: Carried | None, n_keys: int, total: int) -> torch.Tensor:
    """Absolute positions of the `n_keys` keys a cache layer returned to attention, ``[kv_heads or 1, n_keys]``.

    kvviz's own layers say so; transformers' layers return what they were fed (`held_positions.fed_positions`:
    from the first token, or what a live switch `carried` in and everything since), or its newest part (a sliding
    window); a static cache's unwritten slots come last, and are masked.
    """
    if isinstance(layer, KvvizLayer):
        return layer.attended_positions(n_keys, total)
    fed = fed_positions(carried, total)
    if n_keys >= fed.shape[-1]:
        return torch.cat([fed, torch.arange(total, total + n_keys - fed.shape[-1]).expand(fed.shape[0], -1)], dim=-1)
    return fed[:, fed.shape[-1] - n_keys :]


class AttentionView:
    """Collects one forward's attention rows; `total` is the number of positions numbered once it has run, and
    `carried` says per layer what a live switch put into the cache (`held_positions.Carried`)."""

    def __init__(self, cache, carried: list[Carried | None], num_layers: int, total: int):
        self.layers = getattr(cache, "layers", None)
        self.carried = carried
        self.total = total
        self.rows = np.zeros((num_layers, total), dtype=np.float32)

    def attended(self, layer_index: int, query, key, mask, scaling: float) -> None:
        heads, n_keys = query.shape[1], key.shape[-2]
        newest = attention_received(query, key, mask, scaling, last=1)[0]  # [kv_heads, group, keys]
        layer = self.layers[layer_index] if self.layers is not None else None
        positions = cache_positions(layer, self.carried[layer_index], n_keys, self.total).to(newest.device)
        per_head = newest.sum(dim=1) if positions.shape[0] > 1 else newest.sum(dim=(0, 1))[None]
        row = torch.zeros(self.total, dtype=torch.float32, device=newest.device)
        # slots past the last position (a static cache's unwritten ones) hold no attention: the mask saw to it
        inside = positions < self.total
        row.index_add_(0, positions[inside], per_head[inside])
        self.rows[layer_index] = (row / heads).cpu().numpy()

    def sink_share(self) -> list[float]:
        return [float(s) for s in self.rows[:, :ATTENTION_SINK_POSITIONS].sum(axis=1)]
