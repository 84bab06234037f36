"""What a cache strategy costs in output quality, against the exact cache.

A `Reference` runs the same model with a full-precision `DynamicCache` (or the model's own cache class, as
generate builds it) in lockstep with a run, teacher-forced on the run's own tokens, and compares next-token
distributions at every step:
KL(reference || run), whether the top-1 tokens agree, and the reference log-probability of the
token the run chose (for the perplexity of the generated text under the reference). Its time is
measured apart and never counted in the run's step times.
"""

from __future__ import annotations

import time

import torch

from kvviz.engine.cache_run import model_forward
from kvviz.engine.own_caches import dynamic_cache


class Reference:
    def __init__(self, model):
        self.model = model
        self.cache = dynamic_cache(model.config)

    def compare(self, fed: torch.Tensor, run_logits: torch.Tensor, token: int) -> tuple[float, bool, float, float]:
        """Feed the reference the same tokens; returns (kl, top1_agree, ref_logprob, reference_ms)."""
        started = time.perf_counter()
        logits = model_forward(self.model, fed, self.cache, position_ids=None)[:, -1, :]
        ref = torch.log_softmax(logits.float(), dim=-1)
        run = torch.log_softmax(run_logits.float(), dim=-1)
        kl = float((ref.exp() * (ref - run)).sum().clamp_min(0.0))
        agree = bool(ref.argmax(dim=-1).item() == run.argmax(dim=-1).item())
        logprob = float(ref[0, token])
        return kl, agree, logprob, (time.perf_counter() - started) * 1000.0
