"""`kvviz demo`: a scripted tour of the window sized for a 1080p screen recording.

One prompt through dynamic, static, quantized int4 (hqq) and sink caches, then one run that
switches from dynamic to quantized int4 mid-run, each step labelled by a large banner; with
`record` the whole tour is written to MP4 (or GIF without imageio-ffmpeg) by kvviz.qt.recorder.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from kvviz.present import FAILED
from kvviz.qt import drive

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
    _app = drive.application("kvviz-demo")  # held: the QApplication lives while the tour plays
    from PySide6.QtCore import QSettings

    from kvviz.qt.main_window import MainWindow

    ini = os.path.join(tempfile.mkdtemp(prefix="kvviz-demo-"), "kvviz.ini")
    window = MainWindow(settings=QSettings(ini, QSettings.Format.IniFormat))
    window.resize(*SIZE)
    window.show()
    banner = Banner(window)
    banner.show("kvviz: the key-value cache of a transformer, live")
    drive.wait(lambda: bool(window.controls.strategy_panel.names()), 60)
    control = window.recorder
    if record is not None:
        record = control.start(record, fps)
    failures = 0
    refusals: list[str] = []
    window.engine.worker.sigSwitchRefused.connect(lambda strategy, why: refusals.append(why))
    try:
        banner.show(f"Loading the model ({model})…")
        if not drive.load(window, model):
            print(f"kvviz demo: could not load {model!r}: {window.last_error}", file=sys.stderr)
            return 1
        window.controls.prompt_panel.set_text(DEMO_PROMPT)
        window.controls.settings_panel.max_new_tokens.setValue(tokens)
        drive.pause(pause)
        for label, strategy, options, switch in TOUR:
            if not drive.choose(window, strategy, options):
                banner.show(label + "  (skipped: not available here)")
                drive.pause(pause)
                continue
            banner.show(label)
            drive.pause(pause)
            run_id = window.start_run({"stop_at_eos": False})
            if run_id is None:
                banner.show(label + f"  (could not start: {window.last_error})")
                failures += 1
                drive.pause(pause)
                continue
            series = window.store.runs[run_id]
            if switch is not None:
                at, target, target_options = switch
                drive.wait(lambda s=series, a=at: s.finished or s.n >= a, 600)
                if not series.finished:
                    drive.choose(window, target, target_options)
                    banner.show(f"Switching to {target} int4 at token {series.n}…")
                    if not window.switch_strategy():
                        failures += 1
            if not drive.wait(lambda s=series: s.finished, 900):
                failures += 1
                break
            if window.store.status(run_id) == FAILED:
                failures += 1
                banner.show(label + f"  (failed: {window.last_error})")
            drive.pause(pause)
        failures += len(refusals)
        window.runs_table.select_runs(list(window.store.runs))
        banner.show("All runs overlaid: memory, speed and fidelity side by side")
        drive.pause(2 * pause)
    finally:
        if record is not None:
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
