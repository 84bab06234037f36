"""Several caches fed the same tokens in one forward, one batch row per cache.

Feeding a document token by token is bound by reading the model's weights once per forward (a
matrix-vector product per layer). Strategies that read the same document can share that read: each
becomes one row of a batch, keeps its own cache and its own positions, and its keys and values never
meet the other rows', because attention runs row by row against what each row's cache returned. The
rows' predictions are those of feeding each cache alone, to float rounding (tested).

A batched forward runs the model with attention implementation `kvviz_rows` (registered here, with no
mask function: transformers then builds no mask), so it serves only single-token feeds on models whose
every layer attends to all it holds (no sliding-window layers) through SDPA.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface

from kvviz.engine import attention_scores
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.forward import attention_implementation, model_forward
from kvviz.engine.geometry import Geometry

NAME = "kvviz_rows"
# Every forward of a batch has the same number of rows, the batch's size rounded up to a multiple of ROW_GROUP: rows
# not reading (yet, or any more) are padding (no cache; each attends to nothing, its output zeros). A float32 matrix
# product may give a row other bits in a product of another number of rows, but on the CPUs measured not for what the
# other rows hold or where the row sits: an AVX2 one computes rows in groups of 4 (a row's logits on the default
# model differ by up to 8e-5 between a batch of 10 rows and one of 12), an AVX-512 one (MKL) takes one path below 16
# rows and another from 16 on. So a row predicts the same whichever caches share its forwards and wherever it sits,
# which lets caches join and leave a batch without changing any prediction (`tests/engine/test_evaluate_together.py`
# checks it on the machine it runs on). Whole groups also cost less: products of 2 or 3 rows take a slow path on the
# AVX2 CPU (the default model's projections: 1 row 13.3 ms, 2 rows 28.1, 3 rows 38.5, 4 rows 19.9).
ROW_GROUP = 4

_local = threading.local()


class CacheRows:
    """Stands in for a transformers cache in one batched forward: row b's keys and values go to `caches[b]`
    (None: a padding row, which holds nothing and attends to nothing).

    A row whose cache or attention scoring raises is failed (`failures`, by row) and fed placeholders for
    the rest of the forward, so that the other rows' caches stay whole; its logits mean nothing.
    """

    def __init__(self, caches: list):
        self.caches = caches
        self.returned: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # per layer, each row's keys, values
        self.failures: dict[int, Exception] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        returned = []
        for row, cache in enumerate(self.caches):
            keys, values = key_states[row : row + 1], value_states[row : row + 1]
            if cache is not None and row not in self.failures:
                try:
                    keys, values = cache.update(keys, values, layer_idx, *args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - this row's strategy failed; the others go on
                    self.failures[row] = exc
            returned.append((keys, values))
        self.returned[layer_idx] = returned
        return key_states, value_states  # unused: `rows_attention` reads each row's own

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # Llama-style models ask only when no position ids are given (feed_together always gives them);
        # some models ask anyway (for ALiBi biases, say) and would fail on a cache without it
        return self.caches[0].get_seq_length(layer_idx)


def rows_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA attention of each row's queries on the keys and values its own cache returned (with the scores
    handed to the caches that evict by attention, as `attention_scores` does for a single cache)."""
    rows: CacheRows = _local.rows
    outputs = []
    for row, (keys, values) in enumerate(rows.returned.pop(module.layer_idx)):
        output = None  # zeros for a padding row (its logits are dropped, no other row reads it) or a failed one
        if rows.caches[row] is not None:
            try:
                output = attention_scores.sdpa_with_scores(module, query[row : row + 1], keys, values, None,
                                                           dropout=dropout, scaling=scaling, **kwargs)[0]
            except Exception as exc:  # noqa: BLE001 - an eviction policy's scoring failed: this row only
                rows.failures.setdefault(row, exc)
        # SDPA's output is [1, new, heads, head_dim]
        outputs.append(torch.zeros_like(query[row : row + 1].transpose(1, 2)) if output is None else output)
    return torch.cat(outputs, dim=0), None


AttentionInterface.register(NAME, rows_attention)


def unsupported(model) -> str | None:
    """Why caches cannot be fed together on this model, or None."""
    problem = attention_scores.unsupported(model)
    if problem:
        return problem
    geometry = Geometry.of(model.config, model.dtype)
    if geometry.hybrid:
        return "has sliding-window layers, whose attention needs a mask per row"
    if not geometry.plain:
        return f"has {geometry.unusual_layers()}, which are fed one cache at a time"
    return None


@contextmanager
def attention_by_rows(model) -> Iterator[None]:
    """Inside, `feed_together` can run on `model` (checked with `unsupported` first)."""
    try:
        with attention_implementation(model, NAME):
            yield
    finally:
        _local.rows = None


def feed_together(runs: list[CacheRun], token_id: torch.Tensor, batch: int = 0
                  ) -> tuple[torch.Tensor, dict[int, Exception]]:
    """Feed one token ``[1, 1]`` to every run's cache (each holding one), or one token each ``[len(runs), 1]``, in
    one forward of the rows of a batch of `batch` caches (at least these), inside `attention_by_rows`; returns the
    logits ``[len(runs), 1, vocab]``, row b's from `runs[b]`'s cache, and the failures by row (those rows' logits and
    caches are unusable; the others' are whole)."""
    model = runs[0].model
    size = max(batch, len(runs))
    padding = size + -size % ROW_GROUP - len(runs)
    rows = _local.rows = CacheRows([run.cache for run in runs] + [None] * padding)
    positions = torch.cat([run.positions(1, token_id.device) for run in runs]
                          + [torch.zeros((padding, 1), dtype=torch.long, device=token_id.device)])
    fed = token_id.expand(len(runs), 1)
    logits = model_forward(model, torch.cat([fed, fed[:1].expand(padding, 1)]), rows, positions)
    for row, run in enumerate(runs):
        if row not in rows.failures:
            run.fed(1)
    return logits[: len(runs)], rows.failures
