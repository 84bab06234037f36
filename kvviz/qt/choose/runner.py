"""The Choose mode's engine side, on the worker's thread: the default grid for the loaded model, and a sweep
(`kvviz.engine.sweep.SweepRun`) run as `kvviz choose` runs it.

`SweepRunner` lives on the `Worker`'s thread (a kvviz.qt.jobs.WorkerJob: its slots are queued), the one thread
that runs torch. A sweep sends its `SweepRun` once it is built (its `sweep` lists every configuration from the start;
the window reads `progress()` and `seconds_left()` from it while it runs) and then the index of each configuration as
it finishes. `cancel()` may be called from any thread: the configurations reading stop after their forward, the
finished ones stay.
"""

from __future__ import annotations

import threading
from typing import Any

from PySide6.QtCore import Signal, Slot

from kvviz.errors import OptionError, failure
from kvviz.qt.jobs import WorkerJob


class SweepRunner(WorkerJob):
    sigGrid = Signal(int, object, object, object)  # tokens, budgets' tokens, [(name, options)] of the default grid,
    # [why others are left out]
    sigStarted = Signal(int, object)  # sweep id, {"run": SweepRun, "notice": why the text was cut or None}
    sigConfiguration = Signal(int, int)  # sweep id, index of the configuration that just finished
    sigFinished = Signal(int)  # sweep id: nothing more comes (after the last configuration, a Stop or a failure)
    sigFailed = Signal(int, str)  # sweep id, why it cannot run or went wrong (user-facing)

    @Slot(int, object)
    def grid(self, tokens: int, budgets_of: int | None) -> None:
        """The default grid for `tokens` measured tokens on the loaded model, its budgets fractions of `budgets_of`
        tokens where given (the questions' length); nothing when no model is loaded."""
        loaded = self.worker.loaded
        if loaded is None:
            return
        from kvviz.engine import sweep

        choices, skipped = sweep.default_grid(loaded.model, tokens, budgets_of)
        self.sigGrid.emit(tokens, budgets_of, [(c.name, dict(c.options)) for c in choices], skipped)

    @Slot(int, object)
    def choose(self, sweep_id: int, request: dict[str, Any]) -> None:
        """request: "document" (kvviz.files.documents.Document), "tokens", "context" (None: the model's maximum),
        "sequences", "budget" and "tolerance" (the user's words), "configurations" ([(name, options)]), "asked" (the
        questions to ask too: `kvviz.engine.qa_prompt.asked`'s arguments, or None)."""
        try:
            with self.running(sweep_id) as cancel:
                self._run(sweep_id, request, cancel)
        except Exception as exc:  # noqa: BLE001 - the sweep as a whole cannot go on; the window says why
            self.sigFailed.emit(sweep_id, failure(f"sweep {sweep_id}", exc))
        finally:
            self.sigFinished.emit(sweep_id)

    def _run(self, sweep_id: int, request: dict[str, Any], cancel: threading.Event) -> None:
        from kvviz.engine import evaluate, strategies, sweep
        from kvviz.engine.qa_prompt import asked

        loaded = self.worker.loaded
        if loaded is None:
            raise OptionError("no model is loaded yet; load one first")
        question = sweep.ask(loaded.model, request["context"], request["sequences"], request["budget"],
                             request["tolerance"])
        choices = [strategies.choose(name, dict(options)) for name, options in request["configurations"]]
        questions = asked(loaded.tokenizer, **request["asked"]) if request.get("asked") else None
        ids, record, notice = evaluate.prepare(loaded, request["document"], choices, request["tokens"])
        run = sweep.SweepRun(loaded, choices, ids, record, question, cancel=cancel, asked=questions)
        self.sigStarted.emit(sweep_id, {"run": run, "notice": notice})
        for config in run:
            self.sigConfiguration.emit(sweep_id, run.sweep.configurations.index(config))
