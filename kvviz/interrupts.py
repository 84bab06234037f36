"""How kvviz ends on Ctrl-C and SIGTERM: both as a KeyboardInterrupt, so that what was measured is kept.

Exit status as shells report it: 130 for Ctrl-C (SIGINT), 143 for SIGTERM (a desktop session ending,
`kill`). Each signal is also remembered: a Ctrl-C that lands inside a library's import can come out as
another error (transformers' lazy modules turn it into an import error; a half-imported extension then
refuses to load again), and the command still ends as interrupted. Stdlib only.
"""

from __future__ import annotations

import signal
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C but with its own exit status."""


_received: list[int] = []  # the signals that arrived, in order


def _raise(signum, frame) -> None:
    _received.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def catch() -> None:
    """From now on Ctrl-C and SIGTERM raise (and are remembered) in the main thread; elsewhere Python cannot
    set handlers."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _raise)


def received() -> KeyboardInterrupt | None:
    """The first Ctrl-C or SIGTERM that arrived since `catch()`, or None."""
    if not _received:
        return None
    return Terminated() if _received[0] == signal.SIGTERM else KeyboardInterrupt()


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal's number: 130 for Ctrl-C, 143 for SIGTERM."""
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)
