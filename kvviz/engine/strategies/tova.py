"""TOVA (Oren et al., 2024, "Transformers are Multi-State RNNs"): drop what the current token attends to least.

Once a layer holds more than `budget` tokens, it keeps the `budget` tokens on which the newest query's
attention, averaged over all query heads, is highest: one decision per layer, the same tokens in every KV
head (as in the authors' code; with grouped-query attention every query head counts once). At each decoding
step that evicts exactly one token; a longer prompt is cut to the budget by its last query. After a live switch
from a policy that chose per KV head, the heads hold different tokens in the same key slots: the choice keeps the
same slots in every head, each with its own token. kvpress's TOVAPress keeps the newest token whatever its
attention ("a very slight difference from TOVA", its comment says); kvviz ranks it with the rest, as the authors do.
"""

from __future__ import annotations

from kvviz.engine.scorers import Scorer
from kvviz.engine.strategies.eviction import EvictionStrategy, budget_option, scoring_options


class NewestQuery(Scorer):
    def scores(self, layer, query, key, mask, scaling):
        from kvviz.engine.attention_scores import attention_received

        newest = attention_received(query, key, mask, scaling, last=1)  # [batch, kv_heads, group, keys]
        return newest.mean(dim=(1, 2)).unsqueeze(1)


class TOVA(EvictionStrategy):
    name = "tova"
    description = "TOVA: once over budget, drop the token the current query attends to least (one choice per layer)"
    reference = (
        "TOVA (Oren et al., 2024, \"Transformers are Multi-State RNNs\"), as the authors' code: the newest query's "
        "attention averaged over all heads, one choice per layer"
    )
    options = (budget_option(), *scoring_options(decode_interval=1))
    scorer = NewestQuery

    def prompt_kept(self, options) -> str:
        return f"the {options['budget']:,} tokens its last token attends to most (averaged over the heads)"
