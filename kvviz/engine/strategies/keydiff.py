"""KeyDiff (Park et al., 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
Resource-Constrained Environments"): keep the keys least like the others.

Each KV head's anchor is the mean of its held keys, each normalized to unit length; a key's score is minus its
cosine similarity to the anchor, so the most distinctive keys are kept. It needs no attention, as kvpress's
KeyDiffPress computes it.
"""

from __future__ import annotations

import torch.nn.functional as F

from kvviz.engine.scorers import Scorer
from kvviz.engine.strategies.eviction import EvictionStrategy, budget_option, scoring_options


class Distinct(Scorer):
    reads_attention = False

    def scores(self, layer, query, key, mask, scaling):
        anchor = F.normalize(layer.keys, p=2, dim=-1).mean(dim=2, keepdim=True)
        return -F.cosine_similarity(layer.keys, anchor, dim=-1)


class KeyDiff(EvictionStrategy):
    name = "keydiff"
    description = "KeyDiff: per KV head, keep the keys least similar to the mean key direction (no attention needed)"
    reference = "KeyDiff (Park et al., 2025), as kvpress's KeyDiffPress: minus the cosine to the mean normalized key"
    compresses_prompt = True
    options = (budget_option(), *scoring_options())
    scorer = Distinct

    def prompt_kept(self, options) -> str:
        return f"per KV head the {options['budget']:,} keys least like the mean key direction"
