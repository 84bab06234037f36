"""Entry point: `kvviz COMMAND ...` runs headless; `kvviz` alone (or with window options) opens the window."""

from __future__ import annotations

import os
import sys

# Before torch loads: OpenMP threads that busy-wait between parallel regions starve the other
# threads of a process on few cores (measured: the window decoded at a fifth of headless speed).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from kvviz import cli  # noqa: E402

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
