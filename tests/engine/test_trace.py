import json

import pytest

from kvviz import trace
from kvviz.engine import decode, strategies


@pytest.fixture(scope="module")
def sample(tiny_model):
    settings = decode.GenerationSettings(max_new_tokens=8, stop_at_eos=False)
    decoder = decode.Decoder(tiny_model, strategies.choose("sink", {"window": "4"}), settings, "trace me")
    list(decoder)
    return decoder.trace


def test_round_trip(tmp_path, sample):
    path = sample.save(tmp_path / "run.json")
    again = trace.load(path)
    assert again.to_dict() == sample.to_dict()
    data = json.loads(path.read_text())
    assert data["format"] == "kvviz-trace" and data["version"] == 1
    for key in ("name", "architecture", "num_layers", "num_kv_heads", "head_dim", "dtype", "device"):
        assert key in data["model"]
    assert set(data["strategy"]) == {"name", "options"}
    step = data["steps"][1]
    for key in ("index", "phase", "token_id", "token", "wall_ms", "cache_bytes", "predicted_cache_bytes", "rss_bytes"):
        assert key in step
    assert set(step["layers"][0]) >= {"keys_bytes", "values_bytes", "seq_len", "capacity", "layer_ms"}
    for key in ("new_tokens", "prefill_ms", "decode_ms_mean", "decode_ms_p95", "decode_tokens_per_s",
                "peak_cache_bytes", "peak_rss_bytes"):
        assert data["summary"][key] is not None


@pytest.mark.parametrize(
    "content,message",
    [
        (b"\x89PNG\r\n", "not JSON text"),
        (b"[1, 2]", 'expected "format": "kvviz-trace"'),
        (b'{"format": "chrome-trace"}', 'expected "format": "kvviz-trace"'),
        (b'{"format": "kvviz-trace", "version": 9}', "version 9; this kvviz reads version 1"),
        (b'{"format": "kvviz-trace", "version": 1, "model": {}, "strategy": {}, "prompt_tokens": 1}', "'steps'"),
    ],
)
def test_malformed_and_foreign_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(trace.TraceError, match=message):
        trace.load(path)


def test_wrong_step_field_named(tmp_path, sample):
    data = sample.to_dict()
    data["steps"][2]["cache_bytes"] = "lots"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(trace.TraceError, match=r"steps\[2\]: field 'cache_bytes'"):
        trace.load(path)


def test_missing_file():
    with pytest.raises(trace.TraceError, match="cannot read"):
        trace.load("/no/such/trace.json")
