"""The Choose tab's screenshot from a kept sweep: `python -m kvviz.qt.tools.choose_screenshot SWEEP.json OUT.png`.

Opens the window (with `--model` loaded, else none: a kept sweep needs none), opens the sweep into the Choose mode
as File ▸ Open does, picks the configuration of the frontier the answer names first (its curves shown beside the
frontier) and saves `QWidget.grab()` of the window at `--size` in `--theme`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvviz.qt.tools import drive, screenshot


def make(sweep_path: Path, out: Path, size: tuple[int, int], theme_name: str, model: str | None = None) -> Path:
    from kvviz.files import frontier

    with screenshot.open_window(size, model) as (app, window):
        sweep = window.file_actions.open_trace(sweep_path)
        if sweep is None:
            raise RuntimeError(window.file_actions.last_message)
        said = frontier.answer(sweep)
        line = frontier.frontier(sweep)
        picked = said.smallest or said.best or (line[0] if line else None)
        if picked is not None:
            window.modes["choose"].pick(sweep.configurations.index(picked))
        drive.pause(0.2)
        return screenshot.grab(app, window, out, size, theme_name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="a kvviz-sweep file (kvviz choose --out writes one)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--size", default="1920x1080", help="WIDTHxHEIGHT of the window (default 1920x1080)")
    parser.add_argument("--theme", choices=("dark", "light"), default="dark")
    parser.add_argument("--model", help="load this model first, as the sweep's own user would have (default: none; a "
                        "kept sweep needs none)")
    args = parser.parse_args(argv)
    try:
        width, height = (int(n) for n in args.size.lower().split("x"))
    except ValueError:
        parser.error(f"--size {args.size!r} is not WIDTHxHEIGHT, such as 1920x1080")
    print(make(args.sweep, args.out, (width, height), args.theme, args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
