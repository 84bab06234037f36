"""Drive the window from a script the way a user does: the GUI bench, the demo and the README screenshot.

An application (offscreen where there is no display), waiting on the event loop, and loading and
running through the window's own controls and worker. Only the window's public parts are used.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kvviz import interrupts


def application(name: str = "kvviz"):
    """The QApplication, created offscreen on Linux when there is no display."""
    if not os.environ.get("QT_QPA_PLATFORM") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        if sys.platform.startswith("linux"):
            os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from PySide6.QtCore import qInstallMessageHandler
    from PySide6.QtWidgets import QApplication

    if os.environ.get("QT_QPA_PLATFORM") == "offscreen":
        qInstallMessageHandler(_without_offscreen_notes)
    return QApplication.instance() or QApplication([name])


def _without_offscreen_notes(mode, context, message: str) -> None:
    """Qt's messages, less the offscreen platform's note that it cannot resize windows to their hints (printed
    for every window a script opens; there is no screen to resize on)."""
    if "does not support propagateSizeHints" not in message:
        print(message, file=sys.stderr)


@contextmanager
def scratch_window(name: str, size: tuple[int, int], model: str | None = None) -> Iterator[tuple[Any, Any]]:
    """The application and a shown window of `size`, its strategies listed and `model` loaded if given; its
    settings in a folder of its own, so that a script never reads or changes the user's. Closed and the
    folder removed at the end. Raises RuntimeError if the model does not load."""
    app = application(name)
    from PySide6.QtCore import QSettings

    from kvviz.qt.main_window import MainWindow
    from kvviz.qt.quit_signals import QuitSignals

    global _quit
    folder = tempfile.mkdtemp(prefix=f"{name}-")
    window = MainWindow(settings=QSettings(os.path.join(folder, "kvviz.ini"), QSettings.Format.IniFormat))
    window.resize(*size)
    window.show()
    _quit = QuitSignals()
    try:
        wait(lambda: bool(window.controls.strategy_panel.names()), 60)
        if model is not None and not load(window, model):
            raise RuntimeError(f"the window could not load {model!r}: {window.last_error}")
        yield app, window
    finally:
        _quit.restore()
        _quit = None
        window.close()
        window.settings.sync()  # what closing saved is written now, not again into the removed folder later
        shutil.rmtree(folder, ignore_errors=True)


_quit = None  # the scratch window's QuitSignals: Ctrl-C or SIGTERM ends a script where it waits


def wait(predicate: Callable[[], bool], timeout_s: float, changed=None) -> bool:
    """Run the event loop until predicate() holds or timeout_s passes; the predicate's last value.

    changed: a signal after which the predicate may hold; it is checked only then. Without one it is
    checked every 20 ms, and that timer wakes the GUI thread 50 times a second: a window run timed while a
    script polls it decoded 2-3 % slower than one nobody watches.
    """
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()

    def check(*_args) -> None:
        if predicate():
            loop.quit()

    poll = QTimer()
    if _quit is not None:
        _quit.sigReceived.connect(loop.quit)
    if changed is None:
        poll.setInterval(20)
        poll.timeout.connect(check)
        poll.start()
    else:
        changed.connect(check)
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    try:
        if not predicate():
            loop.exec()
    finally:
        poll.stop()
        if changed is not None:
            changed.disconnect(check)
        if _quit is not None:
            _quit.sigReceived.disconnect(loop.quit)
    if _quit is not None and _quit.received is not None:
        raise interrupts.Terminated() if _quit.received == signal.SIGTERM else KeyboardInterrupt()
    return predicate()


def pause(seconds: float) -> None:
    """Let the window run (draw, record) for a while."""
    wait(lambda: False, seconds)


def load(window, spec: str, timeout_s: float = 600) -> bool:
    """Load a model through the window's worker; True when it loaded."""
    outcome: list[bool] = []

    def slot(loaded_spec: str, ok: bool) -> None:
        outcome.append(ok)

    window.sigModelReady.connect(slot)
    try:
        window.load_model(spec)
        return wait(lambda: bool(outcome), timeout_s, changed=window.sigModelReady) and outcome[0]
    finally:
        window.sigModelReady.disconnect(slot)


def choose(window, strategy: str, options: dict[str, Any] | None = None) -> bool:
    """Pick a strategy and set its options in the Controls dock; False when it is not available here."""
    panel = window.controls.strategy_panel
    if not panel.set_current(strategy):
        return False
    for name, value in (options or {}).items():
        panel.set_option(name, value)
    return True


def run(window, tokens: int, timeout_s: float = 900, extra_settings: dict[str, Any] | None = None) -> int | None:
    """Run the prompt and strategy in the controls for `tokens` tokens and wait for the end; the run's id, or
    None when Run was not possible or the worker refused the run (window.last_error says why)."""
    window.controls.settings_panel.max_new_tokens.setValue(tokens)
    run_id = window.start_run(extra_settings)
    if run_id is not None:
        wait(lambda: window.store.generating is None, timeout_s, changed=window.store.sigRunEnded)
    return run_id if run_id in window.store.runs else None  # a refused run is withdrawn from the store
