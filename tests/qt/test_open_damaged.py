"""The window survives any file: damaged traces opened through File > Open's own path are refused with a
message, valid variants open and draw, no exception escapes (not even from the drawing slots), and the runs
already open stay. `kvviz --no-load --open BAD.json` exits with a message and status 1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.files.trace_mutants import base_traces, mutants

SAMPLE = 80  # mutants opened in the window (every few of the corpus, all kinds included)


@pytest.fixture(scope="module")
def corpus(tiny_model, tmp_path_factory):
    return mutants(base_traces(tiny_model), tmp_path_factory.mktemp("mutants"))


def test_damaged_files_never_raise_out_of_the_open_path(window, qtbot, corpus, monkeypatch):
    escaped = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: escaped.append(f"{kind.__name__}: {value}"))
    actions, table = window.file_actions, window.runs_table
    assert actions.open_trace(next(m.path for m in corpus if m.name == "b0-as-is")) is not None
    step = max(1, len(corpus) // SAMPLE)
    sample = corpus[::step] + [m for m in corpus if m.expect == "accept" or "billion" in m.name][::2]
    opened = refused = 0
    for mutant in sample:
        rows = table.rowCount()
        result = actions.open_trace(mutant.path)  # an exception here fails the test
        window.redraw()  # draw the opened run now, as the redraw timer would
        qtbot.wait(1)
        if mutant.expect == "refuse":
            assert result is None, mutant.name
            assert str(mutant.path.name) in actions.last_message, (mutant.name, actions.last_message)
            assert table.rowCount() == rows  # nothing added, and the runs already open stay
            actions.message_box.close()
            refused += 1
        else:
            assert result is not None and table.rowCount() == rows + 1, mutant.name
            opened += 1
    assert not escaped, escaped
    assert refused >= 60 and opened >= 20, (refused, opened)


def test_no_load_open_bad_files_exits_1_with_a_message(corpus, tmp_path):
    named = {m.name: m.path for m in corpus}
    bad = [named["b0-switches-true"], named["deep-lists"], named["b0-billion-positions"]]
    good = named["b1-as-is"]
    opens = [arg for path in (*bad, good) for arg in ("--open", str(path))]
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "kvviz", "--no-load", *opens, "--quit-after", "3"],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert done.returncode == 1, done.stderr  # never 134, never 0
    for path in bad:
        assert f"kvviz: error: {path}" in done.stderr
    assert f"kvviz: error: {good}" not in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
