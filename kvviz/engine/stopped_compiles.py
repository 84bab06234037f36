"""Compiles that a Stop left finishing on their own threads, and the wait for them before a model is fed again.

torch.compile cannot be interrupted: a stopped run leaves its compile running on its own thread. While one runs,
torch.compiler.is_compiling() is True on every thread (torch keeps one flag for the process), so transformers runs
any model as if it were being traced (a static cache's tensors not marked static, no packed GQA): whatever feeds a
model (a run, an evaluation, answering, a sweep) waits for them before its first feed (`CacheRun.warm_up`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_running: list[threading.Thread] = []
_lock = threading.Lock()


def leave_running(thread: threading.Thread) -> None:
    """A compile whose run was stopped: it finishes on `thread`, and what feeds a model next waits for it."""
    with _lock:
        _running.append(thread)


def stopped_compiles() -> list[threading.Thread]:
    """The compiles a Stop left that are still running (join them before the process exits under them)."""
    with _lock:
        _running[:] = [thread for thread in _running if thread.is_alive()]
        return list(_running)


def wait_for_stopped_compiles(notify: Callable[[str], None], cancel: threading.Event | None = None) -> None:
    """Return once no stopped compile runs, or once `cancel` is set; says so through `notify` while it waits."""
    running = stopped_compiles()
    if not running:
        return
    notify("waiting for a stopped torch.compile to finish (it cannot be interrupted)")
    for thread in running:
        while thread.is_alive() and not (cancel is not None and cancel.is_set()):
            thread.join(0.1)
    notify("")
