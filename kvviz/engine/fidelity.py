"""What a cache strategy costs in output quality, against the exact cache.

A `Reference` runs the same model with a full-precision `DynamicCache` (or the model's own cache class, as
generate builds it) in lockstep with a run, teacher-forced on the run's own tokens, and compares next-token
distributions at every step:
KL(reference || run), whether the top-1 tokens agree, and the reference log-probability of the
token the run chose (for the perplexity of the generated text under the reference). Its time is
measured apart and never counted in the run's step times.

A `ReferenceStream` does the same for an evaluation along a document (a sweep): the exact cache reads the
document a chunk at a time, ahead of the configurations, and hands out the log-probabilities of each position
once, keeping no more than a chunk's.
"""

from __future__ import annotations

import time

import torch

from kvviz.engine.forward import attention_implementation, model_forward
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
        kl, agree = divergence(ref, torch.log_softmax(run_logits.float(), dim=-1))
        logprob = float(ref[0, token])
        return kl[0], agree[0], logprob, (time.perf_counter() - started) * 1000.0


def divergence(reference_logprobs: torch.Tensor, run: torch.Tensor) -> tuple[list[float], list[bool]]:
    """Per row of two ``[n, vocab]`` float32 log-probabilities: KL(reference || run) in nats, and whether their most
    likely tokens agree."""
    gap = reference_logprobs - run  # weighted in place: one [n, vocab] temporary fewer, the same bits
    kl = gap.mul_(reference_logprobs.exp()).sum(dim=-1).clamp_min(0.0)
    agree = reference_logprobs.argmax(dim=-1) == run.argmax(dim=-1)
    return kl.tolist(), agree.tolist()


KEEP_BYTES = 2**30  # log-probabilities of a whole text up to this size are kept for every evaluation that asks


class ReferenceStream:
    """The exact cache reading `ids` ``[1, n]`` `chunk` tokens per forward, ahead of the evaluations that ask:
    `logprobs(start, count)` gives the float32 log-probabilities predicted from positions start .. start + count - 1
    (the forwards it needs run then), for every position but the last, whose successor the text does not hold (an
    evaluation's own chunks: `evaluate.feed_sizes`). Where the whole text's log-probabilities fit in KEEP_BYTES they
    are all kept, so that every later evaluation reads them again at no cost; else only those not yet asked for, and
    an evaluation asking from further back reads the text again from its start. Its forwards attend as the model did
    when the stream was made, also when asked from inside a batched forward (`cache_rows`).

    The exact cache's own evaluation, reading the same chunks, may `offer` what it read instead: the same forwards,
    so the same bits, read once."""

    def __init__(self, model, ids: torch.Tensor, chunk: int):
        self.model = model
        self.ids = ids
        self.chunk = chunk
        self.keep = ids.shape[-1] * model.config.get_text_config().vocab_size * 4 <= KEEP_BYTES
        self.attention = model.config._attn_implementation
        self._restart()

    def _restart(self) -> None:
        self.cache = dynamic_cache(self.model.config)
        self.chunks: list[tuple[int, torch.Tensor]] = []  # (first position, [positions, vocab] log-probabilities)
        self.fed = 0
        self.offered = False  # the chunks came from `offer`, and the stream's own cache is empty

    def offer(self, start: int, logprobs: torch.Tensor) -> None:
        """Log-probabilities ``[n, vocab]`` predicted from `start` on, as the exact cache's own evaluation read them
        in this stream's chunks: kept as if read here, when they follow what it holds and it keeps them all."""
        if self.keep and start == self.fed and (self.offered or not self.fed):
            self.chunks.append((start, logprobs))
            self.fed = start + logprobs.shape[0]
            self.offered = True

    def logprobs(self, start: int, count: int) -> torch.Tensor:
        end = start + count
        if not self.chunks or start < self.chunks[0][0] or (self.offered and self.fed < end):
            self._restart()
        if self.fed < end:  # switching attention back and forth costs a walk over the model: only to read on
            with torch.inference_mode(), attention_implementation(self.model, self.attention):
                while self.fed < end:
                    stop = min(self.fed + self.chunk, self.ids.shape[-1] - 1)
                    logits = model_forward(self.model, self.ids[:, self.fed : stop], self.cache, position_ids=None,
                                           logits_to_keep=stop - self.fed)[0]
                    self.chunks.append((self.fed, torch.log_softmax(logits.float(), dim=-1)))
                    self.fed = stop
        if not self.keep:  # let go of what lies before `start`
            self.chunks = [(first, held) for first, held in self.chunks if first + held.shape[0] > start]
        parts = [held[max(start - first, 0) : end - first] for first, held in self.chunks
                 if first < end and first + held.shape[0] > start]
        return parts[0] if len(parts) == 1 else torch.cat(parts)
