"""Several empty caches filled by one prefill: the prompt read once, each cache keeping what its policy keeps.

Before it holds any token, every cache of a model whose layers all attend to everything they hold reads a prompt
the same way: its update() returns the keys and values it was fed, the prompt attends causally to them, and the
logits and every layer's keys and values are the exact cache's, whatever the cache keeps afterwards. Only what it
keeps differs, once its policy has seen the prompt's attention. So one forward serves them all: every member's
update() is fed the same keys and values, attention runs once on what the first returned, and each policy that
asked for its layer's attention gets that one (`attention_scores.answered_with`). transformers' quantized layers
qualify too: at the prefill they return what they were fed and quantize what they keep. A preallocating cache does
not (it returns its empty slots too), nor a model with sliding-window or unusual layers (`cache_rows.unsupported`).
"""

from __future__ import annotations

import torch

from kvviz.engine import attention_scores, cache_rows
from kvviz.engine.cache_run import CacheRun, model_forward


def unshared(run: CacheRun) -> str | None:
    """Why this run cannot read its prompt in a shared prefill, or None."""
    if run.cache is None:
        return "it has no cache"
    if run.seen:
        return "its cache holds tokens already"
    if run.strategy.preallocates:
        return "a preallocated cache returns its empty slots to attention too"
    if run.choice.options.get("prefill_chunk"):
        return "it reads its prompt a chunk per forward (prefill_chunk)"
    return cache_rows.unsupported(run.model)


class SharedCaches:
    """Stands in for a transformers cache in one forward that feeds the same tokens to every cache of `caches`.

    A member whose update() raises, or returns other than the keys and values the others return, is failed
    (`failures`, by index) and left out of the rest of the forward; the others' caches stay whole. Everything else a
    model asks of its cache (mask sizes, layer kinds) is the first member's: empty caches of full attention answer
    alike."""

    def __init__(self, caches: list):
        self.caches = caches
        self.failures: dict[int, Exception] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        returned: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, cache in enumerate(self.caches):
            if i in self.failures:
                continue
            try:
                returned[i] = cache.update(key_states, value_states, layer_idx, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - this member's strategy failed; the others go on
                self.failures[i] = exc
        if not returned:
            raise RuntimeError("every cache of the shared prefill failed") from next(iter(self.failures.values()))
        keys, values = next(iter(returned.values()))
        for i, (k, v) in returned.items():
            if k.shape != keys.shape or v.shape != values.shape:
                self.failures[i] = RuntimeError(f"its layer {layer_idx} returned keys of shape {tuple(k.shape)} at a "
                                                f"prefill of shape {tuple(key_states.shape)}")
        attention_scores.answered_with(layer_idx, [k for k, _ in returned.values()], keys)
        return keys, values

    def __getattr__(self, name: str):
        return getattr(self.caches[0], name)


def prefill_together(runs: list[CacheRun], ids: torch.Tensor) -> tuple[torch.Tensor, dict[int, Exception]]:
    """Feed the prompt `ids` ``[1, n]`` to every run (each checked with `unshared` first) in one forward; returns the
    logits of the prompt's last position ``[vocab]``, the same for every run, and the failures by run index (those
    runs' caches are unusable)."""
    shared = SharedCaches([run.cache for run in runs])
    logits = model_forward(runs[0].model, ids, shared, runs[0].positions(ids.shape[-1], ids.device))
    for i, run in enumerate(runs):
        if i in shared.failures:
            continue
        try:
            run.strategy.after_forward(run, ids)  # what the cache does after its own prefill (KVzip reads it again)
        except Exception as exc:  # noqa: BLE001 - this member's strategy failed; the others go on
            shared.failures[i] = exc
            continue
        run.fed(ids.shape[-1])
    return logits[0, -1], shared.failures
