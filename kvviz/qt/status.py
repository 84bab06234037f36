"""What the window says about itself: the status bar line, and the error message above the plots."""

from __future__ import annotations

import re
import time
from typing import Any

import psutil
from PySide6.QtCore import QObject, Qt, QTimer
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QStatusBar, QToolButton, QWidget

from kvviz.present import UNKNOWN, mib, number, percent
from kvviz.qt.mode_api import Figures, Mode
from kvviz.qt.model_host import ModelHost
from kvviz.qt.run_store import RunStore
from kvviz.qt.series import RunSeries

_DIGIT = re.compile(r"\d")


class StatusLine(QObject):
    """The status bar: what the window is doing, device and threads, tokens/s (and the share of the
    memory-bound limit) and cache size of the run in view, and this process's RSS (sampled once a second).

    What the window is doing, by precedence: a note held until the generation ends ("stopping after this
    step…"), the generating run's notice while a one-time pause lasts ("compiling …: 12 s", counted up every
    second so that a long pause never looks frozen), then the window's own state."""

    def __init__(self, status_bar: QStatusBar, parent: QObject | None = None):
        super().__init__(parent)
        self.labels = {name: QLabel() for name in ("state", "device", "threads", "rate", "cache", "rss")}
        # Every field is sized so that its text changing lays nothing out: a label in a layout whose text changes
        # makes Qt lay out each layout above it again (QLayout::activate updates its widget's geometry), up to the
        # main window, its docks re-placed and repainted, at every frame while a run's figures change.
        for name in ("device", "threads", "rate", "cache", "rss"):
            status_bar.addPermanentWidget(self.labels[name])
        status_bar.addWidget(_Holder(self.labels["state"]), 1)
        self._held = ""  # a note kept until the generation ends ("stopping after this step…")
        self._notice = ""  # what the generating run's one-time pause is doing ("" when none lasts)
        self._notice_since = 0.0
        self._state = ""
        self._process = psutil.Process()
        self._rss_bytes: int | None = self._process.memory_info().rss
        self._timer = QTimer(self)
        self._timer.setInterval(1000)
        self._timer.timeout.connect(self._sample_rss)
        self._timer.start()

    def say(self, text: str) -> None:
        """A note in place of the state, until the next update."""
        self.labels["state"].setText(text)

    def hold(self, text: str) -> None:
        """A note in place of the state, until the generation ends."""
        self._held = text
        self.say(text)

    def notice(self, run_id: int, message: str) -> None:
        """The worker's sigRunNotice: a one-time pause of run `run_id` began ("" when it is over)."""
        if message != self._notice:
            self._notice = message
            self._notice_since = time.perf_counter()
        self._show_state()

    @property
    def notice_text(self) -> str:
        return self._notice

    def update(self, state: str, generating: bool, card: dict[str, Any] | None, figures: Figures) -> None:
        """state: what the window does now (`state_words`); generating: a job runs (a note held lasts until it
        ends); figures: the speed, its share of the memory-bound limit and the cache of what is in view
        (`window_figures`)."""
        card = card or {}
        _show(self.labels["device"], f"device {card.get('device', UNKNOWN)}")
        _show(self.labels["threads"], f"{card.get('threads', UNKNOWN)} threads")
        if not generating:
            self._held = ""
            self._notice = ""  # a run's pause cannot outlast the run
        self._state = state
        self._show_state()
        rate, share, cache_bytes = figures
        bound = f" ({percent(share)} of the memory-bound limit)" if share is not None else ""
        _show(self.labels["rate"], f"{number(rate)} tokens/s{bound}")
        _show(self.labels["cache"], f"cache {mib(cache_bytes)}")
        self._show_rss()

    def _show_state(self) -> None:
        text = self._held or self._state
        if not self._held and self._notice:
            text = f"{self._notice}: {time.perf_counter() - self._notice_since:.0f} s"
        self.labels["state"].setText(text)

    def stop(self) -> None:
        self._timer.stop()

    def _sample_rss(self) -> None:
        if self._notice:
            self._show_state()  # the pause's seconds count up
        try:
            self._rss_bytes = self._process.memory_info().rss
        except psutil.Error:
            return
        self._show_rss()

    def _show_rss(self) -> None:
        _show(self.labels["rss"], f"RSS {mib(self._rss_bytes, 0)}")


def _show(label: QLabel, text: str) -> None:
    """A figure's text in its field, at a fixed size (a fixed-size widget asks no layout to run again) that changes
    only with the text's shape, or the theme's font and padding: as wide as the text with each digit the widest."""
    label.setText(text)  # Qt does nothing when the text is the same
    metrics = label.fontMetrics()
    widest = max("0123456789", key=metrics.horizontalAdvance)
    hint = label.sizeHint()
    width = hint.width() + metrics.horizontalAdvance(_DIGIT.sub(widest, text)) - metrics.horizontalAdvance(text)
    if (label.minimumWidth(), label.maximumWidth(), label.minimumHeight(), label.maximumHeight()) != (
            width, width, hint.height(), hint.height()):
        label.setFixedSize(width, hint.height())


class _Holder(QWidget):
    """The state's field: its words change as a run goes ("generating run #1: 40 tokens") and it takes the status
    bar's free width, so it cannot have a fixed size; its label lies in this widget without a layout, sized to it."""

    def __init__(self, label: QLabel):
        super().__init__()
        self.label = label
        label.setParent(self)
        self.setMinimumHeight(label.sizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.label.resize(event.size())


def window_figures(modes: list[Mode], current: Mode, store: RunStore) -> Figures:
    """The status bar's figures for what runs or is in view: those of a mode running a job or on screen that has its
    own (an evaluation reads as the strategies reading now), else the runs': the run generating or the run in view."""
    for mode in [*(m for m in modes if m.busy), current]:
        figures = mode.figures()
        if figures is not None:
            return figures
    series: RunSeries | None = store.runs[store.generating] if store.generating is not None else store.primary()
    if series is None:
        return None, None, None
    return series.tokens_per_s, series.share_of_memory_bound, series.cache_bytes


def state_words(modes: list[Mode], current: Mode, model: ModelHost) -> str:
    """The status bar's first words: what the window is doing (a model loading, a mode's job), else what the mode on
    screen says (why Run is off)."""
    if model.loading:
        return "loading model…"
    busy = next((mode for mode in modes if mode.busy), None)
    if busy is not None:
        return busy.status() or f"{busy.title}: working…"
    if model.card is None:
        return "no model loaded"
    return current.status() or "ready"


class ErrorBar(QFrame):
    """The message above the plots: what went wrong, in words, until dismissed or the next success."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("errorBar")
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QToolButton()
        close.setText("✕")
        close.setToolTip("Dismiss")
        close.clicked.connect(self.hide)
        bar = QHBoxLayout(self)
        bar.setContentsMargins(10, 6, 6, 6)
        bar.addWidget(self.label, 1)
        bar.addWidget(close)
        self.hide()

    def show_message(self, text: str) -> None:
        self.label.setText(text)
        self.show()
