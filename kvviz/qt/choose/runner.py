"""The Choose mode's engine side, on the worker's thread: the default grid for the loaded model, and a sweep
(`kvviz.engine.sweep.SweepRun`) run as `kvviz choose` runs it.

`SweepRunner` lives on the `Worker`'s thread (a kvviz.qt.jobs.WorkerJob: its slots are queued), the one thread
that runs torch. A sweep sends its `SweepRun` once it is built (its `sweep` lists every configuration from the start;
the window reads `progress()` and `seconds_left()` from it while it runs) and then the index of each configuration as
it finishes. `cancel()` may be called from any thread: the configurations reading stop after their forward, the
finished ones stay.

Every sweep is journaled as it goes, each configuration as it finishes and the answers to each item as they are
given: a sweep started here in the folder of unsaved work (`kvviz.qt.unsaved`, until the window closes), so that a
window killed mid-sweep keeps every configuration that finished. A sweep that a journal holds and that did not end
(`kvviz choose --out` killed or stopped, a window killed, an earlier continuation here) continues here with the
journal's own question, configurations and questions, through the code `kvviz choose --resume` runs
(`kvviz.engine.sweep_resume.take_up`): the journal goes on being written as configurations finish, and the mode writes
the sweep's files beside an `--out` journal at the end.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from PySide6.QtCore import Signal, Slot

from kvviz.errors import OptionError, failure
from kvviz.qt import unsaved
from kvviz.qt.jobs import WorkerJob

log = logging.getLogger(__name__)


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
        "sequences", "budget" and "tolerance" (the user's words), "budget_covers" ("cache" or "process"),
        "configurations" ([(name, options)]), "asked" (the
        questions to ask too: `kvviz.engine.qa_prompt.asked`'s arguments, or None); or, to continue a sweep's
        journal, "document", "tokens" and "journal" (its path)."""
        try:
            with self.running(sweep_id) as cancel:
                self._run(sweep_id, request, cancel)
        except Exception as exc:  # noqa: BLE001 - the sweep as a whole cannot go on; the window says why
            self.sigFailed.emit(sweep_id, failure(f"sweep {sweep_id}", exc))
        finally:
            self.sigFinished.emit(sweep_id)

    def _run(self, sweep_id: int, request: dict[str, Any], cancel: threading.Event) -> None:
        from kvviz.engine import evaluate, strategies, sweep, sweep_resume
        from kvviz.engine.qa_prompt import asked

        loaded = self.worker.loaded
        if loaded is None:
            raise OptionError("no model is loaded yet; load one first")
        if "journal" in request:
            run, notice, journal = self._continued(loaded, request, cancel)
        else:
            question = sweep.ask(loaded.model, request["context"], request["sequences"], request["budget"],
                                 request["tolerance"], budget_covers=request.get("budget_covers", "cache"))
            choices = [strategies.choose(name, dict(options)) for name, options in request["configurations"]]
            questions = asked(loaded.tokenizer, **request["asked"]) if request.get("asked") else None
            ids, record, notice = evaluate.prepare(loaded, request["document"], choices, request["tokens"])
            run = sweep.SweepRun(loaded, choices, ids, record, question, cancel=cancel, asked=questions)
            # on disk as it is measured, until the window closes (`kvviz.qt.unsaved`)
            journal = unsaved.sweep_journal(sweep_id, run.sweep, sweep_resume.resume_key(run, request["budget"]))
        if journal is not None:
            run.on_answered = journal.answered
        self.sigStarted.emit(sweep_id, {"run": run, "notice": notice})
        try:
            for config in run:
                index = next(i for i, c in enumerate(run.sweep.configurations) if c is config)
                if journal is not None and config.status != "cancelled":
                    journal.finished(index, run.elapsed_s)
                self.sigConfiguration.emit(sweep_id, index)
        finally:
            if journal is not None:
                if journal.journal.problem:  # the sweep went on; what it measured is on screen
                    log.info(journal.journal.problem)
                journal.journal.close()

    @staticmethod
    def _continued(loaded, request: dict[str, Any], cancel: threading.Event):
        """The sweep a journal holds, continued (its run, why its text was cut, and its journal, written on)."""
        from kvviz.engine import evaluate, strategies, sweep, sweep_resume
        from kvviz.files.sweep import SweepFileError, SweepJournal, read_journal

        try:
            found = read_journal(request["journal"])
        except SweepFileError as exc:
            raise OptionError(str(exc)) from None
        choices = [strategies.choose(c.run.strategy["name"], dict(c.run.strategy["options"]))
                   for c in found.sweep.configurations]
        ids, record, notice = evaluate.prepare(loaded, request["document"], choices, request["tokens"])
        rows = found.resume.get("rows")
        run = sweep.SweepRun(loaded, choices, ids, record, sweep_resume.asked_again(loaded.model, found), cancel=cancel,
                             rows=rows if isinstance(rows, int) else sweep.ROWS,
                             quantized_alone=found.resume.get("quantized_alone") is True, asked=found.sweep.asked,
                             first_tokens=found.resume.get("first_tokens") is not False)
        key = sweep_resume.resume_key(run, "free" if found.resume.get("budget") == "free" else "")
        found, _ = sweep_resume.take_up(run, request["journal"], key)
        journal = SweepJournal(str(request["journal"]).removesuffix(".journal"), run.sweep, key)
        journal.carry(found)
        return run, notice, journal
