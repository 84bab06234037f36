"""Session files (kvviz-attach v1), the bytes-per-token prediction and `kvviz attach` on a recorded replay."""

from __future__ import annotations

import argparse
import json

import pytest

from kvviz.attach import session as session_mod
from kvviz.attach.metrics import parse
from kvviz.attach.request_trace import is_served, record_trace
from kvviz.attach.session import Session, SessionError, kv_dtype_name, predict
from kvviz.cli.attach import add_parser, command
from kvviz.errors import UsageError
from tests.attach.conftest import DATA, recorded

CONFIG_DIR = DATA / "smollm2-135m"  # config.json of the default model (SmolLM2-135M), as converted by kvviz


def recorded_session() -> Session:
    snaps = [parse(recorded(f"metrics_{n}.txt"), t=float(i)) for i, n in enumerate(("idle", "load", "after"))]
    return Session(url="http://127.0.0.1:8000", model="m", cache=dict(snaps[0].cache), snapshots=snaps)


def test_round_trip(tmp_path):
    s = recorded_session()
    path = s.save(tmp_path / "s.json")
    data = json.loads(path.read_text())
    assert data["format"] == "kvviz-attach" and data["version"] == 1
    again = session_mod.load(path)
    assert again.snapshots == s.snapshots
    assert [p.usage for p in again.points()] == [p.usage for p in s.points()]
    assert again.summary() == s.summary()
    assert again.summary()["prefix_hits"] > 0 and again.summary()["usage_peak"] > 0


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="kvviz-trace"), "local-run trace"),
        (lambda d: d.update(format="other"), 'expected "format": "kvviz-attach"'),
        (lambda d: d.update(version=2), "version 2"),
        (lambda d: d.pop("url"), "url: expected non-empty text; the field is missing"),
        (lambda d: d.update(snapshots={}), "snapshots: expected a list"),
        (lambda d: d["snapshots"][0].pop("t"), r"snapshots\[0\]\.t: expected"),
        (lambda d: d["snapshots"][1].update(usage=2), r"snapshots\[1\]\.usage: expected a finite number from 0 to 1"),
    ],
)
def test_validation_messages(tmp_path, mutate, message):
    data = recorded_session().to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SessionError, match=message):
        session_mod.load(path)


def test_not_json(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(SessionError, match="not JSON"):
        session_mod.load(tmp_path / "x.json")
    with pytest.raises(SessionError, match="cannot read"):
        session_mod.load(tmp_path / "missing.json")


def test_predicted_bytes_per_token_match_the_recorded_allocation():
    cache = parse(recorded("metrics_idle.txt")).cache
    p = predict(CONFIG_DIR, cache, "bfloat16")
    assert p["predicted_bytes_per_token"] == 2 * 3 * 64 * 2 * 30  # K+V x kv heads x head_dim x bf16 x layers
    assert p["ratio"] == pytest.approx(1, rel=0.01)
    assert predict(CONFIG_DIR, cache, "auto")["dtype"] == "bfloat16"  # fp32 checkpoint, vLLM casts on CPU


def test_kv_dtype_resolution():
    assert kv_dtype_name("fp8", "bfloat16", "float32")[0] == "float8_e4m3fn"
    assert kv_dtype_name("auto", "float16", "float32")[0] == "float16"
    assert kv_dtype_name("auto", "auto", "bfloat16")[0] == "bfloat16"
    with pytest.raises(ValueError):
        kv_dtype_name("int3", None, None)


def parse_args(*argv):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["attach", *argv])


def test_cli_on_a_replay(replay_server, tmp_path, capsys):
    # the CLI's check scrape, then the poller's baseline (what came before attach is not counted), load, after
    replay_server.metrics = [recorded(f"metrics_{n}.txt") for n in ("idle", "idle", "load", "after")]
    out = tmp_path / "session.json"
    args = parse_args(
        replay_server.url,
        "--requests",
        "3",
        "--concurrency",
        "2",
        "--duration",
        "10",
        "--interval",
        "0.05",
        "--settle",
        "0.3",
        "--model-dir",
        str(CONFIG_DIR),
        "--dtype",
        "bfloat16",
        "--out",
        str(out),
        "--json",
    )
    assert command(args) == 0
    report = json.loads(capsys.readouterr().out)
    summary = report["summary"]
    assert summary["usage_peak"] > 0 and summary["usage_final"] == 0
    assert summary["prefix_hits"] > 0
    assert summary["own_requests"] == 1 and summary["own_tokens"] == 12
    assert report["load"]["completed"] == 3
    assert report["prediction"]["ratio"] == pytest.approx(1, rel=0.01)
    loaded = session_mod.load(out)
    assert len(loaded.requests) == 4 and loaded.summary()["snapshots"] == summary["snapshots"]
    own = loaded.requests[0]
    run = record_trace(loaded.url, loaded.model, own)
    assert [step.phase for step in run.steps] == ["prefill"] + ["decode"] * 11
    assert run.text == own.text and is_served(run)
    assert sum(step.wall_ms for step in run.steps) == pytest.approx(1000 * own.tokens[-1].t)
    # and it opens again from the command line
    assert command(parse_args(str(out), "--json")) == 0
    assert json.loads(capsys.readouterr().out)["summary"] == loaded.summary()
    (tmp_path / "bad.json").write_text('{"format": "kvviz-trace", "version": 1}')
    with pytest.raises(UsageError, match="local-run trace"):
        command(parse_args(str(tmp_path / "bad.json")))


def test_cli_text_summary(replay_server, capsys):
    assert command(parse_args(replay_server.url, "--interval", "0.05", "--settle", "0")) == 0
    text = capsys.readouterr().out
    assert "46,592 tokens in blocks of 128" in text and "own request" in text


def test_cli_unreachable(dead_url):
    with pytest.raises(RuntimeError, match="cannot attach to .*cannot connect"):
        command(parse_args(dead_url, "--settle", "0"))


def test_cli_not_vllm():
    from prometheus_client import CollectorRegistry, start_http_server

    server, thread = start_http_server(0, addr="127.0.0.1", registry=CollectorRegistry())
    try:
        with pytest.raises(RuntimeError, match="does not look like a vLLM server"):
            command(parse_args(f"http://127.0.0.1:{server.server_port}", "--settle", "0"))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(2)


@pytest.mark.parametrize(
    "argv",
    [
        ["--requests", "-1"],
        ["--concurrency", "0"],
        ["--duration", "0"],
        ["--interval", "0"],
        ["--max-tokens", "0"],
        ["--model-dir", "/nonexistent"],
        ["--out", "/nonexistent/dir/x.json"],
        ["--dtype", "int4"],
    ],
)
def test_cli_usage_errors(dead_url, argv):
    with pytest.raises(UsageError):
        command(parse_args(dead_url, *argv))
