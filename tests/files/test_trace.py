import json
import subprocess
import sys

import pytest

from kvviz.engine import decode, strategies
from kvviz.files import formats, trace
from kvviz.files.file_format import FileFormat
from kvviz.files.jsonfile import KeptFileError
from kvviz.files.schema import Int, ListOf, Record, Refusal, Text, at


def _rising(record, where):
    if record["values"] != sorted(record["values"]):
        raise Refusal(at(where, "values"), "values in rising order", record["values"])


# A format of this test module, the way kvviz-eval or any later format is declared: schema, rules, build.
FILE_FORMAT = FileFormat(
    name="kvviz-toy",
    version=1,
    kind="kvviz toy file",
    schema=Record({"label": Text(), "values": ListOf(Int(0))}, rules=(_rising,)),
    build=lambda data: (data["label"], data["values"]),
)


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
        (b"\x89PNG\r\n", r"is not a kvviz trace: it is not UTF-8 text \(byte 0x89 at offset 0"),
        (b"", "is empty"),
        (b'{"format": "kvviz-trace", "version": 1, "model": {}', "the JSON text stops short"),
        (b"[1, 2]", 'expected "format": "kvviz-trace"'),
        (b'{"format": "chrome-trace"}', 'expected "format": "kvviz-trace"'),
        (b'{"format": "kvviz-attach"}', "it is a server session"),
        (b'{"format": "kvviz-trace", "version": 9}', "version 9; this kvviz reads version 1"),
        (
            b'{"format": "kvviz-trace", "version": 1, "model": {}, "strategy": {"name": "x"}, "prompt_tokens": 1}',
            r"steps: expected a list .*; the field is missing",
        ),
    ],
)
def test_malformed_and_foreign_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(trace.TraceError, match=message) as caught:
        trace.load(path)
    assert str(path) in str(caught.value)


def test_wrong_step_field_named(tmp_path, sample):
    data = sample.to_dict()
    data["steps"][2]["cache_bytes"] = "lots"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(trace.TraceError, match=
        r'steps\[2\]\.cache_bytes: expected a byte count .* found the text "lots"',
    ):
        trace.load(path)


def test_missing_file():
    with pytest.raises(trace.TraceError, match="cannot read /no/such/trace.json: there is no such file"):
        trace.load("/no/such/trace.json")


def test_unknown_values_stay_unknown(tmp_path, sample):
    """A served request's steps carry no cache, RSS or token id: null in the file, None when read, never 0."""
    data = sample.to_dict()
    del data["summary"]  # it would disagree with the steps changed here
    for step in data["steps"]:
        step.update(cache_bytes=None, predicted_cache_bytes=None, rss_bytes=None, token_id=None, layers=[])
    opened = trace.from_dict(data)
    assert {s.cache_bytes for s in opened.steps} == {None}
    summary = opened.summary()
    assert summary["peak_cache_bytes"] is None and summary["final_cache_bytes"] is None
    assert summary["peak_rss_bytes"] is None and summary["decode_ms_mean"] is not None
    saved = json.loads(opened.save(tmp_path / "served.json").read_text())
    assert saved["steps"][0]["cache_bytes"] is None and saved["summary"]["peak_cache_bytes"] is None


def test_non_finite_numbers_are_saved_as_null(tmp_path, sample):
    """A NaN (e.g. --temperature nan) never makes an invalid JSON file."""
    kept = trace.from_dict(sample.to_dict())
    kept.settings["temperature"] = float("nan")
    kept.steps[0].layers[0].layer_ms = float("inf")
    text = kept.save(tmp_path / "t.json").read_text(encoding="utf-8")

    def refuse(constant):
        raise AssertionError(f"{constant} written into the file")

    data = json.loads(text, parse_constant=refuse)
    assert data["settings"]["temperature"] is None and data["steps"][0]["layers"][0]["layer_ms"] is None
    assert trace.load(tmp_path / "t.json").settings["temperature"] is None


def test_reading_files_imports_neither_torch_nor_transformers(tmp_path, sample):
    """`kvviz trace`, File > Open and --open read files without paying for torch."""
    sample.save(tmp_path / "run.json")
    from tests.attach.test_session_cli import recorded_session

    recorded_session().save(tmp_path / "session.json")
    code = (
        "import sys; from kvviz.files.formats import read_kept; "
        f"a = read_kept({str(tmp_path / 'run.json')!r}); b = read_kept({str(tmp_path / 'session.json')!r}); "
        "print(type(a).__name__, type(b).__name__, [m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["Trace", "Session", "[]"], out.stdout + out.stderr


def test_a_new_format_is_declared_not_coded(tmp_path, monkeypatch):
    """Registering a FileFormat is all a format needs: the one reader checks it and builds its object."""
    monkeypatch.setitem(formats.FORMATS, "kvviz-toy", __name__)
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"format": "kvviz-toy", "version": 1, "label": "a", "values": [1, 2]}')
    bad.write_text('{"format": "kvviz-toy", "version": 1, "label": "a", "values": [2, 1]}')
    assert formats.read_kept(good) == ("a", [1, 2])
    with pytest.raises(KeptFileError, match=r"bad.json: values: expected values in rising order, found a list of 2"):
        formats.read_kept(bad)
