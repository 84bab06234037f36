"""The local model: the worker on its own thread, the model it loaded, and its runs fed into the run store.

Requests leave as queued signals (load, run, switch) and every engine call happens on the worker's
thread; answers come back as the worker's signals. A run's one record is the decoder's own `Trace`:
it is attached to the run in the store when the worker starts the run, and each step the worker
reports is a record appended to it.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from kvviz.present import FAILED, RUNNING, STARTING, final_status
from kvviz.qt.evaluator import Evaluator
from kvviz.qt.run_store import RunStore
from kvviz.qt.worker import Worker, WorkerThread
from kvviz.trace import Trace


class LocalEngine(QObject):
    sigRequestLoad = Signal(str, str, str)  # to the worker: spec, dtype, device
    sigRequestRun = Signal(int, object)  # to the worker: run id, request dict
    sigRequestSwitch = Signal(str, object)  # to the worker's switch desk: strategy, options

    def __init__(self, store: RunStore, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.card: dict[str, Any] | None = None  # the loaded model's card (plus "threads")
        self.loading = False
        self.stuck = False  # the thread did not end in time when the window closed
        self.worker = Worker()
        self.evaluator = Evaluator(self.worker)  # the Evaluate mode's door to the worker, on its thread too
        self.thread = WorkerThread(self.worker)
        worker = self.worker
        # connected before anyone else's: the state here is current when the window's slots run
        worker.sigModelLoaded.connect(self._on_model_loaded)
        worker.sigModelFailed.connect(self._on_model_failed)
        worker.sigRunStarted.connect(self._on_run_started)
        worker.sigStep.connect(self._on_step)
        worker.sigRunFinished.connect(self._on_run_finished)
        worker.sigRunFailed.connect(self._on_run_failed)
        self.sigRequestLoad.connect(worker.load)
        self.sigRequestRun.connect(worker.run)
        self.sigRequestSwitch.connect(worker.switches.request)

    def start(self) -> None:
        """Start the worker's thread (after the window connected to the worker's signals: it reports at once)."""
        self.thread.start()

    # -- requests -----------------------------------------------------------------------------------

    def load(self, spec: str, dtype: str = "auto", device: str = "auto") -> None:
        self.loading = True
        self.sigRequestLoad.emit(spec, dtype, device)

    def run(self, header: Trace, request: dict[str, Any]) -> int:
        """Add the run to the store (its header until the worker's trace arrives) and start it; its id."""
        run_id = self.store.add(header, STARTING, generating=True)
        self.sigRequestRun.emit(run_id, request)
        return run_id

    def switch(self, strategy: str, options: dict[str, Any]) -> None:
        """Ask the running generation to switch; the worker answers sigSwitchAccepted or sigSwitchRefused."""
        self.sigRequestSwitch.emit(strategy, dict(options))

    def cancel(self, run_id: int) -> None:
        self.worker.cancel(run_id)

    def stop(self, timeout_ms: int = 1800) -> bool:
        """End the worker thread; True if it ended within timeout_ms (else `stuck` is set)."""
        self.evaluator.cancel()
        finished = self.thread.stop(timeout_ms)
        self.stuck = not finished
        return finished

    # -- from the worker ----------------------------------------------------------------------------

    def _on_model_loaded(self, spec: str, card: dict) -> None:
        self.loading = False
        self.card = card

    def _on_model_failed(self, spec: str, message: str) -> None:
        self.loading = False

    def _on_run_started(self, run_id: int, trace: Trace) -> None:
        self.store.attach(run_id, trace)
        self.store.set_status(run_id, RUNNING)

    def _on_step(self, run_id: int, step) -> None:
        self.store.records_arrived(run_id)

    def _on_run_finished(self, run_id: int, trace: Trace) -> None:
        self.store.end(run_id, final_status(trace))

    def _on_run_failed(self, run_id: int, message: str) -> None:
        self.store.end(run_id, FAILED, error=message)
