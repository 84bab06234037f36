"""Against a real vLLM server on loopback: attach, load with a shared prefix, check what kvviz saw.

Skipped unless KVVIZ_VLLM_PYTHON names the python of a venv with vLLM (packaging/vllm/build-venv.sh
makes one; `make test-vllm` builds it and runs this). The server starts in its own process group
with a 1 GiB KV cache and one thread, is stopped afterwards, and listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

VLLM_PYTHON = os.environ.get("KVVIZ_VLLM_PYTHON")

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON or not Path(VLLM_PYTHON).is_file(),
    reason="needs a real vLLM: set KVVIZ_VLLM_PYTHON to the python of the vLLM venv "
    "(packaging/vllm/build-venv.sh, or run `make test-vllm`)",
)

# More than two 128-token blocks: vLLM caches and matches prefixes in whole blocks.
SHARED_PREFIX = (
    "You are a careful assistant working for a small public library. Visitors ask about books, opening "
    "hours, events and local history. Answer in plain English, briefly and precisely, and say so when you "
    "do not know. "
) * 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from kvviz.attach.server import VllmServer
    from kvviz.engine.model_cache import ensure_default_model

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    model_dir = ensure_default_model()
    srv = VllmServer(VLLM_PYTHON, str(model_dir), log_path=log)
    try:
        srv.start(timeout=400)
    except RuntimeError as exc:
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        pytest.fail(f"{exc}\n--- server log tail ---\n{tail}")
    print(f"\nvLLM answered /health after {srv.start_s:.0f} s", flush=True)
    try:
        yield srv
    finally:
        srv.stop()


def test_attach_under_load(server):
    from kvviz.attach.client import first_model, stream_completion
    from kvviz.attach.load import run_load
    from kvviz.attach.poller import Poller
    from kvviz.attach.session import Session, predict

    poller = Poller(server.url, interval=0.2).start()
    try:
        with httpx.Client(timeout=60, trust_env=False) as client:
            model = first_model(client, server.url)
            own = stream_completion(client, server.url, model, "The capital of France is", max_tokens=32)
        load = run_load(
            server.url,
            model,
            requests=8,
            concurrency=4,
            duration=120,
            shared_prefix=SHARED_PREFIX,
            max_tokens=96,
            ignore_eos=True,
        )
        deadline = time.monotonic() + 30  # usage falls back once the requests are done
        while time.monotonic() < deadline:
            _, point = poller.latest()
            if point is not None and point.usage == 0 and point.running == 0 and poller.deriver.usage_peak > 0:
                break
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        assert poller.stop(timeout=5)

    points = poller.points
    assert not [e for e in poller.errors], poller.errors
    assert load.summary()["completed"] == 8, load.summary()
    peak = max(p.usage for p in points)
    assert peak > 0, "usage never rose above zero during the load"
    assert points[-1].usage == 0, "usage did not fall back after the load"
    assert max(p.running for p in points) >= 2
    hits = poller.deriver.totals["prefix_hits"]
    assert hits > 0, "no prefix-cache hits counted"
    assert any(p.tokens_per_s and p.tokens_per_s > 0 for p in points)
    assert points[-1].ttft["p50"] is not None and points[-1].itl["p50"] is not None

    assert own.error is None and len(own.tokens) >= 2, own
    assert all(b.t >= a.t for a, b in zip(own.tokens, own.tokens[1:], strict=False))
    assert own.ttft > 0 and len(own.gaps_ms) == len(own.tokens) - 1

    cache = points[-1] and poller.snapshots[-1].cache
    prediction = predict(server.model_dir, cache, "bfloat16")
    assert prediction["ratio"] == pytest.approx(1, rel=0.01), prediction

    session = Session(
        url=server.url,
        model=model,
        cache=cache,
        prediction=prediction,
        snapshots=poller.snapshots,
        requests=[own, *load.records],
        load=load.summary(),
    )
    figures = {
        "server_start_s": server.start_s,
        "usage_peak": peak,
        "usage_peak_tokens": max(p.usage_tokens for p in points),
        "prefix_hits": hits,
        "prefix_queries": poller.deriver.totals["prefix_queries"],
        "own_tokens": len(own.tokens),
        "own_ttft_s": own.ttft,
        "predicted_bytes_per_token": prediction["predicted_bytes_per_token"],
        "allocated_bytes_per_token": prediction["allocated_bytes_per_token"],
        "load_wall_s": load.wall_s,
        "snapshots": len(poller.snapshots),
    }
    print("\nattach figures: " + json.dumps(figures), flush=True)
    assert session.summary()["prefix_hits"] == hits


def test_cli_against_the_real_server(server, tmp_path, capsys):
    import argparse

    from kvviz.attach import session as session_mod
    from kvviz.cli.attach import add_parser, command
    from kvviz.engine.model_cache import ensure_default_model

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "attach.json"
    args = parser.parse_args(
        [
            "attach",
            server.url,
            "--prompt",
            "Once upon a time",
            "--max-tokens",
            "24",
            "--requests",
            "4",
            "--concurrency",
            "2",
            "--duration",
            "60",
            "--shared-prefix",
            SHARED_PREFIX,
            "--interval",
            "0.25",
            "--settle",
            "2",
            "--model-dir",
            str(ensure_default_model()),
            "--dtype",
            "bfloat16",
            "--out",
            str(out),
        ]
    )
    assert command(args) == 0
    text = capsys.readouterr().out
    assert "usage peak" in text and "KV / token" in text
    summary = session_mod.load(out).summary()
    assert summary["own_tokens"] >= 2 and summary["snapshots"] >= 4
    assert summary["predicted_bytes_per_token"] == 23040


def test_restart_mid_session(server):
    """Last in this module: stops the server and starts it again on the same port while kvviz polls."""
    from kvviz.attach.client import first_model, stream_completion
    from kvviz.attach.poller import Poller

    poller = Poller(server.url, interval=0.5).start()
    try:
        with httpx.Client(timeout=60, trust_env=False) as client:
            model = first_model(client, server.url)
            before = stream_completion(client, server.url, model, "One, two, three,", max_tokens=16)
            time.sleep(1.5)
            collected = len(poller.points)
            server.stop()
            time.sleep(1.5)
            assert any(not s.ok for s in poller.snapshots[-3:]), "the poller did not notice the server going away"
            server.start(timeout=400)
            print(f"\nvLLM restarted in {server.start_s:.0f} s", flush=True)
            after = stream_completion(client, server.url, model, "One, two, three,", max_tokens=16)
            time.sleep(1.5)
    finally:
        assert poller.stop(timeout=5)
    assert before.error is None and after.error is None
    assert len(poller.points) > collected  # nothing collected before the restart was lost, and it goes on
    assert poller.deriver.restarts == 1
    messages = [m for _, m in poller.events]
    assert any("restarted" in m for m in messages) and any("answers again" in m for m in messages), messages
    assert any("cannot connect" in m for _, m in poller.errors), poller.errors
    # generation tokens counted across the restart: both requests' tokens, never a negative rate
    assert poller.deriver.totals["generation_tokens"] >= len(before.tokens) + len(after.tokens) - 2
    assert all(p.tokens_per_s is None or p.tokens_per_s >= 0 for p in poller.points)


def test_window_attaches_under_load(server, qtbot, tmp_path):
    """The window's server mode against the real server: own request, a load, usage up and back, a session."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QSettings

    from kvviz.qt.main_window import MainWindow

    window = MainWindow(settings=QSettings(str(tmp_path / "kvviz.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    window.show()
    try:
        mode = window.modes["server"]
        mode.panel.interval.setValue(0.2)
        with qtbot.waitSignal(mode.connection.sigConnected, timeout=20000):
            window.controls.model_panel.set_spec(server.url)
            window.controls.model_panel.load_button.click()
        window.controls.prompt_panel.editor.setPlainText("The capital of France is")
        window.controls.settings_panel.max_new_tokens.setValue(24)
        with qtbot.waitSignal(window.sigRunDone, timeout=60000) as done:
            mode.send_button.click()
        own = window.store.runs[done.args[0]]
        mode.load_panel.set_values({"requests": 8, "concurrency": 4, "duration": 120, "shared_prefix": SHARED_PREFIX})
        with qtbot.waitSignal(mode.connection.sigLoadDone, timeout=150000) as load_done:
            mode.load_button.click()
        qtbot.waitUntil(lambda: mode.series.n and mode.series.column("usage")[-1] == 0, timeout=30000)
        window.redraw()

        assert window.store.status(own.run_id) == "finished" and own.n >= 2
        assert own.trace.prompt_tokens > 0  # counted by the server's /tokenize before sending
        assert load_done.args[0]["completed"] == 8, load_done.args[0]
        usage = mode.series.column("usage")
        assert np.nanmax(usage) > 0 and usage[-1] == 0
        assert np.nanmax(mode.series.column("hit_rate_total")) > 0
        (x, _), *_ = mode.view.latency_plot.curve_data(own.run_id)
        assert x[0] == own.trace.prompt_tokens + 1  # decode steps, placed at tokens in context
        assert "allocated ÷ predicted" in mode.panel.card.text()
        saved = window.modes["server"].save(tmp_path / "server.json")
        reopened = window.file_actions.open_trace(saved)
        assert len(reopened.snapshots) >= mode.series.n and reopened.load["completed"] == 8
        if os.environ.get("KVVIZ_SCREENSHOT"):
            window.grab().save(os.environ["KVVIZ_SCREENSHOT"])
    finally:
        window.close()
