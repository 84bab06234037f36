"""Make the README screenshot from real runs: `python -m kvviz.qt.screenshot docs/screenshot-window.png`.

Runs the default model twice through the window (a growing dynamic cache, then an attention-sink
cache whose window evicts the middle), overlays both, and saves `QWidget.grab()` of the window.
"""

from __future__ import annotations

import argparse
import os
import sys

from kvviz.qt import drive

PROMPT = (
    "Write a detailed, step by step explanation of how a transformer language model generates text one "
    "token at a time, and why it keeps a key-value cache while it does so."
)


def make(path: str, model: str = "default", tokens: int = 96, theme_name: str = "dark") -> str:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    app = drive.application("kvviz-screenshot")
    from PySide6.QtCore import QSettings

    from kvviz.qt.main_window import MainWindow

    ini = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"kvviz-shot-{os.getpid()}.ini")
    window = MainWindow(settings=QSettings(ini, QSettings.Format.IniFormat))
    window.resize(1600, 1000)
    window.set_theme(theme_name)
    window.show()
    try:
        drive.wait(lambda: bool(window.controls.strategy_panel.names()), 60)
        if not drive.load(window, model, 300):
            raise RuntimeError(window.last_error)
        window.controls.prompt_panel.set_text(PROMPT)
        runs = []
        for strategy, options in (("dynamic", {}), ("sink", {"sink_tokens": 4, "window": 60})):
            drive.choose(window, strategy, options)
            runs.append(drive.run(window, tokens))
        window.runs_table.select_runs(runs)
        window.redraw()
        for _ in range(10):
            app.processEvents()
        window.grab().save(path)
    finally:
        window.close()
        try:
            os.remove(ini)
        except OSError:
            pass
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default="docs/screenshot-window.png")
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--theme", default="dark")
    args = parser.parse_args(argv)
    make(args.path, args.model, args.tokens, args.theme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
