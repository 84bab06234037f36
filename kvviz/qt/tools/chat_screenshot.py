"""A conversation played through the window's Chat tab: the README's screenshot and `kvviz demo`'s scene.

`python -m kvviz.qt.tools.chat_screenshot docs/` chats ten turns with the default model through attention sinks
(4 + 252), through the window's own controls and worker, and saves `QWidget.grab()` of the window:
docs/screenshot-conversation.png (1920x1080, dark); `--all` adds 1280x720 and the light theme. Prints each turn's
figures and the worst event-loop stall while the chat streamed (a 5 ms timer, as `kvviz bench --gui` times it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvviz.present import conversation_turn
from kvviz.qt.tools import drive, screenshot

SYSTEM = "You are a helpful assistant who answers in a few sentences."
MESSAGES = [
    "Hello! What is the key-value cache of a transformer?",
    "Why does it grow with every token?",
    "What happens when a conversation gets very long?",
    "How do attention sinks keep the memory flat?",
    "What is lost when old tokens are evicted?",
    "How is a sliding window different?",
    "What does quantizing the cache do?",
    "Why keep the cache between the turns of a chat?",
    "What is prefix caching?",
    "Thank you. Can you sum it all up in two sentences?",
]
SINK = ("sink", {"sink_tokens": 4, "window": 252})
MAIN = ("screenshot-conversation.png", (1920, 1080), "dark")


def play_chat(window, messages: list[str], strategy: str, options: dict, tokens: int, system: str = "",
              said=None, timeout_s: float = 900) -> bool:
    """Chat `messages` through the Chat tab with `strategy`; True when every turn ended. `said(turn)` is called
    after each turn with its TurnRecord (a caption, a printout)."""
    mode = window.modes["chat"]
    window.set_mode(mode)
    if not drive.choose(window, strategy, options):
        return False
    window.controls.settings_panel.max_new_tokens.setValue(tokens)
    mode.view.system.setText(system)
    for message in messages:
        before = len(mode.trace.turns) if mode.trace is not None else 0
        mode.view.message.setPlainText(message)
        if not mode.send():
            return False
        # a turn ends drawn (sigTurnDone) or refused (the chat is idle again, the window says why)
        drive.wait(lambda: not mode.busy, timeout_s)
        drive.pause(0.2)
        if mode.busy or mode.trace is None or len(mode.trace.turns) <= before:
            return False
        if said is not None:
            said(mode.trace.turns[-1])
    return True


def _print_turn(turn) -> None:
    print(conversation_turn(turn, len(MESSAGES)))


def make(folder: Path, model: str, tokens: int, every_size: bool) -> list[Path]:
    from kvviz.qt.tools.bench import StallMeter

    saved = []
    with screenshot.open_window(MAIN[1], model) as (app, window):
        meter = StallMeter()  # the window's event loop while the chat streams (the target: < 50 ms)
        meter.start()
        try:
            if not play_chat(window, MESSAGES, *SINK, tokens, SYSTEM, said=_print_turn):
                raise RuntimeError(window.last_error or "the chat did not finish")
        finally:
            meter.stop()
        print(f"worst event-loop stall during the chat: {meter.worst_ms:.1f} ms")
        saved.append(screenshot.grab(app, window, folder / MAIN[0], *MAIN[1:]))
        if every_size:
            for size in ((1280, 720), (1920, 1080)):
                for theme_name in ("dark", "light"):
                    path = folder / f"conversation-{size[0]}x{size[1]}-{theme_name}.png"
                    saved.append(screenshot.grab(app, window, path, size, theme_name))
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="docs", type=Path)
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each answer may have (default 64)")
    parser.add_argument("--all", action="store_true", help="also 1280x720 and the light theme")
    args = parser.parse_args(argv)
    for path in make(args.folder, args.model, args.tokens, args.all):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
