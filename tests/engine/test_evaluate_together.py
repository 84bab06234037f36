"""Strategies that read a document together, one batch row each (`cache_rows`), predict what each predicts
alone, keep their own bookkeeping, and fail, stop and refuse one by one."""

import threading

import pytest
import torch

from kvviz.engine import cache_rows, evaluate, strategies
from tests.engine.families import tiny_family
from tests.engine.test_evaluate import TOLERANCE, document_ids

EVICTING = [
    ("sliding", {"window": 12}),
    ("sink", {"sink_tokens": 4, "window": 8}),
    ("h2o", {"budget": 12, "recent": 4}),
    ("tova", {"budget": 12}),
    ("knorm", {"budget": 12}),
]  # snapkv reads its prompt in one forward, alone (test_evaluate)


def evaluations_of(loaded, specs, ids, record, cancel=None):
    return [evaluate.Evaluation(loaded, strategies.choose(name, dict(options)), ids, record, cancel)
            for name, options in specs]


def run_all(loaded, specs, ids, record, together):
    evaluations = evaluations_of(loaded, specs, ids, record)
    order = [index for index, _ in evaluate.evaluate_all(evaluations, together=together)]
    return evaluations, order


def assert_same_predictions(alone, together):
    for a, t in zip(alone, together, strict=True):
        label = a.result.label()
        nll_alone = torch.tensor([r.nll for r in a.result.records], dtype=torch.float64)
        nll_together = torch.tensor([r.nll for r in t.result.records], dtype=torch.float64)
        assert nll_alone.shape == nll_together.shape, label
        assert float((nll_alone - nll_together).abs().max()) < TOLERANCE, label
        for field in ("position", "token_id", "cache_bytes", "predicted_cache_bytes", "tokens_held"):
            assert [getattr(r, field) for r in a.result.records] == [getattr(r, field) for r in t.result.records], \
                (label, field)
        assert a.result.first_eviction == t.result.first_eviction, label


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3"])
def test_evicting_strategies_read_together_predict_as_alone(tiny_model, family):
    loaded = tiny_model if family == "llama" else tiny_family(family, tiny_model.tokenizer)
    ids, record = document_ids(tiny_model, 48)
    alone, alone_order = run_all(loaded, EVICTING, ids, record, together=False)
    together, order = run_all(loaded, EVICTING, ids, record, together=True)
    assert_same_predictions(alone, together)
    assert all(t.result.method == {"mode": "batched", "chunk": 1, "rows": len(EVICTING)} for t in together)
    assert all(a.result.method == {"mode": "token-by-token", "chunk": 1} for a in alone)
    assert order[: len(EVICTING)] == list(range(len(EVICTING)))  # one token for every row, then the next
    assert sorted(order) == sorted(alone_order)
    # each record carries its share of the forward: the batch's time over its rows
    assert all(r.wall_ms > 0 for t in together for r in t.result.records)
    assert all(r.cache_bytes == r.predicted_cache_bytes for t in together for r in t.result.records)


def test_on_the_default_model_the_rows_predict_as_alone(default_model):
    ids, record = document_ids(default_model, 64)
    specs = [("sliding", {"window": 24}), ("sink", {"sink_tokens": 4, "window": 20}), ("h2o", {"budget": 24})]
    alone, _ = run_all(default_model, specs, ids, record, together=False)
    together, _ = run_all(default_model, specs, ids, record, together=True)
    assert_same_predictions(alone, together)
    assert default_model.model.config._attn_implementation in ("sdpa", "kvviz_sdpa")  # given back after the batch


def test_only_evicting_strategies_share_forwards_and_the_order_is_kept(tiny_model):
    ids, record = document_ids(tiny_model, 20)
    specs = [("dynamic", {}), ("sliding", {"window": 8}), ("quantized", {"q_group_size": 32, "residual_length": 4}),
             ("sink", {"sink_tokens": 2, "window": 6})]
    evaluations, order = run_all(tiny_model, specs, ids, record, together=True)
    modes = [e.result.method["mode"] for e in evaluations]
    assert modes == ["chunked", "batched", "token-by-token", "batched"]  # quantizing rounds: fed alone
    # the exact one first, then the batch where its first member stands, then the quantized one
    assert order == [0] * 19 + [1, 3] * 19 + [2] * 19
    assert all(e.finished and e.result.error is None for e in evaluations)


def test_a_row_that_fails_leaves_the_batch_and_the_others_go_on(tiny_model, caplog):
    ids, record = document_ids(tiny_model, 30)
    specs = [("sliding", {"window": 8})] * 3
    alone, _ = run_all(tiny_model, specs, ids, record, together=False)
    evaluations = evaluations_of(tiny_model, specs, ids, record)
    layer = evaluations[1].run.cache.layers[1]
    update, calls = layer.update, []

    def failing_update(*args, **kwargs):  # stands in for a failure inside one strategy's cache at the 6th token
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("out of memory")
        return update(*args, **kwargs)

    layer.update = failing_update
    order = [index for index, _ in evaluate.evaluate_all(evaluations, together=True)]
    assert order == [0, 1, 2] * 5 + [0, 2] * 24
    assert evaluations[1].result.error == "RuntimeError: out of memory"
    logged = [r for r in caplog.records if r.name == "kvviz" and r.exc_info]  # the cause kept for --debug and the log
    assert [r.getMessage() for r in logged] == ["sliding (window=8) in the evaluation failed"]
    assert "failing_update" in caplog.text  # the traceback reaches the frame that raised
    assert len(evaluations[1].result.records) == 5 and evaluations[1].finished
    assert_same_predictions([alone[0], alone[2]], [evaluations[0], evaluations[2]])


def test_stop_cancels_every_row_and_leaves_the_rest_unstarted(tiny_model):
    ids, record = document_ids(tiny_model, 40)
    cancel = threading.Event()
    specs = [("sliding", {"window": 8}), ("tova", {"budget": 8}), ("dynamic", {})]
    evaluations = evaluations_of(tiny_model, specs, ids, record, cancel)
    for _, r in evaluate.evaluate_all(evaluations, together=True):
        if r.position == 9:
            cancel.set()
    assert [len(e.result.records) for e in evaluations[:2]] == [10, 10]
    assert all(e.result.cancelled and e.finished for e in evaluations[:2])
    assert not evaluations[2].started


def test_models_with_sliding_window_layers_are_fed_one_at_a_time(tiny_model):
    loaded = tiny_family("mistral", tiny_model.tokenizer)
    assert "sliding-window layers" in cache_rows.unsupported(loaded.model)
    ids, record = document_ids(tiny_model, 16)
    specs = [("sliding", {"window": 8}), ("sliding", {"window": 6})]
    evaluations, order = run_all(loaded, specs, ids, record, together=True)
    assert [e.result.method["mode"] for e in evaluations] == ["token-by-token", "token-by-token"]
    assert order == [0] * 15 + [1] * 15
