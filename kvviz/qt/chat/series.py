"""The steps of the chat on screen as the columns its plots draw, extended by the steps that arrived since the last
frame: a frame's work follows the tokens that arrived, not the length of the conversation."""

from __future__ import annotations

from bisect import bisect_left

import numpy as np


class ChatSeries:
    def __init__(self):
        self._reset(None, None)

    def _reset(self, steps, chat) -> None:
        self._source, self._chat, self._read = steps, chat, 0
        self.steps: list = []  # the chat's ConversationSteps
        self._turn: list[int] = []  # each step's turn (sorted: steps arrive turn by turn)
        self._values: dict[str, list] = {name: [] for name in ("position", "wall_ms", "cache_bytes",
                                                                "predicted_cache_bytes", "prefill", "connect")}
        self.x = np.zeros(0)
        self.columns: dict[str, np.ndarray] = {}

    def update(self, steps: list, turns: list, chat: int) -> list:
        """Take the steps of `steps` (a ConversationTrace's, which only grows) that arrived since the last call and
        belong to `chat` (or to the turn being generated); returns the chat's steps. Another trace or chat starts
        over."""
        if steps is not self._source or chat != self._chat:
            self._reset(steps, chat)
        arrived = steps[self._read:]  # a slice: the worker thread may append meanwhile
        self._read += len(arrived)
        values = self._values
        for step in arrived:
            if step.turn < len(turns) and turns[step.turn].chat != chat:
                continue
            if self.steps:  # a curve is drawn within a turn, never across the gap of the next message
                values["connect"][-1] = self.steps[-1].turn == step.turn
            self.steps.append(step)
            self._turn.append(step.turn)
            values["position"].append(step.position)
            values["wall_ms"].append(step.wall_ms)
            values["cache_bytes"].append(np.nan if step.cache_bytes is None else step.cache_bytes)
            values["predicted_cache_bytes"].append(
                np.nan if step.predicted_cache_bytes is None else step.predicted_cache_bytes)
            values["prefill"].append(step.phase == "prefill")
            values["connect"].append(False)
        if arrived or not self.columns:
            self.x = np.array(values["position"], dtype=float)
            self.columns = {name: np.array(values[name], dtype=int if name == "prefill" else
                                           bool if name == "connect" else float)
                            for name in values if name != "position"}
        return self.steps

    def turn_begins(self, turn: int) -> int:
        """The index in `steps` of the first step of `turn` or later."""
        return bisect_left(self._turn, turn)
