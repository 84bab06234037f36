"""`kvviz.qt.app.main` in a child process: quick to show, clean to close even mid-load."""

from __future__ import annotations

import os
import subprocess
import sys
import time

CODE = "import sys; from kvviz.qt.app import main; sys.exit(main(sys.argv[1:]))"


def launch(tmp_path, *args: str, timeout: float = 60) -> tuple[int, str, float]:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CODE, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stderr, time.perf_counter() - started


def test_window_opens_and_closes_cleanly_mid_load(tmp_path):
    # closes 1.5 s after the loop starts: the engine import or the default model load is under way
    rc, stderr, wall = launch(tmp_path, "--model", "default", "--quit-after", "1.5")
    assert rc == 0, stderr
    assert "QThread: Destroyed" not in stderr
    assert "Traceback" not in stderr
    assert wall < 1.5 + 2.0 + 3.0  # start-up (imports), the 1.5 s, and at most 2 s to close


def test_closing_mid_run_exits_zero(tmp_path):
    code = (
        "import os, sys\n"
        "from PySide6.QtCore import QTimer\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "from kvviz.qt.main_window import MainWindow\n"
        "w = MainWindow(autoload='tiny')\n"
        "w.settings_panel.max_new_tokens.setValue(5000)\n"
        "def started(spec, ok):\n"
        "    assert ok\n"
        "    w.start_run()\n"
        "    QTimer.singleShot(800, w.close)\n"
        "w.sigModelReady.connect(started)\n"
        "w.show()\n"
        "rc = app.exec()\n"
        "assert not w.thread_stuck and w.runs[1].trace.steps\n"
        "sys.exit(rc)\n"
    )
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "QThread: Destroyed" not in proc.stderr


def test_smoke_test_flag_runs_four_tokens_and_exits_zero(tmp_path):
    rc, stderr, _ = launch(tmp_path, "--smoke-test", timeout=300)
    assert rc == 0, stderr
    assert "QThread: Destroyed" not in stderr


def test_open_trace_file_adds_a_run(qtbot, window, tmp_path):
    from kvviz.trace import LayerRecord, SlotState, StepRecord, Trace
    from kvviz.trace import load as load_trace

    def layers(i):  # one layer holding the 4 prompt tokens and i generated ones, 256 bytes each
        return [LayerRecord(keys_bytes=128 * (4 + i), values_bytes=128 * (4 + i), seq_len=4 + i, capacity=4 + i,
                            spans=[[int(SlotState.FULL), 4 + i]])]

    steps = [
        StepRecord(index=i, phase="prefill" if i == 0 else "decode", token_id=1, token="a", wall_ms=10.0 + i,
                   cache_bytes=256 * (4 + i), predicted_cache_bytes=256 * (4 + i), rss_bytes=1, strategy="dynamic",
                   layers=layers(i))
        for i in range(3)
    ]
    path = Trace(model={"name": "m"}, strategy={"name": "dynamic", "options": {}}, prompt="p", prompt_tokens=4,
                 steps=steps).save(tmp_path / "t.json")
    run_id = window.add_trace(load_trace(path))
    window.redraw()
    assert window.runs_table.row_text(run_id)[3] == "3"
    (x, _), _ = window.memory_plot.curve_data(run_id)
    assert list(x) == [4, 5, 6]
