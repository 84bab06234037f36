"""Strategies that read a document together, one batch row each (`cache_rows`), predict what each predicts
alone, keep their own bookkeeping, and fail, stop and refuse one by one."""

import threading

import pytest
import torch

from kvviz.engine import cache_rows, evaluate, evaluate_many, strategies
from tests.engine.families import tiny_family
from tests.engine.test_evaluate import TOLERANCE, document_ids

EVICTING = [
    ("h2o", {"budget": 12, "recent": 4}),
    ("tova", {"budget": 12}),
    ("knorm", {"budget": 12}),
]  # snapkv reads its prompt in one forward, alone, then appends in chunks; a sliding window and attention sinks read
# in chunks, each token attending as it would alone (test_evaluate)


def evaluations_of(loaded, specs, ids, record, cancel=None):
    """The evicting ones read token by token (`chunk=1`), as only those share forwards (read in chunks, each steps
    through them alone: `stepped_reading`)."""
    return [evaluate.Evaluation(loaded, strategies.choose(name, dict(options)), ids, record, cancel,
                                chunk=1 if name in ("h2o", "tova", "knorm") else evaluate.CHUNK)
            for name, options in specs]


def run_all(loaded, specs, ids, record, together):
    evaluations = evaluations_of(loaded, specs, ids, record)
    order = [index for index, _ in evaluate_many.evaluate_all(evaluations, together=together)]
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
    ids, record = document_ids(default_model, 30)
    specs = [("tova", {"budget": 16}), ("knorm", {"budget": 12}), ("h2o", {"budget": 16})]
    alone, _ = run_all(default_model, specs, ids, record, together=False)
    together, _ = run_all(default_model, specs, ids, record, together=True)
    assert all(a.result.first_eviction is not None for a in alone)  # each evicts for the second half
    assert_same_predictions(alone, together)
    assert default_model.model.config._attn_implementation in ("sdpa", "kvviz_sdpa")  # given back after the batch


def test_only_evicting_strategies_share_forwards_and_the_order_is_kept(tiny_model):
    ids, record = document_ids(tiny_model, 20)
    specs = [("dynamic", {}), ("tova", {"budget": 8}), ("quantized", {"q_group_size": 32, "residual_length": 4}),
             ("h2o", {"budget": 6}), ("sliding", {"window": 8})]
    evaluations, order = run_all(tiny_model, specs, ids, record, together=True)
    modes = [e.result.method["mode"] for e in evaluations]
    # quantized: in chunks up to each quantization; sliding: in chunks, each token attending to its window
    assert modes == ["chunked", "batched", "chunked", "batched", "chunked"]
    # the exact one first, then the batch where its first member stands, then the ones read in chunks
    assert order == [0] * 19 + [1, 3] * 19 + [2] * 19 + [4] * 19
    assert all(e.finished and e.result.error is None for e in evaluations)


def test_a_row_that_fails_leaves_the_batch_and_the_others_go_on(tiny_model, caplog):
    ids, record = document_ids(tiny_model, 30)
    specs = [("tova", {"budget": 8})] * 3
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
    order = [index for index, _ in evaluate_many.evaluate_all(evaluations, together=True)]
    assert order == [0, 1, 2] * 5 + [0, 2] * 24
    assert evaluations[1].result.error == "RuntimeError: out of memory"
    logged = [r for r in caplog.records if r.name == "kvviz" and r.exc_info]  # the cause kept for --debug and the log
    assert [r.getMessage() for r in logged] == ["tova (budget=8) in the evaluation failed"]
    assert "failing_update" in caplog.text  # the traceback reaches the frame that raised
    assert len(evaluations[1].result.records) == 5 and evaluations[1].finished
    assert_same_predictions([alone[0], alone[2]], [evaluations[0], evaluations[2]])


def test_stop_cancels_every_row_and_leaves_the_rest_unstarted(tiny_model):
    ids, record = document_ids(tiny_model, 40)
    cancel = threading.Event()
    specs = [("h2o", {"budget": 6}), ("tova", {"budget": 8}), ("dynamic", {})]
    evaluations = evaluations_of(tiny_model, specs, ids, record, cancel)
    for _, r in evaluate_many.evaluate_all(evaluations, together=True):
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


@pytest.mark.parametrize("batch", [4, 8, 16])
def test_a_row_predicts_the_same_bits_whichever_rows_share_its_forward(tiny_model, batch):
    """Every forward of a batch has as many rows (`cache_rows.ROW_GROUP`), in which torch's matrix products give a row
    the same bits whatever the others hold and wherever it sits: what lets rows join and leave a batch without
    changing a prediction."""
    ids, record = document_ids(tiny_model, 24)
    token = torch.tensor([[ids[0]]])

    def logits_of(specs):
        runs = [evaluate.Evaluation(tiny_model, strategies.parse_spec(s), ids, record).run for s in specs]
        with torch.inference_mode(), cache_rows.attention_by_rows(tiny_model.model):
            for fed in ids[:12]:  # the rows' caches fill; then one more token, for the logits compared
                cache_rows.feed_together(runs, torch.tensor([[fed]]), batch)
            return cache_rows.feed_together(runs, token, batch)[0][:, -1]

    alone = logits_of(["tova:budget=8"])[0]
    assert torch.equal(logits_of(["sliding:window=5", "tova:budget=8", "h2o:budget=6"])[1], alone)
    assert torch.equal(logits_of(["sink:sink_tokens=2:window=4"] * 3 + ["tova:budget=8"])[3], alone)


def test_snapkv_read_token_by_token_reads_its_prompt_alone_and_joins_the_batch_after_it(tiny_model):
    """Where it reads token by token after its prompt (`chunk=1`, as on a model that takes one token at a time after
    a prompt; elsewhere it appends in chunks, alone)."""
    ids, record = document_ids(tiny_model, 60)
    specs = [("snapkv", {"budget": 12, "window": 4, "kernel": 3}), ("h2o", {"budget": 12})]

    def read(together):
        evaluations = [evaluate.Evaluation(tiny_model, strategies.choose(name, options), ids, record, chunk=1)
                       for name, options in specs]
        return evaluations, [i for i, _ in evaluate_many.evaluate_all(evaluations, together=together)]

    alone, _ = read(together=False)
    together, order = read(together=True)
    assert_same_predictions(alone, together)
    assert together[0].result.method == {"mode": "batched", "chunk": 1, "rows": 2, "prompt": 30}
    assert order[:30] == [0] * 30 and order[30:36] == [1] * 6  # its prompt first, then h2o alone until it joins
