"""How kvviz ends on Ctrl-C and SIGTERM: both as a KeyboardInterrupt, so that what was measured is kept.

Exit status as shells report it: 130 for Ctrl-C (SIGINT), 143 for SIGTERM (a desktop session ending,
`kill`). A signal that arrives while a module is being imported is delivered again once the import is
over: raised inside an import it can abort the whole process (torch runs Python code from C++ through
pybind11, which cannot pass the exception on), come out as another error (transformers' lazy modules
turn it into an import error) or leave a half-imported extension that refuses to load again. So is one
that arrives inside a finalizer (`__del__`, run by the garbage collector at any moment): Python prints the
exception there as "Exception ignored" and goes on as if no signal came. Stdlib only.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C but with its own exit status."""


RETRY_S = 0.05  # how soon a deferred signal is sent again


def _cannot_raise_here(frame) -> bool:
    """Inside an import or a finalizer: places where an exception aborts, changes or is dropped."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib") or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _send_again(signum: int) -> None:
    # to the main thread itself: raised in the timer's thread, the signal would wait for the main thread's next
    # bytecode, and a main thread blocked in a sleep or a wait would not see it until that ends
    if hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident, signum)
    else:
        signal.raise_signal(signum)


def _raise(signum, frame) -> None:
    if _cannot_raise_here(frame):
        threading.Timer(RETRY_S, _send_again, (signum,)).start()
        return
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def caught():
    """Inside the block Ctrl-C and SIGTERM raise KeyboardInterrupt in the main thread (elsewhere Python cannot
    set handlers); the handlers from before come back at its end (a command run inside another program)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, _raise) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal's number: 130 for Ctrl-C, 143 for SIGTERM."""
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


def said(interrupt: KeyboardInterrupt) -> int:
    """Say on stderr that kvviz was interrupted or terminated; the exit status."""
    status = exit_status(interrupt)
    print("kvviz: interrupted" if status == 130 else "kvviz: terminated", file=sys.stderr)
    return status


@contextlib.contextmanager
def deferred():
    """Ctrl-C and SIGTERM arriving inside the block take effect when it ends (a save is never cut short)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if caught and callable(previous[caught[0]]):
        previous[caught[0]](caught[0], None)
