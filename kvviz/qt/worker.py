"""The worker: the one object that talks to the engine, living in its own QThread.

The GUI thread sends requests through queued signals (`load`, `run`, `desk.switch` and
`desk.preflight` are slots) and gets plain records back through the `sig*` signals declared below; every engine call
(torch included) runs on the worker's thread. One thread also for speed: each thread that runs a torch op gets an
OpenMP pool of its own that lives as long as the thread, and with more pool threads than cores libgomp's threads
spin 100 times instead of 300,000 before sleeping between ops; with a second pool alive beside the worker's, the
default model decoded at 0.90 of plain `generate` where the window alone gave 0.97 (2 cores). A run's records go
into the decoder's own `Trace`, which `sigRunStarted` hands to the window: that trace is the run's one record.
`cancel()` and `shutdown()` may be called from any thread. Nothing here holds a widget; nothing in the GUI holds a
tensor.
"""

from __future__ import annotations

import logging
import threading
import traceback
from typing import Any

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QThread, Signal, Slot

from kvviz.errors import OptionError, failure
from kvviz.qt import unsaved

log = logging.getLogger(__name__)


class _Interrupted(Exception):
    """Raised from the load progress callback when the window is closing."""


class Desk(QObject):
    """Where requests that must not wait for a generation to end arrive (queued slots on the worker's thread):
    switches, and the checks of the next run's prompt and strategy against the loaded model.

    While a run decodes the worker's event loop is busy, so the decode loop serves this desk between two
    steps (outside every step's time); a switch therefore takes effect at the next step. The strategy's
    checks and the tokenizer run on the worker's thread, never on the GUI's.
    """

    def __init__(self, worker: Worker):
        super().__init__(worker)
        self.worker = worker

    @Slot(str, object)
    def switch(self, strategy: str, options: dict[str, Any]) -> None:
        self.worker._switch(strategy, options)  # the desk is the worker's own door, in this module

    @Slot(int, object)
    def preflight(self, serial: int, request: dict[str, Any]) -> None:
        self.worker._preflight(serial, request)

    @Slot(int, object)
    def write_item(self, serial: int, request: dict[str, Any]) -> None:
        self.worker._write_item(serial, request)

    @Slot(bool)
    def attention(self, on: bool) -> None:
        """Compute the attention view's matrix from the next step on (the view is on screen), or stop."""
        self.worker._watch_attention(on)

    def serve(self) -> None:
        """Answer the requests waiting for this desk (called by the decode loop between steps)."""
        QCoreApplication.sendPostedEvents(self, QEvent.Type.MetaCall)


