"""The window's "vLLM server" mode against a loopback server replaying what a real vLLM 0.32 answered.

The replay (tests/attach/conftest.py) plays back recorded /metrics bodies and a recorded completion
stream; the same window against a real vLLM is in tests/attach/test_vllm_integration.py.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from kvviz.attach import session as session_file
from kvviz.attach.request_trace import STRATEGY
from tests.attach.conftest import DATA, MODEL, dead_url, recorded, replay_server  # noqa: F401 - fixtures
from tests.qt.conftest import load, run, tab

PHASES = ["idle", "load", "after", "restarted", "restarted_after"]


def attach(qtbot, window, url: str) -> None:
    """Type the URL into the model chooser and press Load, as a user would."""
    window.modes["server"].panel.model_dir.setText(str(DATA / "smollm2-135m"))
    window.modes["server"].panel.interval.setValue(0.1)
    window.controls.model_panel.set_spec(url)
    with qtbot.waitSignal(window.modes["server"].connection.sigConnected, timeout=10000):
        window.controls.model_panel.load_button.click()


def send(qtbot, window) -> int:
    with qtbot.waitSignal(window.sigRunDone, timeout=10000) as done:
        window.modes["server"].send_button.click()
    return done.args[0]


def test_server_button_switches_the_controls_and_the_view(window):
    window.controls.model_panel.server_button.click()
    assert window.controls.source_tabs.currentIndex() == tab(window, "server") and window.mode.key == "server"
    assert window.modes["server"].panel.isVisibleTo(window) and not window.controls.model_panel.isVisibleTo(window)
    assert not window.modes["server"].send_button.isEnabled()  # not connected yet
    window.views.setCurrentIndex(tab(window, "local"))  # the central tab leads the controls too
    assert window.controls.source_tabs.currentIndex() == tab(window, "local")
    assert window.controls.strategy_panel.isVisibleTo(window)


def test_attach_plots_scrapes_and_own_request_joins_the_runs(qtbot, window, replay_server, tmp_path):  # noqa: F811
    replay_server.metrics = [recorded(f"metrics_{name}.txt") for name in PHASES]
    replay_server.chunk_delay = 0.01
    attach(qtbot, window, replay_server.url)
    server = window.modes["server"]
    assert window.mode.key == "server"
    assert "Disconnect" == server.panel.connect_button.text()
    qtbot.waitUntil(lambda: server.series.n >= len(PHASES) + 1, timeout=10000)
    # the prediction comes once the window's worker has imported the engine: later than the scrapes on a busy machine
    qtbot.waitUntil(lambda: "23,040 B" in server.panel.card.text(), timeout=60000)
    card = server.panel.card.text()
    assert "46,592 tokens" in card and "23,040 B (bfloat16)" in card  # the prediction from the model's config
    assert "1.0002" in card  # allocated 23,045.6 B / predicted 23,040 B
    usage = server.series.column("usage")
    assert np.nanmax(usage) > 0 and usage[-1] == 0  # rose under the recorded load, fell back
    assert len(server.series.restarts) == 1
    window.redraw()
    # the restart is told in the status bar and marked where it happened in every time plot
    assert "restarted" in window.statusBar().currentMessage()
    for plot in server.view.time_plots:
        assert plot.restart_positions() == server.series.restarts

    run_id = send(qtbot, window)
    series = window.store.runs[run_id]
    assert window.store.status(run_id) == "finished"
    assert series.trace.strategy["name"] == STRATEGY and series.n == 12
    assert series.trace.prompt_tokens == 0  # the replay has no /tokenize: positions count from 0
    assert window.runs_table.cell(run_id, "strategy") == STRATEGY and window.runs_table.cell(run_id, "tokens") == "12"
    assert window.runs_table.cell(run_id, "peak cache MiB") == "–"  # no cache numbers for a served run
    assert window.runs_table.cell(run_id, "of mem. limit") == "–"  # nor a memory-bound floor
    window.redraw()
    (x, ms), *_ = server.view.latency_plot.curve_data(run_id)
    assert len(x) == 11 and np.all(ms >= 0)  # decode gaps; the first token's wait is the prefill star
    assert series.prefill_ms == pytest.approx(series.trace.steps[0].wall_ms)
    assert window.modes["local"].view.memory_plot.curve_data(run_id) == []  # the cache views leave served runs out
    assert window.token_view.series is series and "The answer is: 201" in window.token_view.toPlainText()

    # unknown stays unknown: a served step has no cache, predicted or RSS bytes and no token id, and the
    # table, the CSV export and a saved trace say so instead of showing 0
    assert {(s.cache_bytes, s.predicted_cache_bytes, s.rss_bytes, s.token_id) for s in series.trace.steps} == {
        (None, None, None, None)
    }
    assert window.runs_table.cell(run_id, "peak RSS MiB") == "–"
    saved = json.loads(window.file_actions.save_selected_trace(tmp_path / "served.json").read_text())
    keys = ("cache_bytes", "predicted_cache_bytes", "rss_bytes", "token_id")
    assert all(step[key] is None for step in saved["steps"] for key in keys)
    assert saved["summary"]["peak_cache_bytes"] is None and saved["summary"]["peak_rss_bytes"] is None
    with window.file_actions.export_runs_csv(tmp_path / "runs.csv").open(encoding="utf-8") as f:
        line = next(r for r in csv.DictReader(f) if r["run"] == f"#{run_id}")
    assert line["peak cache MiB"] == line["peak RSS MiB"] == line["cache MiB at end"] == ""
    assert line["new tokens"] == "12" and float(line["tokens/s"]) > 0


def test_local_and_served_runs_share_the_latency_plot(qtbot, window, replay_server):  # noqa: F811
    load(qtbot, window, "tiny")
    local = run(qtbot, window, tokens=6)
    attach(qtbot, window, replay_server.url)
    served = send(qtbot, window)
    assert window.store.shown == [local, served]  # the served run joins the overlay
    window.redraw()
    plot = window.modes["server"].view.latency_plot
    assert plot.curve_data(local) and plot.curve_data(served)
    window.set_mode("local")
    window.redraw()
    view = window.modes["local"].view
    assert view.latency_plot.curve_data(served) and view.memory_plot.curve_data(local)
    assert view.memory_plot.curve_data(served) == []


def test_session_saves_and_opens_again(qtbot, window, replay_server, tmp_path):  # noqa: F811
    replay_server.metrics = [recorded(f"metrics_{name}.txt") for name in PHASES[:3]]
    attach(qtbot, window, replay_server.url)
    send(qtbot, window)
    qtbot.waitUntil(lambda: window.modes["server"].series.n >= 4, timeout=10000)
    path = window.modes["server"].save(tmp_path / "server.json")
    saved = session_file.load(path)
    assert saved.model == MODEL and len(saved.requests) == 1 and len(saved.snapshots) >= 4
    assert saved.prediction["ratio"] == pytest.approx(1.0, rel=0.01)

    window.modes["server"].disconnect()
    rows = window.runs_table.rowCount()
    opened = window.file_actions.open_trace(path)
    assert isinstance(opened, session_file.Session)
    assert window.modes["server"].series.n == len(saved.points())  # the plots again, derived from the raw scrapes
    assert window.runs_table.rowCount() == rows + 1  # its own request as a run again
    assert "opened from a session file" in window.modes["server"].view.summary.text()
    assert window.mode.key == "server"


def test_unreachable_server_says_so_and_keeps_what_was_there(qtbot, window, dead_url):  # noqa: F811
    load(qtbot, window, "tiny")
    kept = run(qtbot, window, tokens=4)
    window.controls.model_panel.set_spec(dead_url)
    with qtbot.waitSignal(window.modes["server"].connection.sigConnectFailed, timeout=10000):
        window.controls.model_panel.load_button.click()
    assert "Could not attach" in window.last_error and "cannot connect" in window.last_error
    assert window.error_bar.isVisibleTo(window)
    assert kept in window.store.runs and window.model.card is not None  # the local model and run are still there
    server = window.modes["server"]
    assert server.panel.connect_button.text() == "Connect" and not server.send_button.isEnabled()


def test_not_vllm_and_bad_addresses_are_refused_with_a_reason(qtbot, window, replay_server):  # noqa: F811
    replay_server.metrics = [
        '# HELP python_info Python platform information\n# TYPE python_info gauge\npython_info{version="3.11"} 1.0\n'
    ]
    window.set_mode("server")
    with qtbot.waitSignal(window.modes["server"].connection.sigConnectFailed, timeout=10000):
        window.modes["server"].connect_to(replay_server.url)
    assert "does not look like a vLLM server" in window.last_error
    assert not window.modes["server"].connect_to("ftp://example")
    assert "not an http(s) address" in window.last_error
    assert not window.modes["server"].connect_to("")
    assert "Type the server's address" in window.last_error


def test_connect_flag_attaches_and_closing_mid_session_is_clean(tmp_path, replay_server):  # noqa: F811
    from tests.qt.test_app import launch

    replay_server.chunk_delay = 0.05
    rc, stderr, _ = launch(tmp_path, "--connect", replay_server.url, "--quit-after", "6")
    assert rc == 0, stderr
    assert "Traceback" not in stderr
    assert replay_server.scrapes >= 2  # it attached and polled until the window closed
