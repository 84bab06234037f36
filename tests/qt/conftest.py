"""pytest-qt fixtures: offscreen platform, no network, settings in a temporary folder."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from PySide6.QtCore import QSettings  # noqa: E402


@pytest.fixture
def settings(tmp_path):
    """A QSettings file of this test only, so tests never read or write the user's settings."""
    return QSettings(str(tmp_path / "kvviz.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def window(qtbot, settings):
    """The real main window with no model loaded yet; shut down cleanly after the test."""
    from kvviz.qt.main_window import MainWindow

    win = MainWindow(settings=settings)
    qtbot.addWidget(win)
    win.show()
    qtbot.waitUntil(lambda: bool(win.controls.strategy_panel.names()), timeout=30000)
    yield win
    if not win.closing:
        win.close()
    assert not win.model.thread.isRunning()


class Driver:
    """Drives a window as a user would: load a model, run a prompt, wait for the end."""

    def __init__(self, qtbot):
        self.qtbot = qtbot

    def load(self, win, spec: str = "tiny", timeout: int = 120000) -> None:
        load(self.qtbot, win, spec, timeout)

    def run(self, win, strategy: str = "dynamic", options=None, tokens: int = 12, prompt: str = "Hello there",
            timeout: int = 120000) -> int:
        return run(self.qtbot, win, strategy, options, tokens, prompt, timeout)


@pytest.fixture
def drive(qtbot):
    return Driver(qtbot)


def tab(win, key: str) -> int:
    """The index of mode `key`'s tabs (they follow kvviz.qt.modes.MODES)."""
    return list(win.modes).index(key)


def load(qtbot, win, spec: str = "tiny", timeout: int = 120000) -> None:
    with qtbot.waitSignal(win.sigModelReady, timeout=timeout) as blocker:
        win.load_model(spec)
    assert blocker.args == [spec, True], win.last_error


def run(qtbot, win, strategy: str = "dynamic", options=None, tokens: int = 12, prompt: str = "Hello there",
        timeout: int = 120000) -> int:
    """Run through the window's own controls and wait for the run to end; returns the run id."""
    win.controls.prompt_panel.editor.setPlainText(prompt)
    win.controls.settings_panel.max_new_tokens.setValue(tokens)
    assert win.controls.strategy_panel.set_current(strategy), strategy
    for name, value in (options or {}).items():
        win.controls.strategy_panel.set_option(name, value)
    with qtbot.waitSignal(win.sigRunDone, timeout=timeout) as blocker:
        run_id = win.start_run()
        assert run_id is not None
    assert blocker.args[0] == run_id
    return run_id
