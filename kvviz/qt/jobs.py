"""A job on the worker's thread (an evaluation, a sweep, a chat's turn), from both sides.

`WorkerJob` is the engine's side: a QObject moved to the worker's thread, whose queued slots run the job there (the
one thread that runs torch). It keeps the job's cancel event and the ids asked to stop before they began, so that
`cancel` may be called from any thread at any moment: before the job starts, while it runs, or after it ended.

`JobControl` is the window's side: the id of the job running (answers about any other are stale and ignored), the
next id, and Stop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from PySide6.QtCore import QObject

from kvviz.qt.worker import Worker


class WorkerJob(QObject):
    def __init__(self, worker: Worker):
        """Made on the GUI thread before the worker's thread starts; it then lives on that thread as the worker's
        child, and goes with the worker when the thread ends (never in Python's garbage collection, which may run
        on any thread: a QObject destroyed there while the GUI thread destroys others can deadlock on Qt's locks)."""
        super().__init__()
        self.moveToThread(worker.thread())  # its slots run on the worker's thread, after the worker's own
        self.setParent(worker)
        self.worker = worker
        self._lock = threading.Lock()
        self._cancel: threading.Event | None = None
        self._cancelled: set[int] = set()

    def cancel(self, job_id: int | None = None) -> None:
        """Stop job `job_id` (or the one running) at its next check; a job asked to stop before it began stops at
        once when it begins (any thread)."""
        with self._lock:
            if job_id is not None:
                self._cancelled.add(job_id)
            if self._cancel is not None:
                self._cancel.set()

    @contextmanager
    def running(self, job_id: int) -> Iterator[threading.Event]:
        """Around the job's work (worker thread): its cancel event, set already when it was stopped before."""
        cancel = threading.Event()
        with self._lock:
            self._cancel = cancel
            if job_id in self._cancelled:
                cancel.set()
        try:
            yield cancel
        finally:
            with self._lock:
                self._cancel = None
                self._cancelled.discard(job_id)


class JobControl:
    def __init__(self, job: WorkerJob):
        self.job = job
        self.running: int | None = None  # the id of the job in progress
        self._next = 1

    def begin(self) -> int:
        """A new job's id, now the one running."""
        job_id, self._next = self._next, self._next + 1
        self.running = job_id
        return job_id

    def current(self, job_id: int) -> bool:
        """An answer about `job_id` is about the job running (else it is stale)."""
        return job_id == self.running

    def end(self, job_id: int) -> bool:
        """Job `job_id` is over; False (and nothing changes) when it is not the one running."""
        if job_id != self.running:
            return False
        self.running = None
        return True

    def stop(self) -> bool:
        """Ask the job running to stop; False when none runs."""
        if self.running is None:
            return False
        self.job.cancel(self.running)
        return True

    def shutdown(self) -> None:
        """The window closes: whatever runs stops."""
        self.job.cancel()
