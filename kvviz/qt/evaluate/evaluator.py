"""The Evaluate tab's engine side: teacher-forced evaluations run on the worker's thread, as `kvviz eval`
runs them: one after another, each in chunks (those that evict at every token stepping through each chunk).

`Evaluator` lives on the `Worker`'s thread (a kvviz.qt.jobs.WorkerJob): `evaluate` is a queued slot, and every
engine call (tokenizing the document, building each strategy's cache, the forwards) runs there, the one
thread that runs torch. While an evaluation runs the worker's event loop waits, so loads and runs asked
meanwhile wait for it (the window does not offer them). Results travel as the engine's own `EvalRun`
objects: the engine appends each prediction's record to its run, and the window reads the records that
arrived when it redraws. `cancel()` may be called from any thread: it stops every strategy (the one
running after its current forward, the rest unstarted).

An evaluation a journal holds (`kvviz eval --out` killed or stopped, or a window that ended without closing)
continues here through the code `kvviz eval --resume` runs (`kvviz.engine.evaluate.take_up`): its journal goes on
being written, and where the strategy ends, its evaluation file is written beside the journal, which then goes, and
the folder's summary.csv again for the whole evaluation.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from PySide6.QtCore import Signal, Slot

from kvviz.errors import OptionError, failure
from kvviz.present import CANCELLED, FAILED, FINISHED, NOT_RUN
from kvviz.qt import unsaved
from kvviz.qt.jobs import WorkerJob

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 0.25  # so the Evaluate tab redraws about 4 times a second: every redraw slows the forwards


class Evaluator(WorkerJob):
    # eval id, {"tokens", "notice", "document", "runs": [EvalRun or None], "errors": [str or None]}: the
    # document is tokenized and every strategy built (or refused, with its error), before any prediction
    sigStarted = Signal(int, object)
    sigProgress = Signal(int, object)  # eval id, the indices of the strategies whose records are arriving
    sigNotice = Signal(int, str)  # eval id, what a long one-time pause is doing ("" once it is over)
    sigFinished = Signal(int, object)  # eval id, each strategy's final state: finished, cancelled, failed, not run
    sigFailed = Signal(int, str)  # eval id, why nothing could be evaluated (user-facing)
    sigUnwritten = Signal(int, str)  # eval id, a continued evaluation's file or summary that could not be written

    resumed: dict[str, Any] = {}  # what the journal being continued keeps for a resume to check

    @Slot(int, object)
    def evaluate(self, eval_id: int, request: dict[str, Any]) -> None:
        """request: "document" (a kvviz.files.documents.Document), "tokens" (int or None: the whole document, cut
        at the model's context), "strategies" ([(name, options)]); and to continue a journal's evaluation, its
        "journal" (a path; one strategy, the journal's). `cancel` stops every strategy, not only the current one."""
        with self.running(eval_id) as cancel:
            evaluations = self._prepare(eval_id, request, cancel)
            if evaluations is not None:
                self._run(eval_id, evaluations, cancel, request.get("journal"))

    def _prepare(self, eval_id: int, request: dict[str, Any], cancel: threading.Event) -> list | None:
        """Tokenize the document and build every strategy's evaluation (None, after sigFailed, if none can be
        built: no model, or a document too short); a strategy refused here keeps its error, the others go on."""
        loaded = self.worker.loaded
        try:
            from kvviz.engine import evaluate, strategies

            if loaded is None:
                raise RuntimeError("no model is loaded yet; load one first")
            specs = request["strategies"]
            choices: list = []
            errors: list[str | None] = []
            for name, options in specs:
                try:
                    choices.append(strategies.choose(name, dict(options)))
                    errors.append(None)
                except Exception as exc:  # noqa: BLE001 - this strategy's problem, shown in its row
                    choices.append(None)
                    errors.append(failure(f"choosing {name} for the evaluation", exc))
            chosen = [c for c in choices if c is not None]
            if not chosen:  # every strategy refused: their rows say why, the document is not even read
                self.sigStarted.emit(eval_id, {"tokens": None, "notice": None, "runs": [None] * len(specs),
                                               "document": request["document"].describe(), "errors": errors})
                self.sigFinished.emit(eval_id, [FAILED] * len(specs))
                return None
            ids, record, notice = evaluate.prepare(loaded, request["document"], chosen, request.get("tokens"))
            evaluations: list = []
            for i, choice in enumerate(choices):
                evaluation = None
                if choice is not None:
                    try:
                        evaluation = evaluate.Evaluation(loaded, choice, ids, record, cancel=cancel)
                    except Exception as exc:  # noqa: BLE001 - refused on this model: shown in its row
                        errors[i] = failure(f"{choice.label()} on this model", exc)
                evaluations.append(evaluation)
            if "journal" in request and evaluations[0] is not None:
                from kvviz.files import evaluation as evaluation_file

                try:
                    found = evaluation_file.read_journal(request["journal"])
                except evaluation_file.EvalFileError as exc:
                    raise OptionError(str(exc)) from None
                notice = evaluate.take_up(evaluations[0], found)
                self.resumed = found.resume  # kept in the journal written on
        except Exception as exc:  # noqa: BLE001 - the whole evaluation cannot start; the window says why
            self.sigFailed.emit(eval_id, failure(f"evaluation {eval_id}", exc))
            return None
        runs = [e.result if e is not None else None for e in evaluations]
        self.sigStarted.emit(eval_id, {"tokens": len(ids), "notice": notice, "document": record, "runs": runs,
                                       "errors": errors})
        return evaluations

    def _run(self, eval_id: int, evaluations: list, cancel: threading.Event, continued=None) -> None:
        from kvviz.engine import evaluate_many
        from kvviz.files.evaluation import EvalJournal

        runnable = [e for e in evaluations if e is not None]
        # one-time preparations (quanto builds its kernels once per install) before the first prediction,
        # with a notice while they last; each evaluation's own warm-up is then instant
        for e in runnable:
            if cancel.is_set():
                break
            try:
                e.run.warm_up(lambda message: self.sigNotice.emit(eval_id, message), cancel)
            except Exception as exc:  # noqa: BLE001 - this strategy's problem; its evaluation reports it
                log.debug("warm-up failed: %s", exc)
        self.sigNotice.emit(eval_id, "")
        shown, last = None, 0.0
        # on disk as they are measured, until the window closes (`kvviz.qt.unsaved`)
        if continued is not None:  # the journal continued, written on (the records it held first)
            kept = [(evaluations[0], EvalJournal(str(continued).removesuffix(".journal"), evaluations[0].result,
                                                 self.resumed))]
        else:
            kept = [(e, unsaved.eval_journal(eval_id, i, e.result)) for i, e in enumerate(evaluations)
                    if e is not None]
            kept = [(e, journal) for e, journal in kept if journal is not None]
        for e, journal in kept:
            if e.finished:  # kept whole from the journal: written again at once, ended
                journal.update(end=True)
        try:
            for _ in evaluate_many.evaluate_all(runnable):
                for e, journal in kept:
                    if not journal.ended:
                        journal.update(end=e.finished)
                now = time.perf_counter()
                active = [i for i, e in enumerate(evaluations) if e is not None and e.started and not e.finished]
                if active != shown or now - last >= PROGRESS_INTERVAL_S:
                    shown, last = active, now
                    self.sigProgress.emit(eval_id, active)
        finally:  # the window always learns that the evaluation is over, whatever happened
            for e, journal in kept:  # how each ended (a failure, a Stop), then closed: it stays until the window does
                if not journal.ended:
                    journal.update(end=e.finished)
                journal.journal.close()
            if continued is not None:
                self._finish_journal(eval_id, evaluations[0], kept[0][1])
            self.sigFinished.emit(eval_id, [_state(e) for e in evaluations])

    def _finish_journal(self, eval_id: int, evaluation, journal) -> None:
        """A continued evaluation that ended (not stopped): its file beside its journal, which then goes, and the
        folder's summary.csv again, as `kvviz eval --out` writes it for the whole evaluation; but in the folder of
        unsaved work, where the journal stays for the folder's rule (the tab shows it: File ▸ Save)."""
        from kvviz.files.evaluation_csv import write_folder_summary
        from kvviz.files.jsonfile import KeptFileError

        if evaluation.result.cancelled or unsaved.holds(journal.path):
            return
        try:
            journal.save()
        except OSError as exc:
            self.sigUnwritten.emit(eval_id, f"could not write {journal.path}: {exc.strerror or exc}")
            return
        journal.remove()
        strategies = self.resumed.get("strategies")  # every strategy of the evaluation the folder keeps
        if not (isinstance(strategies, list) and all(isinstance(s, dict) and isinstance(s.get("name"), str)
                                                     for s in strategies)):
            return  # not a journal `kvviz eval --out` began: its folder has no summary of ours
        summary = journal.path.parent / "summary.csv"
        try:
            write_folder_summary(journal.path.parent, strategies)
        except KeptFileError as exc:
            self.sigUnwritten.emit(eval_id, f"{summary} was not written again: {exc}")
        except OSError as exc:
            self.sigUnwritten.emit(eval_id, f"could not write {summary}: {exc.strerror or exc}")


def _state(evaluation) -> str:
    """How one strategy's evaluation ended, in the Evaluate tab's words."""
    if evaluation is None or evaluation.result.error:
        return FAILED
    if not evaluation.started:
        return NOT_RUN
    return CANCELLED if evaluation.result.cancelled else FINISHED
