"""The local runs' side of the worker: runs, live switches and the next run's checks, fed into the run store.

Requests leave as queued signals (run, switch, the next run's checks) and every engine call happens on the worker's
thread; answers come back as the worker's signals. A run's one record is the decoder's own `Trace`: it is attached
to the run in the store when the worker starts the run, and each step the worker reports is a record appended to
it. A run the engine refuses before it starts (an option that cannot work with this model or prompt) is withdrawn
from the store: it was never a run.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from kvviz.files.trace import Trace
from kvviz.present import FAILED, RUNNING, STARTING, final_status
from kvviz.qt.run_store import RunStore
from kvviz.qt.worker import Worker

PREFLIGHT_DELAY_MS = 250  # the next run is checked once typing pauses this long, not at every key


class LocalRuns(QObject):
    sigRequestRun = Signal(int, object)  # to the worker: run id, request dict
    sigRequestSwitch = Signal(str, object)  # to the worker's desk: strategy, options
    sigRequestPreflight = Signal(int, object)  # to the worker's desk: serial, the next run's request
    sigPromptTokens = Signal(object)  # the prompt's token count as a run would feed it; None: unknown (no model)
    sigPreflight = Signal(object, object)  # the request checked, why it cannot run with this model (None: it can)

    def __init__(self, store: RunStore, worker: Worker, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.worker = worker
        self.prompt_tokens: int | None = None  # the latest count of the prompt (see preflight)
        self._next: dict[str, Any] | None = None  # the next run's request, to check
        self._sent: dict[int, dict[str, Any]] = {}  # requests sent to be checked, by serial
        self._serial = 0
        self._preflight_timer = QTimer(self)
        self._preflight_timer.setSingleShot(True)
        self._preflight_timer.setInterval(PREFLIGHT_DELAY_MS)
        self._preflight_timer.timeout.connect(self._send_preflight)
        self._shown_before: dict[int, list[int]] = {}  # runs shown when a run was asked for, until it starts
        # before the window's own slots: the store is current when they run
        worker.sigModelLoaded.connect(self._send_preflight)  # another model: another tokenizer, other limits
        worker.sigRunStarted.connect(self._on_run_started)
        worker.sigRecords.connect(self._on_records)
        store.sigTaking.connect(self._on_taking)
        worker.sigRunFinished.connect(self._on_run_finished)
        worker.sigRunFailed.connect(self._on_run_failed)
        worker.sigPreflight.connect(self._on_preflight)
        self.sigRequestRun.connect(worker.run)
        self.sigRequestSwitch.connect(worker.desk.switch)
        self.sigRequestPreflight.connect(worker.desk.preflight)

    def run(self, header: Trace, request: dict[str, Any]) -> int:
        """Add the run to the store (its header until the worker's trace arrives) and start it; its id."""
        shown = self.store.shown
        run_id = self.store.add(header, STARTING, generating=True)
        self._shown_before[run_id] = shown
        self.sigRequestRun.emit(run_id, request)
        return run_id

    def switch(self, strategy: str, options: dict[str, Any]) -> None:
        """Ask the running generation to switch; the worker answers sigSwitchAccepted or sigSwitchRefused."""
        self.sigRequestSwitch.emit(strategy, dict(options))

    def preflight(self, request: dict[str, Any]) -> None:
        """Check the next run (prompt, raw, strategy, options, max_new_tokens) with the loaded model once typing
        pauses; the answers are sigPromptTokens and sigPreflight."""
        self._next = dict(request)
        self._preflight_timer.start()

    def cancel(self, run_id: int) -> None:
        self.worker.cancel(run_id)

    def shutdown(self) -> None:
        self._preflight_timer.stop()

    def _send_preflight(self, *_) -> None:
        if self._next is not None:
            self._serial += 1
            self._sent = {self._serial: self._next}  # only the latest answer counts
            self.sigRequestPreflight.emit(self._serial, self._next)

    # -- from the worker ----------------------------------------------------------------------------

    def _on_preflight(self, serial: int, answer: dict[str, Any]) -> None:
        request = self._sent.pop(serial, None)
        if request is None:  # an answer to an older request is stale
            return
        self.prompt_tokens = answer["prompt_tokens"]
        self.sigPromptTokens.emit(answer["prompt_tokens"])
        self.sigPreflight.emit(request, answer["problem"])

    def _on_run_started(self, run_id: int, trace: Trace) -> None:
        self._shown_before.pop(run_id, None)
        self.store.attach(run_id, trace)
        self.store.set_status(run_id, RUNNING)

    def _on_records(self, run_id: int) -> None:
        self.store.records_arrived(run_id)

    def _on_taking(self) -> None:
        self.worker.records_wanted()  # a call from this thread: the worker's own is busy decoding

    def _on_run_finished(self, run_id: int, trace: Trace) -> None:
        self.store.end(run_id, final_status(trace))

    def _on_run_failed(self, run_id: int, message: str) -> None:
        shown_before = self._shown_before.pop(run_id, None)
        if shown_before is not None and self.store.status(run_id) == STARTING:  # refused before it started
            self.store.withdraw(run_id, shown_before)
        else:
            self.store.end(run_id, FAILED, error=message)
