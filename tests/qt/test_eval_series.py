"""The Evaluate tab's columns: filled a few records at a time, they say what the whole run's summary says."""

from __future__ import annotations

import numpy as np
import pytest

from kvviz.files.evaluation import EvalRun, TokenRecord
from kvviz.present import MIB
from kvviz.qt.evaluate.series import SETTLING, SMOOTHING, StrategySeries


def _run(mode: str = "token-by-token") -> EvalRun:
    return EvalRun(model={"name": "m"}, strategy={"name": "sink", "options": {"sink_tokens": 4, "window": 124}},
                   document={"name": "d", "tokens": 1001}, method={"mode": mode, "chunk": 1})


def _records(start: int, end: int, rng, measured_every: int = 1) -> list[TokenRecord]:
    out = []
    for p in range(start, end):
        measured = (p + 1) % measured_every == 0
        out.append(TokenRecord(p, int(rng.integers(0, 100)), float(rng.gamma(2.0, 1.5)),
                               (p + 1) * 4096 if measured else None, (p + 1) * 4000 if measured else None,
                               p + 1 if measured else None, float(rng.uniform(5, 50))))
    return out


@pytest.mark.parametrize("measured_every", [1, 128])
def test_columns_grow_in_pieces_and_agree_with_the_summary(measured_every):
    rng = np.random.default_rng(7)
    run = _run()
    series = StrategySeries(0, run.strategy, run, capacity=16)  # small: the buffers must double several times
    cuts = [0, 1, 3, 64, 65, 200, 511, 1000]
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        run.records.extend(_records(a, b, rng, measured_every))
        assert series.sync()
        assert series.n == b
    assert not series.sync()  # nothing new

    nll = np.array([r.nll for r in run.records])
    expected = [nll[max(0, i - SMOOTHING + 1) : i + 1].mean() for i in range(len(nll))]
    np.testing.assert_allclose(series.running_mean(), expected, rtol=1e-12)
    np.testing.assert_array_equal(series.column(0), np.arange(1000))
    summary = run.summary()
    assert series.perplexity() == pytest.approx(summary["perplexity"], rel=1e-12)
    assert series.second_half_perplexity() == pytest.approx(summary["second_half_perplexity"], rel=1e-12)
    assert series.tokens_per_s() == pytest.approx(summary["tokens_per_s"], rel=1e-12)
    assert series.cache_mib() == summary["final_cache_bytes"] / MIB
    x, measured, predicted = series.memory()
    kept = [r for r in run.records if r.cache_bytes is not None]
    np.testing.assert_array_equal(x, [r.position for r in kept])
    np.testing.assert_array_equal(measured, [r.cache_bytes / MIB for r in kept])
    np.testing.assert_array_equal(predicted, [r.predicted_cache_bytes / MIB for r in kept])


def test_nothing_measured_stays_unknown():
    series = StrategySeries(2, {"name": "dynamic", "options": {}})
    assert series.run_id == 3 and series.total is None
    assert series.perplexity() is None and series.second_half_perplexity() is None
    assert series.cache_mib() is None and series.tokens_per_s() is None and series.first_eviction is None
    assert not series.sync()


def test_the_y_range_leaves_out_the_first_predictions_once_there_are_more():
    run = _run()
    series = StrategySeries(0, run.strategy, run)
    run.records.extend(TokenRecord(p, 1, 9.0 if p < 3 else 2.0, None, None, None, 1.0) for p in range(10))
    series.sync()
    assert series.mean_range() == (pytest.approx(2.0 + 7.0 * 3 / 10), 9.0)  # all of them while there are few
    run.records.extend(TokenRecord(p, 1, 2.0 + (p == 40), None, None, None, 1.0) for p in range(10, 60))
    series.sync()
    lo, hi = series.mean_range()
    mean = series.running_mean()
    assert (lo, hi) == (mean[SETTLING:].min(), mean[SETTLING:].max()) and hi < mean[0]
