"""`kvviz demo`: a scripted tour of the window sized for a 1080p screen recording.

One prompt through dynamic, static, quantized int4 (hqq) and sink caches, then one run that
switches from dynamic to quantized int4 mid-run, each step labelled by a large banner; with
`record` the whole tour is written to MP4 (or GIF without imageio-ffmpeg) by kvviz.qt.recorder.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

DEMO_PROMPT = "Explain in a few sentences what the key-value cache of a transformer does."
SIZE = (1920, 1080)

# label, strategy, options, switch (step, strategy, options) or None
TOUR = [
    ("1 / 5  DynamicCache: grows by one token per step", "dynamic", {}, None),
    ("2 / 5  StaticCache: every slot preallocated, written in place", "static", {}, None),
    ("3 / 5  QuantizedCache int4 (hqq): old tokens in 4 bits, a full-precision residual", "quantized",
     {"backend": "hqq", "nbits": 4, "residual_length": 16, "q_group_size": 32}, None),
    ("4 / 5  Attention sinks: the first 4 tokens plus a sliding window of 24", "sink",
     {"sink_tokens": 4, "window": 24}, None),
    ("5 / 5  Live switch: dynamic, then quantized int4 from token 24", "dynamic", {},
     (24, "quantized", {"backend": "hqq", "nbits": 4, "residual_length": 16, "q_group_size": 32})),
]


def _wait(app, predicate, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        app.processEvents()
        time.sleep(0.01)
    return True


def _pause(app, seconds: float) -> None:
    _wait(app, lambda: False, seconds)


class Banner:
    def __init__(self, window):
        from PySide6.QtCore import Qt
        from PySide6.QtWidgets import QLabel

        self.window = window
        self.label = QLabel(window)
        self.label.setObjectName("demoBanner")
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.label.setStyleSheet(
            "QLabel#demoBanner { background: rgba(20, 24, 32, 215); color: #ffffff; font-size: 30px;"
            " font-weight: 600; padding: 14px 28px; border: 2px solid #4c9be8; border-radius: 12px; }"
        )
        self.label.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)

    def show(self, text: str) -> None:
        print(f"kvviz demo: {text}", file=sys.stderr, flush=True)
        self.label.setText(text)
        self.label.adjustSize()
        width = min(self.label.width(), self.window.width() - 80)
        self.label.resize(width, self.label.height())
        self.label.move((self.window.width() - width) // 2, self.window.menuBar().height() + 24)
        self.label.show()
        self.label.raise_()


def run_demo(record: Path | None = None, model: str = "default", tokens: int = 64, fps: float = 10.0,
             pause: float = 1.5) -> int:
    """Play the tour; returns 0 when every step ran (steps a machine cannot run are labelled skipped)."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "kvviz", "demo"])
    from kvviz.qt.main_window import MainWindow

    ini = os.path.join(tempfile.mkdtemp(prefix="kvviz-demo-"), "kvviz.ini")
    window = MainWindow(settings=QSettings(ini, QSettings.Format.IniFormat))
    window.resize(*SIZE)
    window.show()
    banner = Banner(window)
    banner.show("kvviz: the key-value cache of a transformer, live")
    _wait(app, lambda: bool(window.strategy_panel.names()), 60)
    control = getattr(window, "recorder", None)
    if record is not None:
        if control is None:
            from kvviz.qt.recorder import install_recorder

            control = install_recorder(window, fps)
        record = control.start(record, fps)
    failures = 0
    try:
        done: list[str] = []
        window.sigModelReady.connect(lambda spec, ok: done.append("ok" if ok else "failed"))
        banner.show(f"Loading the model ({model})…")
        window.load_model(model)
        if not _wait(app, lambda: bool(done), 600) or done[0] != "ok":
            print(f"kvviz demo: could not load {model!r}: {window.last_error}", file=sys.stderr)
            return 1
        window.prompt_panel.editor.setPlainText(DEMO_PROMPT)
        window.settings_panel.max_new_tokens.setValue(tokens)
        _pause(app, pause)
        finished: list[int] = []
        window.sigRunDone.connect(lambda run_id, status: finished.append(run_id))
        can_switch = hasattr(window, "switch_strategy")
        for label, strategy, options, switch in TOUR:
            if switch is not None and not can_switch:
                banner.show(label + "  (skipped: this window cannot switch)")
                _pause(app, pause)
                continue
            if not window.strategy_panel.set_current(strategy):
                banner.show(label + "  (skipped: not available here)")
                _pause(app, pause)
                continue
            for name, value in options.items():
                window.strategy_panel.set_option(name, value)
            banner.show(label)
            _pause(app, pause)
            finished.clear()
            run_id = window.start_run({"stop_at_eos": False})
            if run_id is None:
                banner.show(label + f"  (could not start: {window.last_error})")
                failures += 1
                _pause(app, pause)
                continue
            if switch is not None:
                at, target, target_options = switch
                _wait(app, lambda r=run_id, a=at: bool(finished) or window.runs[r].n >= a, 600)
                if not finished:
                    window.strategy_panel.set_current(target)
                    for name, value in target_options.items():
                        window.strategy_panel.set_option(name, value)
                    banner.show(f"Switching to {target} int4 at token {window.runs[run_id].n}…")
                    if not window.switch_strategy():
                        failures += 1
            if not _wait(app, lambda: bool(finished), 900):
                failures += 1
                break
            if window.status_of.get(run_id) == "failed":
                failures += 1
                banner.show(label + f"  (failed: {window.last_error})")
            _pause(app, pause)
        window.runs_table.select_runs(list(window.runs))
        banner.show("All runs overlaid: memory, speed and fidelity side by side")
        _pause(app, 2 * pause)
    finally:
        if record is not None and control is not None:
            control.stop()
            stats = control.recorder.stats()
            print(
                f"kvviz demo: recorded {stats['path']}: {stats['frames']} frames in {stats['seconds']:.1f} s "
                f"({stats['grab_fps']:.1f} grabs/s, {stats['mean_grab_ms']:.1f} ms a grab), "
                f"{(stats['bytes'] or 0) / 1e6:.1f} MB",
                file=sys.stderr,
            )
        window.close()
    return 0 if failures == 0 else 1
