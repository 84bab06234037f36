"""Requests served through the window's Serve tab: the docs' pictures of the block map.

`python -m kvviz.qt.tools.serve_screenshot docs/` serves twelve questions about a shared text, arriving at four a
second, with the default model through the window's own controls and worker, twice: first through a pool of 256
blocks of 16 tokens (docs/screenshot-serve.png, taken while all twelve hold blocks: the prefix's blocks shared, 256
cells), then through one too small for them all (docs/screenshot-serve-preempted.png, taken three steps after the
first preemption: the pool full, the run before overlaid on the pool plot). 1920x1080, dark; `--all` adds 1280x720
and the light theme of the second, once it ended.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvviz.qt.tools import drive, screenshot

PREFIX = ("You answer questions about a small library. It opens at nine and closes at five, lends up to six books for "
          "three weeks, charges nothing for late returns, keeps a reading room on the first floor, holds story hours "
          "for children on Saturdays, and asks for quiet in every room but the hall.")
QUESTIONS = ["When does the library open?", "How many books can I borrow?", "What happens if I return a book late?",
             "Where is the reading room?", "When are the story hours?", "Can I talk in the reading room?",
             "How long can I keep a book?", "When does the library close?", "Is there a fee for late books?",
             "What is on the first floor?", "Who are the story hours for?", "Where may I talk?"]
POOLS = (("screenshot-serve.png", 256), ("screenshot-serve-preempted.png", 20))
SIZE = (1920, 1080)
GROUP = "full_attention"


def preempted_steps(run) -> int:
    """Steps since the first preemption (0 before it)."""
    first = min((t for r in run.requests for t in r.preempted_at), default=None)
    return 0 if first is None else sum(1 for step in run.steps if step.started >= first)


def serve(window, blocks: int, tokens: int, when=lambda run: False, grab=None, timeout_s: float = 900) -> bool:
    """Serve QUESTIONS after PREFIX through `blocks` blocks in the Serve tab; `grab()` once, the first time `when(run)`
    holds while it serves (the demo's scene grabs nothing). True when every request was answered."""
    mode = window.modes["serve"]
    window.set_mode(mode)
    load, pool = mode.panel.load, mode.panel.pool
    load.prompts.setPlainText("\n".join(QUESTIONS))
    load.prefix.setPlainText(PREFIX)
    load.rate.setValue(4.0)
    load.new_tokens.setValue(tokens)
    pool.page_size.setValue(16)
    pool.blocks.setValue(blocks)
    grabbed = []

    def full() -> None:
        if not grabbed and mode.run is not None and mode.run.steps and when(mode.run):
            grabbed.append(True)
            window.redraw()
            grab()

    mode.sigChanged.connect(full)
    try:
        if mode.start() is None:
            return False
        drive.wait(lambda: not mode.busy, timeout_s)
    finally:
        mode.sigChanged.disconnect(full)
    drive.pause(0.3)
    return mode.run is not None and all(r.finished for r in mode.run.requests)


def make(folder: Path, model: str, tokens: int, every_size: bool) -> list[Path]:
    saved = []
    with screenshot.open_window(SIZE, model) as (app, window):
        (roomy, large), (tight, small) = POOLS
        # all twelve holding blocks at once; three steps after the first preemption
        for name, blocks, when in ((roomy, large, lambda run: len(run.steps[-1].pool.tables[GROUP]) >= 12),
                                   (tight, small, lambda run: preempted_steps(run) >= 3)):
            path = folder / name
            if not serve(window, blocks, tokens, when, lambda path=path: saved.append(
                    screenshot.grab(app, window, path, SIZE, "dark"))):
                raise RuntimeError(window.last_error or "the requests were not all answered")
            if not saved or saved[-1] != path:
                raise RuntimeError(f"the moment {name} shows never came: another pool or load is needed")
        if every_size:
            for size in ((1280, 720), (1920, 1080)):
                for theme_name in ("dark", "light"):
                    path = folder / f"serve-{size[0]}x{size[1]}-{theme_name}.png"
                    saved.append(screenshot.grab(app, window, path, size, theme_name))
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="docs", type=Path)
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, default=48, help="tokens each answer may have (default 48)")
    parser.add_argument("--all", action="store_true", help="also 1280x720 and the light theme")
    args = parser.parse_args(argv)
    for path in make(args.folder, args.model, args.tokens, args.all):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
