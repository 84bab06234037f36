"""When the window redraws: at most ~30 times a second, only when something changed, and within a budget.

Records arrive one per token from other threads; drawing each at once would spend the GUI thread's
time on frames nobody sees. `schedule()` starts a single-shot timer instead, so the records that
arrive meanwhile are drawn together. The interval grows when frames get expensive, so that drawing
and painting take at most REDRAW_BUDGET of wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer

from kvviz.qt.plots.base import PaintClock

REDRAW_INTERVAL_MS = 1000.0 / 30.0  # at most ~30 redraws a second
# and at most this share of wall time spent redrawing and painting: on 2 cores the GUI thread's time
# comes out of torch's threads; at 0.10 the window decoded at 0.81 of plain model.generate, at 0.04 at 0.92
REDRAW_BUDGET = 0.04


class RedrawScheduler(QObject):
    def __init__(self, draw: Callable[[], None], parent: QObject | None = None):
        """draw: updates every view from the run store (the window's)."""
        super().__init__(parent)
        self._draw = draw
        self.count = 0  # frames drawn
        self.last_ms = 0.0  # time of the last frame's update, without its painting
        self.cost_ms = 0.0  # smoothed cost of a frame: update plus painting
        self._last = 0.0
        self._stopped = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.redraw)

    def schedule(self) -> None:
        """Redraw soon: after the interval since the last frame, unless a redraw is already due."""
        if self._stopped or self._timer.isActive():
            return
        since = (time.perf_counter() - self._last) * 1000.0
        interval = max(REDRAW_INTERVAL_MS, self.cost_ms / REDRAW_BUDGET)
        self._timer.start(int(max(0.0, interval - since)))

    def redraw(self) -> None:
        """Redraw now."""
        if self._stopped:
            return
        started = time.perf_counter()
        self._draw()
        self._last = time.perf_counter()
        self.last_ms = (self._last - started) * 1000.0
        # cost of a frame: this update plus the painting of the previous one
        cost = self.last_ms + PaintClock.take()
        self.cost_ms = 0.7 * self.cost_ms + 0.3 * cost
        self.count += 1

    def stop(self) -> None:
        """No more frames (the window is closing)."""
        self._stopped = True
        self._timer.stop()
