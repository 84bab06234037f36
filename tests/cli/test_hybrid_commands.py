"""`kvviz eval` and `kvviz compare` on a hybrid model (Qwen3-Next's shape, tiny and random, as a model folder): the
attention layers take each strategy, the linear-attention layers keep their fixed-size state, and every size is as
predicted."""

import csv
import json

import pytest

from kvviz.engine.model_files import quiet_transformers
from kvviz.files import evaluation, trace
from tests.commands import kvviz
from tests.engine.families import tiny_architecture


def model_folder(tmp_path_factory, tokenizer, family: str):
    """A tiny random model of `family` saved as a model folder, as a user would pass one."""
    folder = tmp_path_factory.mktemp(family)
    with quiet_transformers():
        tiny_architecture(family, tokenizer).model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory, tiny_model):
    return model_folder(tmp_path_factory, tiny_model.tokenizer, "qwen3_next")


def test_eval_reads_a_document_through_each_strategy(hybrid, tmp_path):
    result = kvviz("eval", "--model", hybrid, "--builtin", "alice", "--tokens", "24", "--strategies",
                   "dynamic,sliding:window=8,h2o:budget=8", "--out", tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    assert [r["status"] for r in results] == ["finished"] * 3
    # the hybrid's layers are fed one cache at a time (no batch of rows with a state per row)
    assert [r["method"]["mode"] for r in results] == ["chunked", "token-by-token", "token-by-token"]
    assert [r["summary"]["first_eviction"] for r in results] == [None, 8, 9]
    for r in results:
        records = [t for t in evaluation.load(r["file"]).records if t.cache_bytes is not None]
        assert records and all(t.cache_bytes == t.predicted_cache_bytes for t in records), r["strategy"]


def test_compare_runs_each_strategy_against_the_exact_cache(hybrid, tmp_path):
    result = kvviz("compare", "--model", hybrid, "--strategies",
                   "dynamic,sliding:window=8", "--prompt",
                   "The history of the printing press begins", "--max-new-tokens", "6", "--ignore-eos",
                   "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    traces = sorted(tmp_path.glob("trace-*.json"))
    assert len(traces) == 2
    for path in traces:
        steps = trace.load(path).steps
        assert all(step.cache_bytes == step.predicted_cache_bytes for step in steps), path.name
        assert all(sum(layer.state_bytes for layer in step.layers) > 0 for step in steps)
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [r["strategy"] for r in rows] == ["dynamic", "sliding"]
    assert rows[0]["top-1 agreement"] == "1" and rows[0]["mean KL (nats)"] == "0"
    assert float(rows[1]["peak cache MiB"]) < float(rows[0]["peak cache MiB"])
    assert (tmp_path / "report.md").exists()


@pytest.fixture(scope="module")
def recurrent_gemma(tmp_path_factory, tiny_model):
    return model_folder(tmp_path_factory, tiny_model.tokenizer, "recurrent_gemma")


def test_recurrent_gemma_is_evaluated_token_by_token_and_refuses_what_its_modules_cannot_hold(recurrent_gemma,
                                                                                               tmp_path):
    """Its recurrent layers read a feed of more than one token as a new prompt: even the exact cache is fed one token
    at a time, with the states its modules keep measured as predicted."""
    result = kvviz("eval", "--model", recurrent_gemma, "--builtin", "alice", "--tokens", "16", "--strategies",
                   "dynamic,none", "--out", tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    assert [(r["status"], r["method"]["mode"]) for r in results] == [("finished", "token-by-token")] * 2
    records = [t for t in evaluation.load(results[0]["file"]).records if t.cache_bytes is not None]
    assert records and all(t.cache_bytes == t.predicted_cache_bytes for t in records)
    refused = kvviz("compare", "--model", recurrent_gemma, "--strategies", "dynamic,sliding:window=8", "--prompt",
                    "The history", "--max-new-tokens", "2", "--out", tmp_path / "compare")
    assert refused.returncode != 0
    assert "keeps the states of its recurrent layers in its own modules" in refused.stderr
    assert "Error" not in refused.stderr and "Traceback" not in refused.stderr
