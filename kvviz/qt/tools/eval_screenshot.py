"""Make the Evaluate tab's screenshots from a real evaluation: `python -m kvviz.qt.tools.eval_screenshot docs/`.

Evaluates the default model on the first 600 tokens of Alice's Adventures in Wonderland with a full
cache, a sliding window of 128, attention sinks (4 + 124) and a 2-bit HQQ-quantized cache, through the
window's own controls and worker. Saves `QWidget.grab()` of the window while it evaluates (the third
strategy half-way) and once it is done: docs/screenshot-evaluate.png (1600x1000, dark), and with
`--all` the window at 1280x720 and 1920x1080 in both themes (evaluate-<width>x<height>-<theme>.png).
Prints the frames' redraw cost and each strategy's tokens/s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvviz.qt.tools import drive, screenshot

STRATEGIES = [
    ("dynamic", {}),
    ("sliding", {"window": 128}),
    ("sink", {"sink_tokens": 4, "window": 124}),
    ("quantized", {"backend": "hqq", "nbits": 2}),
]
MAIN = ("screenshot-evaluate.png", (1600, 1000), "dark")
SIZES = ((1280, 720), (1920, 1080))


def make(folder: Path, model: str, tokens: int, every_size: bool) -> list[Path]:
    saved = []
    with screenshot.open_window(MAIN[1], model) as (app, window):
        mode = window.modes["evaluate"]
        window.set_mode(mode)
        mode.list_panel.set_entries(STRATEGIES)
        mode.document_panel.tokens.setValue(tokens)
        if mode.start() is None:
            raise RuntimeError(window.last_error or "Evaluate was not enabled")
        half = tokens // 2
        drive.wait(lambda: not mode.busy or (2 in mode.active and mode.series[2].n >= half), 3600)
        if mode.busy:
            saved.append(screenshot.grab(app, window, folder / "evaluate-live.png", MAIN[1], MAIN[2]))
        count, started = window.redraws.count, window.redraws.cost_ms
        drive.wait(lambda: not mode.busy, 3600)
        print(f"frames drawn: {window.redraws.count}, smoothed frame cost {window.redraws.cost_ms:.1f} ms "
              f"(at the half-way shot: {started:.1f} ms, {count} frames)")
        for s in mode.series:
            rate = s.tokens_per_s()
            print(f"{s.short_label()}: {s.state}, {s.n} predictions, perplexity {s.perplexity():.2f}, "
                  f"2nd half {s.second_half_perplexity():.2f}, {rate:.1f} tokens/s" if s.n else s.short_label())
        saved.append(screenshot.grab(app, window, folder / MAIN[0], *MAIN[1:]))
        if every_size:
            for width, height in SIZES:
                for theme_name in ("dark", "light"):
                    path = folder / f"evaluate-{width}x{height}-{theme_name}.png"
                    saved.append(screenshot.grab(app, window, path, (width, height), theme_name))
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="docs", type=Path)
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--all", action="store_true", help="also 1280x720 and 1920x1080 in both themes")
    args = parser.parse_args(argv)
    for path in make(args.folder, args.model, args.tokens, args.all):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
