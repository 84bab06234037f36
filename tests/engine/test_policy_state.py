"""What a policy keeps beside keys and values (its state) is measured and predicted like the cache, kept in traces, and
predictors answer without changing their state."""

import json

import pytest
import torch

from kvviz.engine import decode, strategies
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.geometry import Geometry
from kvviz.files import trace


def run(loaded, name, options, new_tokens=12):
    settings = decode.GenerationSettings(max_new_tokens=new_tokens, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(loaded, strategies.choose(name, options), settings, "a policy keeps state " * 4)
    return list(decoder), decoder


@pytest.mark.parametrize("name,options", [
    ("h2o", {"budget": 12, "recent": 0}), ("tova", {"budget": 12}),
    ("snapkv", {"budget": 12, "window": 4, "pooling": "max"}), ("knorm", {"budget": 12, "skip_layers": 1}),
    ("expected_attention", {"budget": 12, "decode_interval": 3, "decode_target": 10}),
    ("pyramidkv", {"budget": 12, "window": 2, "beta": 2}), ("lagkv", {"budget": 12, "lag": 3}),
    ("keydiff", {"budget": 12, "decode_interval": 2, "decode_fraction": 0.5}), ("random", {"budget": 12}),
    ("kvzip", {"budget": 12}), ("think", {"key_channels": 0.25}),
    ("h2o", {"budget": 12, "adaptive": True, "critical": True}), ("tova", {"budget": 12, "chunk": 5}),
    ("snapkv", {"budget": 12, "window": 4, "adaptive": True, "decode_interval": 2}),
], ids=["h2o", "tova", "snapkv", "knorm", "expected_attention", "pyramidkv", "lagkv", "keydiff", "random", "kvzip",
        "think", "h2o-adaptive-critical", "tova-chunk", "snapkv-adaptive-decoding"])
def test_policy_bytes_measured_as_predicted_and_kept_in_the_trace(tiny_model, tmp_path, name, options):
    steps, decoder = run(tiny_model, name, options)
    assert all(s.policy_bytes == s.predicted_policy_bytes > 0 for s in steps)
    assert all(s.cache_bytes == s.predicted_cache_bytes for s in steps)
    summary = decoder.trace.summary()
    assert summary["peak_policy_bytes"] == max(s.policy_bytes for s in steps)
    assert summary["final_policy_bytes"] == steps[-1].policy_bytes
    loaded = trace.load(decoder.trace.save(tmp_path / "run.json"))
    assert [s.policy_bytes for s in loaded.steps] == [s.policy_bytes for s in steps]


def test_caches_without_a_policy_keep_none(tiny_model):
    for name in ("dynamic", "sink", "sliding"):
        steps, _ = run(tiny_model, name, {"window": 8} if name != "dynamic" else {}, new_tokens=3)
        assert all(s.policy_bytes == s.predicted_policy_bytes == 0 for s in steps), name


def test_older_traces_without_policy_bytes_read_as_unknown(tiny_model, tmp_path):
    _, decoder = run(tiny_model, "h2o", {"budget": 12}, new_tokens=3)
    data = decoder.trace.to_dict()
    for step in data["steps"]:
        del step["policy_bytes"], step["predicted_policy_bytes"]
    del data["summary"]["peak_policy_bytes"], data["summary"]["final_policy_bytes"]  # nor did their summaries
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = trace.load(path)
    assert all(s.policy_bytes is None and s.predicted_policy_bytes is None for s in old.steps)
    assert old.summary()["peak_policy_bytes"] is None and old.summary()["final_policy_bytes"] is None


def test_key_norm_leaves_its_first_layers_whole(tiny_model):
    steps, decoder = run(tiny_model, "knorm", {"budget": 12})  # skip_layers=2 by default, as the authors do
    seen = decoder.prompt_tokens + len(steps) - 1
    assert [layer.seq_len for layer in steps[-1].layers] == [seen, seen, 12, 12]
    assert steps[-1].cache_bytes == steps[-1].predicted_cache_bytes


def test_predictors_answer_without_changing_state(tiny_model):
    """Asked any number of times, a prediction is the same, and it is what the cache holds."""
    geometry = Geometry.of(tiny_model.model.config, tiny_model.model.dtype)
    options = {"backend": "hqq", "nbits": "4", "q_group_size": "32", "residual_length": "3"}
    for name, raw in (("quantized", options), ("h2o", {"budget": "6"}), ("snapkv", {"budget": "6", "window": "2"})):
        choice = strategies.choose(name, raw)
        predictor = strategies.get(name).predictor(choice.options, geometry, 64)
        cache_run = CacheRun(tiny_model.model, choice, 64)
        ids = torch.arange(100, 120)[None]
        with torch.inference_mode():
            cache_run.forward(ids[:, :8])
            predictor.feed(8)
            for i in range(8, 20):
                cache_run.forward(ids[:, i : i + 1])
                predictor.feed(1)
                answers = {(predictor.cache_bytes(), predictor.policy_bytes()) for _ in range(3)}
                measured = sum(r.total_bytes for r in cache_run.measure(slots=False)), cache_run.policy_bytes()
                assert answers == {measured}, (name, i)


def test_options_follow_the_papers(tiny_model):
    """Defaults as the references use them, and the choices they leave open."""
    assert strategies.choose("snapkv").options["pooling"] == "average"
    assert strategies.choose("knorm").options["skip_layers"] == 2
    h2o = strategies.choose("h2o", {"budget": 8, "recent": 0})  # heavy hitters only
    layer = strategies.get("h2o").make_layer(0, h2o.options)
    assert layer.scorer.recent == 0
    assert strategies.get("h2o").make_layer(0, strategies.choose("h2o", {"budget": 8}).options).scorer.recent == 4
    listing = {s["name"]: s for s in (strategy.to_dict() for strategy in strategies.all_strategies())}
    assert "SnapKV (Li et al., NeurIPS 2024)" in listing["snapkv"]["reference"]
    assert all(s["reference"] for s in listing.values())
