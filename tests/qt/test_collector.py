"""Once a window's worker thread exists, Python's garbage is collected on the GUI thread only (kvviz.qt.collector):
a collection on the worker's thread destroyed the GUI's Qt objects there, which can deadlock on Qt's locks."""

import gc
import threading

from PySide6.QtCore import QTimer

from tests.qt.conftest import load, run


class Cycle:
    """Garbage only the cycle collector frees, holding a live Qt object that Python owns; says where it was freed."""

    def __init__(self, freed_on: list):
        self.me, self.timer, self.freed_on = self, QTimer(), freed_on

    def __del__(self):
        self.freed_on.append(threading.current_thread().name)


def test_a_cycle_holding_a_live_qt_object_is_freed_on_the_gui_thread_not_the_workers(qtbot, window):
    freed_on = []
    Cycle(freed_on)
    load(qtbot, window)  # the worker loads a model and runs: both allocate past every threshold of the collector
    run(qtbot, window, tokens=40)
    qtbot.waitUntil(lambda: bool(freed_on), timeout=10000)
    assert freed_on == [threading.main_thread().name] and not gc.isenabled()

    freed_on.clear()  # and with no load or run to settle after: the collector's timer, by Python's thresholds
    Cycle(freed_on)
    young = [[] for _ in range(2 * gc.get_threshold()[0])]
    qtbot.waitUntil(lambda: bool(freed_on), timeout=5000)
    assert freed_on == [threading.main_thread().name] and young
