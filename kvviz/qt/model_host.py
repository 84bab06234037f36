"""The model every mode uses: the worker on its own thread, the model it loaded, and the strategies it listed.

Requests leave as queued signals and every engine call happens on the worker's thread (kvviz.qt.worker); answers
come back as the worker's signals, which this object hears first, so that its state (`card`, `loading`,
`listing`) is current when the window's and the modes' slots run. The modes' own jobs live on the same thread
(kvviz.qt.jobs).

Every way out of the window ends here: `stop()` asks the worker to stop and joins its thread, however long the
step in progress takes (a model load inside transformers cannot be interrupted before it reports its progress).
A QThread destroyed while it runs aborts the whole process, so a thread left running is joined at exit too. Once
the worker's thread exists, Python's garbage is collected on the GUI thread only (kvviz.qt.collector).
"""

from __future__ import annotations

import atexit
import sys
import weakref
from typing import Any

from PySide6.QtCore import QObject, Signal

from kvviz.qt import collector
from kvviz.qt.worker import Worker, WorkerThread

PATIENCE_MS = 1800  # a stop that takes longer than this says on stderr what it waits for


class ModelHost(QObject):
    sigRequestLoad = Signal(str, str, str)  # to the worker: spec, dtype, device

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.card: dict[str, Any] | None = None  # the loaded model's card (plus "threads")
        self.loaded_spec: str | None = None  # the spec of the model loaded now: the only one worth remembering
        self.loading = False
        self.listing: list = []  # the engine's strategies: (Strategy, available, reason), once the worker listed them
        garbage = collector.install()  # from now on Python collects on this (the GUI) thread only
        self.worker = Worker()
        self.thread = WorkerThread(self.worker)
        worker = self.worker
        worker.sigCollect.connect(garbage.settle)
        # connected before anyone else's: the state here is current when the window's slots run
        worker.sigReady.connect(self._on_ready)
        worker.sigModelLoaded.connect(self._on_model_loaded)
        worker.sigModelFailed.connect(self._on_model_failed)
        self.sigRequestLoad.connect(worker.load)
        atexit.register(_join_at_exit, weakref.ref(self))

    def start(self) -> None:
        """Start the worker's thread (after the window connected to the worker's signals: it reports at once)."""
        self.thread.start()

    def load(self, spec: str, dtype: str = "auto", device: str = "auto") -> None:
        self.loading = True
        self.sigRequestLoad.emit(spec, dtype, device)

    def defaults(self) -> dict[str, dict[str, Any]] | None:
        """Each strategy's option defaults ({name: {option: default}}, present.strategy_label's); None until the
        worker has listed the strategies."""
        if not self.listing:
            return None
        return {s.name: {o.name: o.default for o in s.options} for s, _, _ in self.listing}

    def stop(self, patience_ms: int = PATIENCE_MS) -> None:
        """Stop the worker and join its thread: what it does stops at its next step or progress report."""
        if not self.thread.isRunning():
            return
        self.thread.stop()
        if not self.thread.wait(patience_ms):
            print("kvviz: waiting for the worker thread to end: the model load in progress stops at its next step",
                  file=sys.stderr, flush=True)
            self.thread.wait()

    # -- from the worker ----------------------------------------------------------------------------

    def _on_ready(self, listing) -> None:
        self.listing = list(listing)

    def _on_model_loaded(self, spec: str, card: dict) -> None:
        self.loading = False
        self.card = card
        self.loaded_spec = spec

    def _on_model_failed(self, spec: str, message: str) -> None:
        self.loading = False


def _join_at_exit(host: weakref.ref) -> None:
    """At interpreter exit, a worker thread no window joined (a script that ended without closing its window)."""
    alive = host()
    if alive is not None:
        try:
            alive.stop()
        except RuntimeError:  # its Qt object is already gone, and the thread with it
            pass
