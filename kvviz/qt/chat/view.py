"""The Chat tab's widgets: the chat (system prompt, transcript, message box and its buttons) beside the
plots across the conversation and the per-turn table."""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut, QTextCursor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from kvviz.present import UNKNOWN, mib, ms, number
from kvviz.qt.chat.plots import ROLE_COLOURS, ChatCacheMap, ChatLatencyPlot, ChatMemoryPlot

COLUMNS = ("turn", "tokens added", "kept", "new", "first token", "full re-prefill", "decode tokens/s",
           "cache MiB", "evicted", "note")


class ChatView(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.header = QLabel("Load a model, choose a strategy, and send a message.")
        self.header.setWordWrap(True)
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.system = QLineEdit()
        self.system.setPlaceholderText("System prompt (prefilled once: new chats start from a copy of its cache)")
        self.transcript = QTextBrowser()
        self.transcript.setOpenLinks(False)
        self._shown_messages: list[tuple[str, str]] = []  # what the transcript's document holds
        self._streaming_at: int | None = None  # where the answer being generated begins in it
        self.message = QPlainTextEdit()
        self.message.setPlaceholderText("Your message (Ctrl+Enter sends)")
        self.message.setMaximumHeight(self.fontMetrics().height() * 5)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("runButton")
        self.send_button.setToolTip("Send the message (Ctrl+Enter): only its tokens are fed, the history's cache is "
                                    "kept")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the answer after the current step; the turn keeps what it generated")
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("The last answer again: the cache is cropped back to the end of your "
                                          "message, nothing before it is recomputed")
        self.edit_button = QPushButton("Edit…")
        self.edit_button.setToolTip("Put the message of the turn selected in the table into the box: Send then "
                                    "replaces it, drops what came after, and recomputes from its first changed token")
        self.new_chat_button = QPushButton("New chat")
        self.new_chat_button.setToolTip("Start a new chat from the cached system prompt (a deep copy of its cache: "
                                        "as large again)")
        self.reprefill_box = QCheckBox("Measure a full re-prefill after each turn")
        self.reprefill_box.setToolTip("After each turn, prefill the whole history into a fresh cache and time it: "
                                      "what the first token would cost without the kept cache (measured, not "
                                      "estimated)")
        self.send_shortcut = QShortcut(QKeySequence("Ctrl+Return"), self.message)

        chat = QWidget()
        column = QVBoxLayout(chat)
        column.setContentsMargins(4, 4, 4, 4)
        column.addWidget(self.header)
        column.addWidget(self.system)
        column.addWidget(self.transcript, 1)
        column.addWidget(self.message)
        buttons = QHBoxLayout()
        for button in (self.send_button, self.stop_button, self.regenerate_button, self.edit_button,
                       self.new_chat_button):
            buttons.addWidget(button)
        column.addLayout(buttons)
        column.addWidget(self.reprefill_box)

        self.memory_plot = ChatMemoryPlot()
        self.latency_plot = ChatLatencyPlot()
        self.cache_map = ChatCacheMap()
        self.plots = [self.memory_plot, self.latency_plot, self.cache_map]
        self.table = QTableWidget(0, len(COLUMNS))
        self._rows: list[tuple[str, ...]] = []  # the cells each row shows
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        right = QSplitter(Qt.Orientation.Vertical)
        for plot in self.plots:
            right.addWidget(plot)
        right.addWidget(self.table)
        self.table.setMinimumHeight(self.fontMetrics().height() * 7)  # the header and a few turns at least
        right.setSizes([300, 300, 260, 220])
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(chat)
        split.addWidget(right)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(split)
        # the window's minimum size stays the other modes' (a tab's minimum would be the window's): this tab is
        # laid out in whatever room the window gives its views
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Ignored)

    def apply_palette(self, palette) -> None:
        for plot in self.plots:
            plot.apply_palette(palette)

    def show_transcript(self, messages: list[tuple[str, str]], streaming: str | None) -> None:
        """messages: (role, text) of the chat on screen; streaming: the answer being generated (None: none).
        While an answer streams only its paragraph is written again: the document is laid out anew only when the
        messages change (a whole document per frame grew with the chat and held the event loop)."""
        bar = self.transcript.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 4  # following the chat (not scrolled back to read)
        if messages != self._shown_messages:
            self._shown_messages = list(messages)
            self.transcript.setHtml("".join(f"<p>{_message_html(role, text)}</p>" for role, text in messages))
            self._streaming_at = None
        if streaming is not None or self._streaming_at is not None:
            cursor = QTextCursor(self.transcript.document())
            if self._streaming_at is None:  # a paragraph of its own after the messages
                cursor.movePosition(QTextCursor.MoveOperation.End)
                if messages:
                    cursor.insertBlock()
                self._streaming_at = cursor.position()
            else:
                cursor.setPosition(self._streaming_at)
                cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
            if streaming is None:  # the answer ended without joining the messages (stopped before a token)
                cursor.removeSelectedText()
                self._streaming_at = None
            else:
                cursor.insertHtml(_message_html("assistant", streaming + " ▌"))
        if at_end:  # the latest words in view
            self.transcript.moveCursor(QTextCursor.MoveOperation.End)
            self.transcript.ensureCursorVisible()
            bar.setValue(bar.maximum())

    def show_turns(self, turns) -> None:
        """One row per turn (TurnRecords) of the whole conversation."""
        self.table.setRowCount(len(turns))
        del self._rows[len(turns):]
        for row, turn in enumerate(turns):
            chat = f" (chat {turn.chat + 1})" if turn.chat else ""
            kind = "" if turn.kind == "send" else f", {turn.kind}"
            rate = turn.decode_tokens_per_s
            cells = (f"{turn.index + 1}{chat}{kind}", f"{turn.recomputed:,}", f"{turn.kept:,}",
                     f"{turn.new_tokens:,}", ms(turn.ttft_ms), ms(turn.reprefill_ms), number(rate),
                     mib(turn.cache_bytes, unit=False), f"{turn.evicted:,}",
                     ("stopped; " if turn.cancelled else "") + (turn.note or ""))
            if row < len(self._rows) and self._rows[row] == cells:  # a row drawn as it is (most of a long chat)
                continue
            self._rows[row:row + 1] = [cells]
            for column, text in enumerate(cells):
                item = self.table.item(row, column)
                if item is None:
                    item = QTableWidgetItem()
                    self.table.setItem(row, column, item)
                if item.text() != text:
                    item.setText(text or UNKNOWN if column < len(cells) - 1 else text)
                    item.setToolTip(text)


def _message_html(role: str, text: str) -> str:
    return f'<b style="color:{ROLE_COLOURS[role][0]}">{role}</b><br>{escape(text).replace(chr(10), "<br>")}'
