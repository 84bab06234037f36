"""Python's cyclic garbage collection, on the GUI thread only.

Python collects reference cycles on whichever thread happens to allocate past a threshold, and in the window that
is most often the worker's: it allocates at every step. A cycle of the GUI's (a plot item taken off its plot, the
widgets of a closed window) then had its Qt objects destroyed on the worker's thread while the GUI thread painted
or destroyed others: live QTimers stopped from another thread, and deadlocks on Qt's locks (one seen in the tests,
see kvviz.qt.jobs; a chat test that hung 15 minutes in CI, stop 46, most likely another). A probe of the Qt tests
found 9,000 Qt objects, some still alive, collected on worker threads. So once a worker thread exists the process
collects here: automatic collection is off, and a timer on the GUI thread collects each generation when Python's
own thresholds say it would have.

What lives on after a model load or a run is frozen (`settle`), so that a full collection walks only what is new:
the model, torch and transformers are some 500,000 objects, and walking them took 350 ms.
"""

from __future__ import annotations

import gc
import time

from PySide6.QtCore import QCoreApplication, QObject, QTimer, Slot

INTERVAL_MS = 100  # a tick collects what a decode step or a redraw left: a millisecond or two while a run streams
# Python itself walks everything not frozen (a sweep's records: tens of milliseconds) only once a quarter as much is
# new as was there, a count it does not show; here at most once a minute instead
FULL_EVERY_S = 60.0


class GuiCollector(QObject):
    def __init__(self, app: QCoreApplication):
        super().__init__(app)
        self.thresholds = gc.get_threshold()
        self.last_full = time.monotonic()
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.collect_due)
        self.timer.start(INTERVAL_MS)
        gc.disable()

    @Slot()
    def collect_due(self) -> None:
        """Collect the generations Python would have collected by now (its counts against its thresholds), the oldest
        at most every FULL_EVERY_S."""
        young, middle, old = gc.get_count()
        first, second, third = self.thresholds
        if young <= first:
            return
        generation = 0 if middle <= second else 1
        if generation and old > third and time.monotonic() - self.last_full >= FULL_EVERY_S:
            generation, self.last_full = 2, time.monotonic()
        gc.collect(generation)

    @Slot(int)
    def settle(self, generation: int) -> None:
        """Collect up to `generation` (2 after a model load: the model it replaced, frozen with the rest, goes too;
        1 after a run: the run's own garbage), then freeze what is left."""
        if generation == 2:
            gc.unfreeze()
            self.last_full = time.monotonic()
        gc.collect(generation)
        gc.freeze()


def install() -> GuiCollector:
    """The process's collector (made on the first call, on the GUI thread, and kept with the application)."""
    app = QCoreApplication.instance()
    collector = app.findChild(GuiCollector)
    return collector if collector is not None else GuiCollector(app)
