"""Entry point: `kvviz COMMAND ...` runs headless; `kvviz` alone (or with window options) opens the window."""

from __future__ import annotations

import sys

from kvviz.cli import main as cli

# Arguments that belong to the window rather than to a command.
WINDOW_FLAGS = ("--open", "--connect", "--smoke-test", "--model", "--theme", "--no-load")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in WINDOW_FLAGS or argv[0].startswith(tuple(f + "=" for f in WINDOW_FLAGS)):
        from kvviz.qt.app import main as window_main

        return window_main(argv)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
