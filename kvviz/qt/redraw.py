"""When the window redraws: at most ~30 times a second, only when something changed, within a budget,
and a frame at a time in small parts.

Records arrive one per token from other threads; drawing each at once would spend the GUI thread's
time on frames nobody sees. `schedule()` starts a single-shot timer instead, so the records that
arrive meanwhile are drawn together. The interval grows when frames get expensive, so that drawing
and painting take at most REDRAW_BUDGET of wall time.

A scheduled frame is drawn part by part (one plot each), each part in its own turn of the event loop:
Qt lays out and paints what a part changed before the next part starts, and input and timers are
served in between. Drawn in one turn, a frame held the loop for 55-73 ms while the model decoded
beside it on this 2-core machine; the parts hold it for one plot's worth each.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from PySide6.QtCore import QObject, QTimer

REDRAW_INTERVAL_MS = 1000.0 / 30.0  # at most ~30 redraws a second
# and at most this share of wall time spent redrawing and painting: where torch's threads fill the cores, the GUI
# thread's time comes out of the decode the window measures and shows. Default model on 2 cores, 128 tokens, 8
# alternated pairs: at 0.04 the window decoded at 0.950 of plain model.generate with a frame about every second, at
# 0.02 at 0.977 with one about every two seconds (0.10 had given 0.81)
REDRAW_BUDGET = 0.02

Part = Callable[[], None]


class PaintClock:
    """Milliseconds the window spent painting since the last `take()`: every widget of it, plots, labels and
    tables alike, paints when Qt syncs the window's backing store on the UpdateRequest event the window receives
    (`MainWindow.event` times it), so a frame's cost counts all the painting it causes."""

    spent_ms = 0.0

    @classmethod
    def take(cls) -> float:
        spent, cls.spent_ms = cls.spent_ms, 0.0
        return spent

    @classmethod
    @contextmanager
    def timing(cls) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            cls.spent_ms += (time.perf_counter() - started) * 1000.0


class RedrawScheduler(QObject):
    def __init__(self, frame: Callable[[], list[Part]], parent: QObject | None = None):
        """frame: takes the records that arrived and returns the parts that draw them, in order (the window's)."""
        super().__init__(parent)
        self._frame = frame
        self.count = 0  # frames drawn
        self.last_ms = 0.0  # time of the last frame's parts, without their painting
        self.cost_ms = 0.0  # smoothed cost of a frame: its parts plus painting
        self._last = 0.0
        self._stopped = False
        self._parts: list[Part] = []  # of the frame being drawn part by part
        self._frame_ms = 0.0
        self._again = False  # something changed while a frame was being drawn
        self._waiting: list[Callable[[], None]] = []  # redraw_then's, for the next frame to begin
        self._drawing_for: list[Callable[[], None]] = []  # redraw_then's, for the frame being drawn
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._begin)
        self._next = QTimer(self)  # the next part, after the event loop has served what is waiting
        self._next.setSingleShot(True)
        self._next.setInterval(0)
        self._next.timeout.connect(self._draw_part)

    def schedule(self) -> None:
        """Redraw soon: after the interval since the last frame, unless a redraw is already due."""
        if self._stopped or self._timer.isActive():
            return
        if self._parts:
            self._again = True
            return
        since = (time.perf_counter() - self._last) * 1000.0
        interval = max(REDRAW_INTERVAL_MS, self.cost_ms / REDRAW_BUDGET)
        self._timer.start(int(max(0.0, interval - since)))

    def redraw(self) -> None:
        """Redraw now, all parts at once (a frame being drawn in parts is replaced)."""
        if self._stopped:
            return
        self._next.stop()
        self._timer.stop()
        self._again = False
        drawn, self._drawing_for, self._waiting = self._drawing_for + self._waiting, [], []
        started = time.perf_counter()
        for part in self._frame():
            part()
        self._parts = []
        self._end((time.perf_counter() - started) * 1000.0)
        for then in drawn:
            then()

    def redraw_then(self, then: Callable[[], None]) -> None:
        """Draw a frame now, part by part, and call `then` once it is drawn: the end of a run, whose last
        records are on screen when the window says it is over. Drawn at once, that frame held the event loop
        for 60-70 ms with the scenes' painting (2 cores, default model)."""
        if self._stopped:
            return
        self._waiting.append(then)
        if not self._parts:  # else the next frame begins when this one ends: it may lack the last records
            self._timer.start(0)

    def stop(self) -> None:
        """No more frames (the window is closing)."""
        self._stopped = True
        self._timer.stop()
        self._next.stop()
        self._parts = []
        self._waiting, self._drawing_for = [], []

    def _begin(self) -> None:
        if self._stopped:
            return
        self._drawing_for, self._waiting = self._waiting, []
        started = time.perf_counter()
        self._parts = self._frame()
        self._frame_ms = (time.perf_counter() - started) * 1000.0
        self._draw_part()

    def _draw_part(self) -> None:
        parts = self._parts
        started = time.perf_counter()
        try:
            if parts:
                parts.pop(0)()
        finally:  # a part that raised loses its own drawing only: the frame goes on
            self._frame_ms += (time.perf_counter() - started) * 1000.0
            if parts is self._parts:  # else the part called redraw(), which drew a whole frame in its place
                self._after_part()

    def _after_part(self) -> None:
        if self._parts:
            self._next.start()
            return
        self._end(self._frame_ms)
        drawn, self._drawing_for = self._drawing_for, []
        for then in drawn:
            then()
        if self._waiting:
            self._again = False
            self._timer.start(0)
        elif self._again:
            self._again = False
            self.schedule()

    def _end(self, frame_ms: float) -> None:
        self._last = time.perf_counter()
        self.last_ms = frame_ms
        # cost of a frame: its parts plus the painting since the previous frame
        self.cost_ms = 0.7 * self.cost_ms + 0.3 * (frame_ms + PaintClock.take())
        self.count += 1
