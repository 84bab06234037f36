"""`kvviz.qt.app.main` in a child process: quick to show, clean to close even mid-load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

CODE = "import sys; from kvviz.qt.app import main; sys.exit(main(sys.argv[1:]))"


def launch(tmp_path, *args: str, timeout: float = 60) -> tuple[int, str, float]:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CODE, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stderr, time.perf_counter() - started


def run_child(tmp_path, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


CLOSE_TIMED = (
    "def close():\n"
    "    started = time.perf_counter()\n"
    "    w.close()\n"
    "    print('CLOSE_S', time.perf_counter() - started)\n"
)


def close_seconds(stdout: str) -> float:
    return float(next(line for line in stdout.splitlines() if line.startswith("CLOSE_S")).split()[1])


def test_window_opens_and_closes_cleanly_mid_load(tmp_path):
    # kvviz's own entry point, closed 1.5 s after the loop starts: the engine import or the model load is under way
    code = (
        "import sys, time\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication(['kvviz'])\n"
        "from kvviz.qt import main_window\n"
        "original = main_window.MainWindow.closeEvent\n"
        "def timed(self, event):\n"
        "    started = time.perf_counter()\n"
        "    original(self, event)\n"
        "    print('CLOSE_S', time.perf_counter() - started, flush=True)\n"
        "main_window.MainWindow.closeEvent = timed\n"
        "from kvviz.qt.app import main\n"
        "sys.exit(main(['--model', 'default', '--quit-after', '1.5']))\n"
    )
    proc = run_child(tmp_path, code)
    assert proc.returncode == 0, proc.stderr
    assert "QThread: Destroyed" not in proc.stderr
    assert "Traceback" not in proc.stderr
    # closing joins the worker: the engine's import or the load stops at its next step, and past 1.8 s says so
    seconds = close_seconds(proc.stdout)
    assert seconds < 2.5 or "kvviz: waiting for the worker thread to end" in proc.stderr, (seconds, proc.stderr)


def test_closing_mid_run_exits_zero(tmp_path):
    code = (
        "import sys, time\n"
        "from PySide6.QtCore import QTimer\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "from kvviz.qt.main_window import MainWindow\n"
        "w = MainWindow()\n"
        "w.controls.settings_panel.max_new_tokens.setValue(4000)\n"
        + CLOSE_TIMED +
        "def close_once_generating():\n"
        "    run = w.store.runs.get(1)\n"
        "    if run is not None and len(run.trace.steps) >= 3:\n"
        "        close()\n"
        "    else:\n"
        "        QTimer.singleShot(20, close_once_generating)\n"
        "def started(spec, ok):\n"
        "    assert ok\n"
        "    w.start_run()\n"
        "    close_once_generating()\n"
        "w.sigModelReady.connect(started)\n"
        "w.load_model('tiny')\n"
        "w.show()\n"
        "rc = app.exec()\n"
        "assert not w.model.thread.isRunning() and w.store.runs[1].trace.steps\n"
        "sys.exit(rc)\n"
    )
    proc = run_child(tmp_path, code)
    assert proc.returncode == 0, proc.stderr
    assert "QThread: Destroyed" not in proc.stderr
    assert close_seconds(proc.stdout) < 2.5  # the run stops after its current step


def test_smoke_test_flag_runs_four_tokens_and_exits_zero(tmp_path):
    rc, stderr, _ = launch(tmp_path, "--smoke-test", timeout=300)
    assert rc == 0, stderr
    assert "QThread: Destroyed" not in stderr


def test_open_trace_file_adds_a_run(qtbot, window, tmp_path):
    from kvviz.files.trace import LayerRecord, SlotState, StepRecord, Trace
    from kvviz.files.trace import load as load_trace

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
    run_id = window.show_kept(load_trace(path))
    window.redraw()
    assert window.runs_table.cell(run_id, "tokens") == "3"
    (x, _), *_ = window.modes["local"].view.memory_plot.curve_data(run_id)
    assert list(x) == [4, 5, 6]


@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_closes_an_idle_window_as_its_close_button_does(tmp_path, signum, status):
    code = (
        "import sys\n"
        "from PySide6.QtCore import QTimer\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication(['kvviz'])\n"
        "QTimer.singleShot(300, lambda: print('READY', flush=True))  # the event loop runs: the window is idle\n"
        "from kvviz.qt.app import main\n"
        "sys.exit(main(['--no-load']))\n"
    )
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "READY", proc.communicate()[1]
    time.sleep(0.5)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr and "Error calling Python override" not in stderr
    assert list(tmp_path.rglob("kvviz.conf")), "closing saves the settings, as the close button does"


def test_every_way_out_joins_the_worker_even_inside_a_load_that_reports_nothing(tmp_path):
    """The cause of issue 36's abort: a window closed while its worker sat in a step that cannot be interrupted (a
    model load inside transformers, 4 s here) left the thread running, and Python's exit destroyed the QThread:
    SIGABRT. The close now waits for the step to end, says on stderr what it waits for, and the process exits 0."""
    code = (
        "import sys, time\n"
        "from PySide6.QtCore import QSettings\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "from kvviz.engine import models\n"
        "real = models.load_model\n"
        "def silent(spec, **options):\n"
        "    time.sleep(4)  # no progress reported: nothing to interrupt it at\n"
        "    return real(spec, **options)\n"
        "models.load_model = silent\n"
        "from kvviz.qt.main_window import MainWindow\n"
        "from kvviz.qt.tools import drive\n"
        "w = MainWindow(QSettings(sys.argv[1], QSettings.Format.IniFormat))\n"
        "w.show()\n"
        "drive.wait(lambda: bool(w.controls.strategy_panel.names()), 120)\n"
        "w.load_model('tiny')\n"
        "drive.pause(0.5)\n"
        "w.close()\n"
        "print('RUNNING_AFTER_CLOSE', w.model.thread.isRunning(), flush=True)\n"
    )
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "kvviz.ini")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "RUNNING_AFTER_CLOSE False" in proc.stdout
    assert "kvviz: waiting for the worker thread to end" in proc.stderr
    assert "QThread: Destroyed" not in proc.stderr and "Traceback" not in proc.stderr
