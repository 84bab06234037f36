"""Key norm (Devoto et al., 2024, "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression").

Keys with a low L2 norm tend to draw high attention, so once a layer holds more than `budget` tokens each KV
head keeps the `budget` keys with the lowest norm (RoPE rotates keys, which keeps their norm). It needs no
attention scores: the choice is made as soon as the new tokens are appended, after this step's attention
already saw them. The first `skip_layers` layers are left whole (plain DynamicLayers): the authors found their
attention unlike the norm's ranking and compress from layer 2 on (kvpress's KnormPress compresses every layer:
skip_layers=0).
"""

from __future__ import annotations

from kvviz.engine.scorers import Scorer
from kvviz.engine.strategies.base import Option
from kvviz.engine.strategies.eviction import EvictionStrategy, budget_option, scoring_options


class LowNorm(Scorer):
    reads_attention = False

    def scores(self, layer, query, key, mask, scaling):
        return -layer.keys.float().norm(dim=-1)  # [batch, kv_heads, held]


class KeyNorm(EvictionStrategy):
    name = "knorm"
    description = "key norm: per KV head, keep the budget keys with the lowest L2 norm (no attention needed)"
    reference = (
        "Devoto et al., EMNLP 2024, as the authors' code: the first two layers are not compressed (skip_layers=2; "
        "kvpress's KnormPress: skip_layers=0)"
    )
    options = (
        budget_option(),
        Option("skip_layers", "int", 2, "first layers kept whole, not compressed", minimum=0),
        *scoring_options(decode_interval=1),
    )
    reads_attention = False
    scorer = LowNorm

    def model_problem(self, model, geometry, options):
        if options["skip_layers"] >= geometry.num_layers:
            return (
                f"with skip_layers={options['skip_layers']} would compress none of this model's "
                f"{geometry.num_layers} layers; use at most {geometry.num_layers - 1}"
            )
        return super().model_problem(model, geometry, options)

    def whole_layers(self, options) -> int:
        return options["skip_layers"]

    def prompt_kept(self, options) -> str:
        whole = options["skip_layers"]
        return (f"per KV head the {options['budget']:,} keys with the lowest norm"
                + (f" (the first {whole} layers keep all of it)" if whole else ""))