class Worker(QObject):
    sigReady = Signal(object)  # list of (Strategy, available: bool, reason: str)
    sigLoadProgress = Signal(str, object)  # message, fraction in [0, 1] or None
    sigModelLoaded = Signal(str, object)  # spec, model card (dict, plus "threads")
    sigModelFailed = Signal(str, str)  # spec, user-facing message
    sigRunStarted = Signal(int, object)  # run id, the decoder's Trace (its steps fill as the run goes)
    sigStep = Signal(int, object)  # run id, the StepRecord just appended to that trace
    # run id: records were appended to its trace, and nobody was told since the window last took them
    # (`records_wanted`); once a frame, where sigStep, queued to the window, woke its thread at every token
    sigRecords = Signal(int)
    sigRunFinished = Signal(int, object)  # run id, the same Trace, complete (cancelled or not)
    sigRunFailed = Signal(int, str)  # run id, user-facing message (the trace, if any, carries it too)
    sigSwitchAccepted = Signal(str)  # strategy: it takes over at the next step
    sigSwitchRefused = Signal(str, str)  # strategy, why not
    sigRunNotice = Signal(int, str)  # run id, what a long one-time pause is doing ("" once it is over)
    sigPreflight = Signal(int, object)  # request serial, {"prompt_tokens": int | None, "problem": str | None}
    sigAttentionRefused = Signal(int, str)  # run id, why its attention cannot be shown
    sigItemWritten = Signal(int, object)  # request serial, {"prompt", "pins": [needle text], "name", "answers",
    # "metric"} or {"problem": str}
    # what lives on now (after a model load: 2; after a run: 1) is to be kept: collect up to that generation and
    # freeze the rest, on the GUI thread (kvviz.qt.collector: a collection here would destroy the GUI's Qt objects)
    sigCollect = Signal(int)

    def __init__(self):
        super().__init__()
        self.loaded = None
        self.desk = Desk(self)
        self._notice = False  # a run notice is on screen: the next step (or the run's end) clears it
        self._lock = threading.Lock()
        self._decoder = None
        self._run_id = 0
        self._cancelled: set[int] = set()
        self._stopping = False
        self._attention = False  # the attention view is on screen: runs compute it
        self._records_wanted = True  # the window takes records: sigRecords announces the next ones

    # -- any thread ---------------------------------------------------------------------------------

    def cancel(self, run_id: int | None = None) -> None:
        """Stop run `run_id` (or the current one) after its current step."""
        with self._lock:
            if run_id is not None:
                self._cancelled.add(run_id)
            if self._decoder is not None and (run_id is None or run_id == self._run_id):
                self._decoder.cancel()

    def records_wanted(self) -> None:
        """The window is taking the records announced: announce the next ones (called before it reads the trace,
        so that a record appended meanwhile is announced, never left unseen)."""
        self._records_wanted = True

    def shutdown(self) -> None:
        """Cancel everything and make a model load in progress give up at its next progress report."""
        self._stopping = True
        self.cancel()

    # -- worker thread ------------------------------------------------------------------------------

    @Slot()
    def start(self) -> None:
        """Import the engine (torch) here, off the GUI thread, and list the strategies."""
        try:
            from kvviz.engine import strategies

            listing = []
            for strategy in strategies.all_strategies():
                ok, reason = strategy.available()
                listing.append((strategy, bool(ok), reason or ""))
        except Exception as exc:  # noqa: BLE001 - shown to the user, window stays up
            log.exception("engine import failed")
            self.sigModelFailed.emit("", f"the engine failed to start: {type(exc).__name__}: {exc}")
            listing = []
        self.sigReady.emit(listing)

    @Slot(str, str, str)
    def load(self, spec: str, dtype: str = "auto", device: str = "auto") -> None:
        if self._stopping:
            return
        try:
            from kvviz.engine import models

            def progress(message: str, fraction: float | None) -> None:
                if self._stopping:
                    raise _Interrupted()
                self.sigLoadProgress.emit(message, fraction)

            self.sigLoadProgress.emit(f"loading {spec}", 0.0)
            loaded = models.load_model(spec, dtype=dtype, device=device, progress=progress)
        except _Interrupted:
            return
        except Exception as exc:  # noqa: BLE001
            if self._stopping:
                return
            self.sigModelFailed.emit(spec, failure(f"loading {spec}", exc))
            return
        self._set_model(spec, loaded)

    def _set_model(self, spec: str, loaded) -> None:
        import torch

        self.loaded = loaded
        self.sigCollect.emit(2)  # the model this one replaces can go; then the new one is frozen
        card = dict(loaded.card)
        card["threads"] = torch.get_num_threads()
        self.sigModelLoaded.emit(spec, card)

    def _preflight(self, serial: int, request: dict[str, Any]) -> None:
        """What the loaded model says of the next run before it is asked for (worker thread, from `desk` only):
        the prompt's token count with its tokenizer and chat template, and why the strategy and options cannot run
        with this model, prompt and token count (the checks that need the model; the window checks the options
        themselves as they are typed). request: prompt, raw, strategy, options, max_new_tokens. Both None while no
        model is loaded; a count that fails is None (the run itself names the problem)."""
        count = problem = None
        if self.loaded is not None:
            from kvviz.engine import strategies
            from kvviz.engine.decode import encode_prompt

            try:
                count = len(encode_prompt(self.loaded.tokenizer, request["prompt"], request["raw"]))
            except Exception:  # noqa: BLE001 - a count is a hint
                log.debug("prompt count failed:\n%s", traceback.format_exc())
            try:
                choice = strategies.choose(request["strategy"], dict(request["options"]))
                problem = strategies.get(choice.name).unsupported(self.loaded.model, choice.options)
                if problem is None and count is not None:
                    strategies.capacity_for(choice, count + request["max_new_tokens"])
            except OptionError as exc:
                problem = str(exc)
        self.sigPreflight.emit(serial, {"prompt_tokens": count, "problem": problem})

    def _write_item(self, serial: int, request: dict[str, Any]) -> None:
        """A task item written for the loaded model's tokenizer (worker thread, from `desk` only): its plain prompt
        and the needles to pin. request: task, length (tokens), seed, index, raw."""
        if self.loaded is None:
            self.sigItemWritten.emit(serial, {"problem": "load a model first: the item is written for its tokenizer"})
            return
        from kvviz.engine import tasks
        from kvviz.engine.qa_prompt import Rendering, plain_prompt

        try:
            rendering = Rendering(self.loaded.tokenizer, request["raw"])
            item = tasks.fit(tasks.TASKS[request["task"]], request["seed"], request["index"], request["length"], 1,
                             rendering.tokens)
        except OptionError as exc:
            self.sigItemWritten.emit(serial, {"problem": str(exc)})
            return
        prompt, pins = plain_prompt(item)
        self.sigItemWritten.emit(serial, {"prompt": prompt, "pins": pins, "name": item.name,
                                          "answers": item.turns[0].answers, "metric": item.metric})

    def _switch(self, strategy: str, options: dict[str, Any]) -> None:
        """Switch the running generation's cache at its next step (worker thread, from `desk` only)."""
        from kvviz.engine import strategies

        with self._lock:
            decoder = self._decoder
        if decoder is None:
            self.sigSwitchRefused.emit(strategy, "no generation is running; the strategy applies to the next run")
            return
        try:
            decoder.request_switch(strategies.choose(strategy, options))
        except OptionError as exc:
            self.sigSwitchRefused.emit(strategy, str(exc))
            return
        self.sigSwitchAccepted.emit(strategy)

    def _watch_attention(self, on: bool) -> None:
        """The attention view came on screen or went off it (worker thread, from `desk` only)."""
        self._attention = on
        with self._lock:
            decoder, run_id = self._decoder, self._run_id
        if decoder is not None:
            self._apply_attention(decoder, run_id)

    def _apply_attention(self, decoder, run_id: int) -> None:
        try:
            decoder.watch_attention(self._attention)
        except OptionError as exc:
            self.sigAttentionRefused.emit(run_id, str(exc))

    @Slot(int, object)
    def run(self, run_id: int, request: dict[str, Any]) -> None:
        """Decode one prompt. request: strategy, options, settings (GenerationSettings fields), prompt,
        reference (run a full-precision reference in lockstep), pins (texts of the prompt whose tokens each step
        says are held: `Decoder.pin_text`)."""
        decoder = kept = None
        try:
            from kvviz.engine import decode, strategies

            if self.loaded is None:
                raise RuntimeError("no model is loaded yet; load one first")
            choice = strategies.choose(request["strategy"], dict(request.get("options") or {}))
            settings = decode.GenerationSettings(**request.get("settings", {}))
            decoder = decode.Decoder(
                self.loaded, choice, settings, request["prompt"], reference=bool(request.get("reference")),
                notify=lambda message: self._notify(run_id, message),
            )
            for text in request.get("pins") or ():
                decoder.pin_text(text)
            with self._lock:
                self._decoder = decoder
                self._run_id = run_id
                if run_id in self._cancelled or self._stopping:
                    decoder.cancel()
            if self._attention:
                self._apply_attention(decoder, run_id)
            self._records_wanted = True  # a new run: its first record is announced
            kept = unsaved.trace_journal(run_id, decoder.trace)  # on disk as it is measured, until the window closes
            self.sigRunStarted.emit(run_id, decoder.trace)
            for step in decoder:
                if self._notice:  # a step came: the pause it announced is over
                    self._notify(run_id, "")
                self.sigStep.emit(run_id, step)
                if self._records_wanted:
                    self._records_wanted = False
                    self.sigRecords.emit(run_id)
                if kept is not None:
                    kept.update()
                self.desk.serve()
            self.sigRunFinished.emit(run_id, decoder.trace)
        except Exception as exc:  # noqa: BLE001 - any failure is reported, the worker lives on
            message = failure(f"run #{run_id}", exc)
            if decoder is not None:
                decoder.trace.error = message
            self.sigRunFailed.emit(run_id, message)
        finally:
            if kept is not None:
                kept.journal.close()
            if self._notice:
                self._notify(run_id, "")
            with self._lock:
                self._decoder = None
                self._cancelled.discard(run_id)
            self.sigCollect.emit(1)  # the run's own garbage; what is left is its trace, kept with the run

    def _notify(self, run_id: int, message: str) -> None:
        """Say what a long one-time pause of the run is doing ("" when it is over)."""
        self._notice = bool(message)
        self.sigRunNotice.emit(run_id, message)


class WorkerThread(QThread):
    """The thread the worker lives in; `stop()` asks it to end, `wait()` joins it (kvviz.qt.model_host.stop)."""

    def __init__(self, worker: Worker, parent: QObject | None = None):
        super().__init__(parent)
        self.setObjectName("kvviz-worker")
        self.worker = worker
        worker.moveToThread(self)
        self.started.connect(worker.start)
        # the worker and its jobs end with the thread, on it (not later, in a garbage collection on some other thread)
        self.finished.connect(worker.deleteLater)

    def stop(self) -> None:
        """Cancel what runs and quit the event loop once the slot in progress returns."""
        self.worker.shutdown()
        self.quit()
