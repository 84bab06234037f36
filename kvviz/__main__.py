"""Entry point: `kvviz COMMAND ...` runs headless; `kvviz` alone (or with window options) opens the window."""

from __future__ import annotations

import sys

from kvviz import interrupts

# Arguments that belong to the window rather than to a command.
WINDOW_FLAGS = ("--open", "--connect", "--smoke-test", "--model", "--theme", "--no-load")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in WINDOW_FLAGS or argv[0].startswith(tuple(f + "=" for f in WINDOW_FLAGS)):
        from kvviz.qt.app import main as window_main

        return window_main(argv)
    # Ctrl-C or SIGTERM from the first moment (importing the commands takes a second on a busy machine) ends kvviz
    # as one during a command does: a line on stderr and 130 or 143, never a traceback
    try:
        with interrupts.caught():
            from kvviz.cli import main as cli

            return cli.main(argv)
    except KeyboardInterrupt as interrupt:
        return interrupts.said(interrupt)


if __name__ == "__main__":
    sys.exit(main())
