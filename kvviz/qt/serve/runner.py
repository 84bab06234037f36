"""The Serve mode's engine side, on the worker's thread: requests served through transformers' continuous batching
(`kvviz.engine.serve.serve`), as `kvviz serve` serves them.

`ServeRunner` lives on the `Worker`'s thread (a kvviz.qt.jobs.WorkerJob), the one thread that runs torch: while it
serves, no other mode feeds the shared model. It sends the `ServeRun` once the pool is built; the window reads its
steps and requests as the manager's thread adds them. `cancel()` (Stop, the window closing) ends the run at once:
the requests still open are failed, the manager's thread is stopped and joined, and the model's attention
implementation restored by transformers. Every run is journaled as it serves, so that a window killed mid-run keeps
what was measured.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal, Slot

from kvviz.errors import OptionError, failure
from kvviz.qt import unsaved
from kvviz.qt.jobs import WorkerJob


class ServeRunner(WorkerJob):
    sigStarted = Signal(int, object)  # job id, the ServeRun (its pool built, no request sent yet)
    sigFinished = Signal(int)  # job id: nothing more comes (every request answered, a Stop or a failure)
    sigFailed = Signal(int, str)  # job id, why it cannot run or went wrong (user-facing)

    @Slot(int, object)
    def serve(self, job_id: int, request: dict[str, Any]) -> None:
        """request: "texts" (each request's prompt), "prefix" (put before each), "settings" (a ServeSettings)."""
        try:
            with self.running(job_id) as cancel:
                loaded = self.worker.loaded
                if loaded is None:
                    raise OptionError("no model is loaded yet; load one first")
                from kvviz.engine.serve import encoded, serve

                prompts = encoded(loaded.tokenizer, request["texts"], request["prefix"])
                journal = None  # in the folder of unsaved work until the window closes (`kvviz.qt.unsaved`)

                def started(run) -> None:
                    nonlocal journal
                    journal = unsaved.serve_journal(job_id, run)
                    if journal is not None:
                        journal.update()
                    self.sigStarted.emit(job_id, run)

                def stepped(run) -> None:
                    if journal is not None:
                        journal.step()

                try:
                    serve(loaded, prompts, request["settings"], on_start=started, on_step=stepped, stop=cancel)
                finally:
                    if journal is not None:
                        journal.update()
                        journal.journal.close()
        except Exception as exc:  # noqa: BLE001 - the run as a whole cannot go on; the window says why
            self.sigFailed.emit(job_id, failure(f"serve {job_id}", exc))
        finally:
            self.sigFinished.emit(job_id)
