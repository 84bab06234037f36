"""The Chat mode's engine side: a `kvviz.engine.conversation.Conversation` on the worker's thread.

`Chatter` lives on the `Worker`'s thread (a kvviz.qt.jobs.WorkerJob, as the Evaluate tab's evaluator): `begin` (a
new conversation with the chosen strategy and system prompt) and `act` (send, regenerate, edit, new chat) are queued
slots, and every engine call runs there. While a turn generates, the loop serves the chatter's own queued calls
between two steps (`switch`), so that a switch mid-answer takes effect at the next step. Records travel as the
engine's own `ConversationTrace`, which the window reads when it redraws; the latest step's per-layer record (the
cache map) comes with each progress signal. Each action is a job of its own id: `cancel()` may be called from any
thread, even before the worker takes the action up. Each finished turn is journaled in the folder of unsaved work
(`kvviz.qt.unsaved`), so that a window killed while chatting loses at most the turn in progress.
"""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import QCoreApplication, QEvent, Signal, Slot

from kvviz.errors import failure
from kvviz.qt import unsaved
from kvviz.qt.jobs import WorkerJob
from kvviz.qt.worker import Worker

PROGRESS_INTERVAL_S = 0.1  # about ten redraws a second while a reply streams


class Chatter(WorkerJob):
    sigBegun = Signal(int, object)  # chat id, the ConversationTrace (its turns and steps fill as it goes)
    sigTurnStarted = Signal(int, object)  # chat id, {"kind", "prompt_tokens", "kept"}
    sigProgress = Signal(int, object)  # chat id, the latest StepRecord (its layers draw the cache map)
    sigTurnFinished = Signal(int, object)  # chat id, the TurnRecord (cancelled or not)
    sigNewChat = Signal(int, object)  # chat id, the PrefixRecord new chats start from (None: none to share)
    sigFailed = Signal(int, str)  # chat id, why the request was refused (user-facing; the chat stays as it was)
    sigSwitched = Signal(int, str)  # chat id, the strategy the cache switches to
    sigSwitchRefused = Signal(int, str, str)  # chat id, the strategy, why not (the answer being generated goes on)
    sigNotice = Signal(int, str)  # chat id, what a long one-time pause is doing ("" once over)

    def __init__(self, worker: Worker):
        super().__init__(worker)
        self.conversation = None
        self.journal = None  # the conversation's finished turns, on disk (None: the folder cannot be written)
        self.chat_id = 0

    # -- any thread ----------------------------------------------------------------------------------

    def cancel(self, job_id: int | None = None) -> None:
        """Stop the reply being generated after its step in progress (or action `job_id` at its first step); the
        turn keeps what it generated. The decoder is told at once: a pause before the first step (a compile) ends
        too."""
        super().cancel(job_id)
        conversation = self.conversation
        if conversation is not None:
            conversation.cancel()

    # -- worker thread -------------------------------------------------------------------------------

    @Slot(int, object)
    def begin(self, chat_id: int, request: dict[str, Any]) -> None:
        """request: "strategy", "options", "settings" (GenerationSettings fields), "system"."""
        try:
            from kvviz.engine import strategies
            from kvviz.engine.conversation import Conversation
            from kvviz.engine.decode import GenerationSettings

            loaded = self.worker.loaded
            if loaded is None:
                raise RuntimeError("no model is loaded yet; load one first")
            choice = strategies.choose(request["strategy"], dict(request["options"]))
            settings = GenerationSettings(**request["settings"])
            self.conversation = Conversation(loaded, choice, settings, system=request["system"],
                                             notify=lambda message: self.sigNotice.emit(chat_id, message))
            self.chat_id = chat_id
            self.journal = unsaved.conversation_journal(chat_id, self.conversation.trace)
        except Exception as exc:  # noqa: BLE001 - refused: the window says why
            self.sigFailed.emit(chat_id, failure("starting the conversation", exc))
            return
        self.sigBegun.emit(chat_id, self.conversation.trace)

    @Slot(int, int, object)
    def act(self, job_id: int, chat_id: int, action: dict[str, Any]) -> None:
        """action: {"kind": "send", "text"}, {"kind": "regenerate"}, {"kind": "edit", "index", "text"},
        {"kind": "new_chat"}; "reprefill": also measure a full re-prefill of the history after the turn. job_id:
        this action's own (`cancel`)."""
        conversation = self.conversation
        if conversation is None or chat_id != self.chat_id:
            return
        with self.running(job_id) as cancel:
            self._act(chat_id, action, cancel)

    def _act(self, chat_id: int, action: dict[str, Any], cancel) -> None:
        conversation = self.conversation
        try:
            if action["kind"] == "new_chat":
                conversation.new_chat()
                self.sigNewChat.emit(chat_id, conversation.trace.prefix)
                return
            if action["kind"] == "send":
                turn = conversation.send(action["text"])
            elif action["kind"] == "regenerate":
                turn = conversation.regenerate()
            else:
                turn = conversation.edit(action["index"], action["text"])
        except Exception as exc:  # noqa: BLE001 - refused (an empty message, a full context): the chat is as it was
            self.sigFailed.emit(chat_id, failure("the conversation's turn", exc))
            return
        self.sigTurnStarted.emit(chat_id, {"kind": action["kind"], "prompt_tokens": turn.prompt_tokens,
                                           "kept": turn.kept})
        last = 0.0
        try:
            if cancel.is_set():  # stopped before it began: it ends at its first step
                conversation.cancel()
            for step in turn:
                now = time.perf_counter()
                if now - last >= PROGRESS_INTERVAL_S:
                    last = now
                    self.sigProgress.emit(chat_id, step)
                QCoreApplication.sendPostedEvents(self, QEvent.Type.MetaCall)  # a switch asked meanwhile
            if action.get("reprefill"):
                conversation.reprefill(turn)
        except Exception as exc:  # noqa: BLE001 - a failure inside the model: the turn keeps what it had
            self.sigFailed.emit(chat_id, failure("the conversation's turn", exc))
        finally:
            steps = turn.decoder.trace.steps
            if steps:
                self.sigProgress.emit(chat_id, steps[-1])
            if self.journal is not None:
                self.journal.update()
            self.sigTurnFinished.emit(chat_id, turn.record)

    @Slot(int, str, object)
    def switch(self, chat_id: int, strategy: str, options: dict[str, Any]) -> None:
        """Switch the conversation's cache: at the next step of the reply being generated, or now between turns."""
        conversation = self.conversation
        if conversation is None or chat_id != self.chat_id:
            return
        try:
            from kvviz.engine import strategies

            conversation.request_switch(strategies.choose(strategy, dict(options)))
        except Exception as exc:  # noqa: BLE001 - refused: the window says why
            self.sigSwitchRefused.emit(chat_id, strategy, failure(f"switching to {strategy}", exc))
            return
        self.sigSwitched.emit(chat_id, strategy)
