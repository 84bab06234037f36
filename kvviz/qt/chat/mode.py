"""The window's "Chat" mode: a conversation with the cache kept across its turns, drawn across the whole of it.

`ChatMode` owns the central "Chat" tab (`view`, where messages are typed) and the Controls' button page under the
strategy picker (`buttons`: Switch, to convert the chat's cache between turns or mid-answer). The model, the
strategy and the generation settings (max new tokens per reply) come from the shared Controls, as for a run. The
first message starts a conversation on the worker's thread (`Chatter`) with the strategy chosen then; later messages
go on with its cache. New chat starts from the cached system prompt; a changed system prompt starts a new
conversation.

The records are the engine's own `ConversationTrace`, read when the window redraws (about ten times a second while
an answer streams): the transcript, the plots over tokens in context with the turns marked, the cache map of the
latest step coloured by turn and role, and the per-turn table.

The Tokens and Runs docks belong to the local runs: they step aside while this mode is on screen.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QWidget

from kvviz.files.conversation import ConversationTrace
from kvviz.present import mib, ms, strategy_label
from kvviz.qt import unsaved
from kvviz.qt.chat.chatter import Chatter
from kvviz.qt.chat.help import HELP
from kvviz.qt.chat.series import ChatSeries
from kvviz.qt.chat.view import ChatView
from kvviz.qt.jobs import JobControl
from kvviz.qt.mode_api import FileEntry, Mode, ModeHost, refused_switch


class ChatMode(Mode):
    key = "chat"
    title = "Chat"
    short_title = "Chat"
    tip = "A conversation with the cache kept across its turns"
    hides_docks = True
    formats = (ConversationTrace,)
    help = HELP

    sigRequestBegin = Signal(int, object)  # to the chatter: chat id, request
    sigRequestAct = Signal(int, int, object)  # job id, chat id, action
    sigRequestSwitch = Signal(int, str, object)  # chat id, strategy, options
    sigTurnDone = Signal(int)  # turns done so far, once the last one is drawn

    def __init__(self, host: ModeHost):
        super().__init__(host)
        self.chatter = chatter = Chatter(host.model.worker)
        self.jobs = JobControl(chatter)
        self.view = view = ChatView()
        self.switch_button = QPushButton("Switch")
        self.switch_button.setToolTip("Convert the chat's cache to the strategy chosen above: now between turns, at "
                                      "the next step during an answer")
        self.buttons = QWidget()
        row = QHBoxLayout(self.buttons)
        row.setContentsMargins(9, 0, 9, 0)
        row.addWidget(self.switch_button)
        panels = host.panels
        self.controls = [panels.model_panel, panels.settings_panel, panels.strategy_panel]
        self.file_entries = (FileEntry("chat", "Save c&hat (a conversation file)…", self._ask_save),)

        self.chat_id = 0
        self.trace = None  # the ConversationTrace on screen
        self.opened = False  # it came from a file: shown, not continued
        self.system = ""  # the system prompt the conversation began with
        self.saved: tuple[object, Path] | None = None  # (trace, file) File ▸ Save chat last wrote
        self.generating = False
        self.starting = False  # asked to begin: the chatter has not answered yet
        self.latest_step = None  # the latest StepRecord (the cache map's layers)
        self.editing: int | None = None  # the index of the message Send replaces (Edit…)
        self._model_ready = False
        self._dirty = False
        self.series = ChatSeries()  # the chat's steps as plot columns, extended frame by frame

        view.send_button.clicked.connect(lambda *_: self.send())
        view.send_shortcut.activated.connect(self.send)
        view.stop_button.clicked.connect(lambda *_: self.stop())
        view.regenerate_button.clicked.connect(lambda *_: self.act({"kind": "regenerate"}))
        view.edit_button.clicked.connect(lambda *_: self.start_edit())
        view.new_chat_button.clicked.connect(lambda *_: self.new_chat())
        view.table.itemSelectionChanged.connect(self.update_buttons)
        self.switch_button.clicked.connect(lambda *_: self.switch())
        self.sigRequestBegin.connect(chatter.begin)
        self.sigRequestAct.connect(chatter.act)
        self.sigRequestSwitch.connect(chatter.switch)
        chatter.sigBegun.connect(self._on_begun)
        chatter.sigTurnStarted.connect(self._on_turn_started)
        chatter.sigProgress.connect(self._on_progress)
        chatter.sigTurnFinished.connect(self._on_turn_finished)
        chatter.sigNewChat.connect(self._on_new_chat)
        chatter.sigFailed.connect(self._on_failed)
        chatter.sigSwitched.connect(self._on_switched)
        chatter.sigSwitchRefused.connect(self._on_switch_refused)
        chatter.sigNotice.connect(self._on_notice)
        self.update_buttons()

    @property
    def busy(self) -> bool:
        return self.generating or self.starting

    # -- the user's actions --------------------------------------------------------------------------

    def send(self) -> bool:
        """Send the message in the box (or the edited one); False when it cannot go now (the window says why)."""
        text = self.view.message.toPlainText()
        if self.busy or not self.view.send_button.isEnabled():
            return False
        if not text.strip():
            self.host.show_error("Type a message first: an empty message is not sent.")
            return False
        system = self.view.system.text().strip()
        if self.trace is None or self.opened or system != self.system:
            self._begin(system)
        action = {"kind": "send", "text": text} if self.editing is None else {
            "kind": "edit", "index": self.editing, "text": text}
        self.editing = None
        self.view.message.clear()
        return self.act(action)

    def act(self, action: dict) -> bool:
        if self.busy and action["kind"] != "send" or (self.trace is None and not self.starting):
            return False
        action["reprefill"] = self.view.reprefill_box.isChecked()
        self.generating = action["kind"] != "new_chat"
        self.host.hide_error()
        self.sigRequestAct.emit(self.jobs.begin(), self.chat_id, action)
        self.host.update_controls()
        return True

    def new_chat(self) -> None:
        """A new chat from the cached system prompt; a changed system prompt begins a new conversation."""
        system = self.view.system.text().strip()
        if self.trace is None or self.opened or system != self.system:
            self._begin(system)
            self._changed()
            return
        self.act({"kind": "new_chat"})

    def start_edit(self) -> None:
        """The selected turn's message into the box: Send replaces it (the cache is cropped at its first change)."""
        rows = self.view.table.selectionModel().selectedRows()
        conversation = self.chatter.conversation
        if not rows or conversation is None or self.trace is None:
            return
        turn = self.trace.turns[rows[0].row()]
        users = [i for i, m in enumerate(conversation.messages) if m.role == "user"]
        chat_turns = [t for t in self.trace.turns if t.chat == turn.chat]
        if turn.chat != conversation.chat:
            self.host.show_error("That turn belongs to an earlier chat; edit a message of the chat on screen.")
            return
        place = [t.index for t in chat_turns if t.kind != "regenerate"]
        order = next((i for i, index in enumerate(place) if index >= turn.index), len(place) - 1)
        if order >= len(users):
            return
        self.editing = users[order]
        self.view.message.setPlainText(conversation.messages[self.editing].content)
        self.view.message.setFocus()
        self.host.note("Edit the message and Send: the answers after it are dropped", 10_000)

    def stop(self) -> None:
        if self.generating and self.jobs.stop():
            self.host.hold("stopping the answer after this step…")

    def switch(self) -> bool:
        picker = self.host.panels.strategy_panel
        problem = picker.problem()
        if self.trace is None or problem:
            if problem:
                self.host.show_error(f"Cannot switch: {problem}")
            return False
        self.sigRequestSwitch.emit(self.chat_id, picker.current(), picker.values())
        return True

    def _begin(self, system: str) -> None:
        panels = self.host.panels
        self.chat_id += 1
        self.system = system
        self.trace, self.latest_step, self.editing, self.opened = None, None, None, False
        self.starting = True
        request = {"strategy": panels.strategy_panel.current(), "options": panels.strategy_panel.values(),
                   "settings": panels.settings_panel.settings(), "system": system}
        self.sigRequestBegin.emit(self.chat_id, request)

    def open(self, trace: ConversationTrace) -> ConversationTrace | None:
        """Show a kept conversation (a kvviz-conversation file): its transcript, plots and table; the next message
        begins a new conversation. Returns it, or None while a chat is answering."""
        if self.busy:
            self.host.show_error("The chat is answering: stop it before opening a conversation file.")
            return None
        self.trace, self.opened, self.latest_step, self.editing = trace, True, None, None
        self.system = trace.system
        self.view.system.setText(trace.system)
        self._changed()
        return trace

    # -- the chatter's answers ---------------------------------------------------------------------

    def _on_begun(self, chat_id: int, trace) -> None:
        if chat_id == self.chat_id:
            self.trace, self.starting = trace, False
            self._changed()

    def _on_turn_started(self, chat_id: int, info: dict) -> None:
        if chat_id == self.chat_id:
            self._changed()

    def _on_progress(self, chat_id: int, step) -> None:
        if chat_id == self.chat_id:
            self.latest_step = step
            self._changed()

    def _on_turn_finished(self, chat_id: int, record) -> None:
        if chat_id != self.chat_id:
            return
        self._answered()
        if record.note:
            self.host.note(f"Turn {record.index + 1}: {record.note}")
        self.host.update_controls()
        self._changed()
        turns = len(self.trace.turns) if self.trace else 0
        self.host.redraw_then(lambda: self.sigTurnDone.emit(turns))

    def _on_new_chat(self, chat_id: int, prefix) -> None:
        if chat_id != self.chat_id:
            return
        self._answered()
        self.latest_step = None
        conversation = self.chatter.conversation
        if prefix is None:
            self.host.note("New chat: the chats share no prefix, so it starts empty")
        else:
            self.host.note(
                f"New chat from the cached prefix: {prefix.tokens:,} tokens, {mib(prefix.cache_bytes)} kept and "
                f"{mib(conversation.pending_copy_bytes)} copied for this chat (a deep copy doubles it); saves its "
                f"prefill of {ms(prefix.prefill_ms)}", 20_000)
        self.host.update_controls()
        self._changed()

    def _on_failed(self, chat_id: int, message: str) -> None:
        if chat_id != self.chat_id:
            return
        if self.starting:
            self.trace, self.starting = None, False
        self._answered()
        self.host.show_error(f"Chat: {message}")
        self.host.update_controls()
        self._changed()

    def _answered(self) -> None:
        """The action asked of the chatter is over."""
        self.generating = False
        self.jobs.end(self.jobs.running)

    def _on_switched(self, chat_id: int, strategy: str) -> None:
        if chat_id == self.chat_id:
            when = "at the next step" if self.generating else "now"
            self.host.say(f"the chat's cache switches to {strategy} {when}")

    def _on_switch_refused(self, chat_id: int, strategy: str, why: str) -> None:
        """A refused switch ends nothing: the answer being generated goes on with the cache it has."""
        if chat_id == self.chat_id:
            self.host.show_error(refused_switch(strategy, why))

    def _on_notice(self, chat_id: int, message: str) -> None:
        if chat_id == self.chat_id and message:
            self.host.note(message)

    # -- the controls --------------------------------------------------------------------------------

    def can_start(self) -> bool:
        return self.view.send_button.isEnabled()

    def start(self, extra_settings=None) -> int | None:
        """Run ▸ Run (Ctrl+Enter) sends the message; the id of the job answering it, None when it was not sent."""
        return self.jobs.running if self.send() else None

    def can_switch(self) -> bool:
        return self.switch_button.isEnabled()

    def update_controls(self, ready: bool) -> None:
        self._model_ready = ready and self.host.panels.strategy_panel.problem() is None
        self.update_buttons()

    def status(self) -> str:
        return "answering…" if self.generating else ""

    def update_buttons(self) -> None:
        ready = self._model_ready and not self.busy
        started = self.trace is not None and not self.opened
        answered = started and bool(self.chatter.conversation and self.chatter.conversation.messages
                                    and self.chatter.conversation.messages[-1].role == "assistant")
        view = self.view
        view.send_button.setEnabled(ready)
        view.send_button.setText("Send edit" if self.editing is not None else "Send")
        view.stop_button.setEnabled(self.generating)
        view.regenerate_button.setEnabled(ready and answered)
        view.edit_button.setEnabled(ready and started and bool(view.table.selectionModel().selectedRows()))
        view.new_chat_button.setEnabled(ready)
        view.system.setEnabled(not self.busy)
        self.switch_button.setEnabled(started and (ready or self.generating))

    # -- drawing --------------------------------------------------------------------------------------

    def _changed(self) -> None:
        self._dirty = True
        self.update_buttons()
        self.sigChanged.emit()

    def plots(self) -> list:
        return self.view.plots

    def redraw_parts(self) -> list:
        """The parts that draw what changed (the redraw scheduler gives each its own turn of the event loop, as the
        local view's plots get): the transcript, each plot, then the table and header."""
        if not (self._dirty or self.generating):
            return []
        self._dirty = False
        trace, conversation = self.trace, self.chatter.conversation
        if trace is None or (conversation is None and not self.opened):
            return [lambda: self.view.show_transcript([], None)]
        turns = list(trace.turns)
        if self.opened:  # the file's last chat, as it ended
            chat = turns[-1].chat if turns else 0
            messages = [(m.role, m.content) for m in trace.messages if m.turn is None or turns[m.turn].chat == chat]
        else:
            chat = conversation.chat
            messages = [(m.role, m.content) for m in list(conversation.messages)]
        steps = self.series.update(trace.steps, turns, chat)
        streaming = None
        if self.generating:
            streaming = "".join(s.token for s in steps[self.series.turn_begins(len(turns)):])
        starts = [(t.index + 1, t.start) for t in turns if t.chat == chat]
        x, columns = self.series.x, self.series.columns
        parts = [lambda: self.view.show_transcript(messages, streaming),
                 lambda: self.view.memory_plot.show_chat(x, columns, starts),
                 lambda: self.view.latency_plot.show_chat(x, columns, starts)]
        if self.latest_step is not None:
            layers = self.latest_step.layers
            parts.append(lambda: self.view.cache_map.show_map(layers, self._owners(turns, chat), starts))

        def table() -> None:
            self.view.show_turns(turns)
            self.view.header.setText(self.header_text(turns))

        return [*parts, table]

    def _owners(self, turns, chat: int) -> list[tuple[int, str]]:
        """Per position of the chat on screen: (turn number, role) of the token there."""
        owners: list[tuple[int, str]] = []
        for turn in (t for t in turns if t.chat == chat):
            del owners[turn.start:]
            # the template's tokens between the last answer and this message (its end-of-turn marks) are the answer's
            owners += [owners[-1] if owners else (0, "system")] * (turn.start - len(owners))
            owners += [(turn.index + 1, "user")] * (turn.prompt_end - turn.start)
            owners += [(turn.index + 1, "assistant")] * (turn.end - turn.prompt_end)
        if self.generating and self.latest_step is not None:  # the answer being generated
            number = len(turns) + 1
            owners += [(number, "assistant")] * (self.latest_step.position + 1 - len(owners))
        return owners

    def header_text(self, turns) -> str:
        trace = self.trace
        name = (trace.model or {}).get("name", "?")
        if self.opened or self.chatter.conversation is None:
            label = strategy_label(turns[-1].strategy if turns else trace.strategy)
        else:
            choice = self.chatter.conversation.choice
            label = strategy_label({"name": choice.name, "options": choice.options})
        state = "answering…" if self.generating else f"{len(turns)} turns" + (" (opened from a file)" * self.opened)
        return f"<b>{name}</b> with <b>{label}</b>: {state}; turns written with {trace.template}"

    # -- kept chats ----------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path | None:
        """File ▸ Save chat: the chat on screen as `kvviz chat --trace` keeps it (a kvviz-conversation file), every
        finished turn and the one answering so far; a close writes its turns there again. None (and a message
        saying why) when there is nothing to save or it cannot be written."""
        trace = self.trace
        if trace is None or not trace.turns:
            self.host.tell("Nothing to save", "Chat first (Controls ▸ Chat), or open a conversation file.")
            return None
        saved = self.host.write("the chat", lambda: trace.save(path), path, lambda _: f"{len(trace.turns)} turns")
        if saved is not None:
            self.saved = (trace, saved)
        return saved

    def _ask_save(self) -> None:
        path = self.host.dialogs.save_file("kept", "Save chat", "chat.kvviz-conversation.json",
                                           "kvviz conversations (*.json)")
        if path:
            self.save(path)

    def keep_at_close(self) -> Path | None:
        """Once the worker has stopped (the answer being generated ends at its step in progress), write the chat's
        finished turns again to the file it was last saved to, or else to a new file in the folder of unsaved work
        (kvviz.qt.unsaved); returns the file, or None when no turn was taken. The chat is the worker's (what it did
        last may not have reached the window before it stopped; a conversation file opened since does not replace
        it). Raises OSError when it cannot be written."""
        conversation = self.chatter.conversation
        trace = conversation.trace if conversation is not None else None
        if trace is None or not trace.turns:
            return None
        trace.cancelled = trace.cancelled or (self.busy and trace.turns[-1].cancelled)  # stopped by the close
        if self.saved is not None and self.saved[0] is trace:
            return trace.save(self.saved[1])
        folder = unsaved.folder()
        folder.mkdir(parents=True, exist_ok=True)
        return trace.save(folder / f"conversation-{time.strftime('%Y%m%d-%H%M%S')}.json")

    def restyle(self, palette) -> None:
        self.view.apply_palette(palette)
        self._dirty = True

    def shutdown(self) -> None:
        self.jobs.shutdown()
