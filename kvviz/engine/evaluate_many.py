"""Several evaluations of one document: one after another, or the batchable ones read together, one batch row each."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack

import torch

from kvviz.engine import cache_rows
from kvviz.engine.evaluate import Evaluation
from kvviz.errors import failure
from kvviz.files.evaluation import TokenRecord


def evaluate_together(evaluations: list[Evaluation]) -> Iterator[tuple[int, TokenRecord]]:
    """Batchable evaluations of the same tokens, one batch row each, fed one token per forward: yields
    (index in `evaluations`, record). Each record's time is its share of the forward (the forward's time
    over the rows in it). A row that fails keeps its error and leaves the batch; the others go on. A row with a
    prompt (SnapKV) reads it alone first, then joins the batch after it."""
    for e in evaluations:
        e.start()
        e.result.method.update(mode="batched", rows=len(evaluations))
    for i, e in enumerate(evaluations):
        if e.prompt and not e.cancelled:
            yield from _alone(i, e, lambda e=e: e.read(0, e.prompt))
    active: list[int] = []
    with ExitStack() as reading:
        for e in evaluations:
            reading.enter_context(e.run.strategy.reading(e.run.cache))
        reading.enter_context(cache_rows.attention_by_rows(evaluations[0].model))
        for position in range(evaluations[0].predictions):
            if any(e.cancelled for e in evaluations):
                for e in evaluations:
                    e.result.cancelled = e.result.cancelled or not e.finished
                return
            active += [i for i, e in enumerate(evaluations) if e.prompt == position and not e.result.error]
            if not active:
                if max(e.prompt for e in evaluations) <= position:
                    break
                continue
            for i in active:
                evaluations[i].note_eviction(position + 1)
            started = time.perf_counter()
            with torch.inference_mode():
                logits, failures = cache_rows.feed_together([evaluations[i].run for i in active],
                                                            evaluations[0].ids[:, position : position + 1],
                                                            batch=len(evaluations))
            wall_ms = (time.perf_counter() - started) * 1000.0 / len(active)
            still = []
            for row, i in enumerate(active):
                e = evaluations[i]
                try:
                    if row in failures:
                        raise failures[row]
                    records = e.take(position, logits[row], wall_ms)
                except Exception as exc:  # noqa: BLE001 - this strategy's own failure, reported with its result
                    e.result.error = failure(f"{e.result.label()} in the evaluation", exc)
                    continue
                still.append(i)
                for record in records:
                    yield i, record
            active = still


def _alone(index: int, evaluation: Evaluation, records: Callable[[], Iterable[TokenRecord]]
          ) -> Iterator[tuple[int, TokenRecord]]:
    """(index, record) for each of `records()`, an evaluation's reading alone; a failure of its own is kept in its
    result (`error`), where the others go on."""
    try:
        for record in records():
            yield index, record
    except Exception as exc:  # noqa: BLE001 - a strategy's own failure, reported with its result
        evaluation.result.error = failure(f"{evaluation.result.label()} in the evaluation", exc)


def evaluate_all(evaluations: list[Evaluation], together: bool = False) -> Iterator[tuple[int, TokenRecord]]:
    """Run the evaluations, yielding (index, record): one after another, or with `together` the batchable
    ones (two or more) in one batch where the first of them stands (`evaluate_together`).

    A failure in one (its message kept in its result's `error`) does not stop the others; once one
    is cancelled, the ones not started are left unstarted.
    """
    batch = [i for i, e in enumerate(evaluations) if e.batchable() and not e.finished] if together else []
    if len(batch) < 2:
        batch = []
    for index, evaluation in enumerate(evaluations):
        if evaluation.cancelled:
            return
        if evaluation.finished or index in batch[1:]:  # finished: kept from a journal (`Evaluation.resume`)
            continue
        if batch and index == batch[0]:
            for row, record in evaluate_together([evaluations[i] for i in batch]):
                yield batch[row], record
            continue
        yield from _alone(index, evaluation, lambda evaluation=evaluation: evaluation)
