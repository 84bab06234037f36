"""The redraw scheduler: a scheduled frame is drawn a part per turn of the event loop, a redraw at once."""

from __future__ import annotations

from PySide6.QtCore import QTimer

from kvviz.qt.redraw import PaintClock, RedrawScheduler


class Frames:
    """Frames of three parts "a", "b", "c" that log when they ran ("1a": frame 1's part a); `during` is called
    after the first frame's first part (something happening while that frame is half drawn)."""

    def __init__(self, during=None):
        self.log: list[str] = []
        self.started = 0
        self.during = during

    def __call__(self):
        self.started += 1
        frame = self.started
        parts = [lambda name=name: self.log.append(f"{frame}{name}") for name in "abc"]
        if frame == 1 and self.during is not None:
            parts.insert(1, self.during)
        return parts


def test_a_scheduled_frame_gives_the_event_loop_a_turn_between_its_parts(qtbot):
    frames = Frames()
    scheduler = RedrawScheduler(frames)
    ticks: list[int] = []
    ticker = QTimer()
    ticker.setInterval(0)
    ticker.timeout.connect(lambda: ticks.append(len(frames.log)))  # how many parts had run at each turn
    ticker.start()
    scheduler.schedule()
    qtbot.waitUntil(lambda: scheduler.count == 1, timeout=5000)
    ticker.stop()
    assert frames.log == ["1a", "1b", "1c"]
    assert {1, 2} <= set(ticks)  # the loop turned after the first part and after the second


def test_a_change_during_a_frame_draws_another_frame_after_it(qtbot):
    frames = Frames(during=lambda: scheduler.schedule())  # records arrived while the frame is half drawn
    scheduler = RedrawScheduler(frames)
    scheduler.schedule()
    qtbot.waitUntil(lambda: scheduler.count == 2, timeout=5000)
    assert frames.log == ["1a", "1b", "1c", "2a", "2b", "2c"]


def test_redraw_draws_every_part_now_in_place_of_the_frame_in_progress(qtbot):
    frames = Frames(during=lambda: scheduler.redraw())  # e.g. a run ended while the frame is half drawn
    scheduler = RedrawScheduler(frames)
    scheduler.schedule()
    qtbot.waitUntil(lambda: scheduler.count == 1, timeout=5000)
    qtbot.wait(100)
    assert frames.log == ["1a", "2a", "2b", "2c"]  # the replaced frame's parts never run
    scheduler.stop()
    scheduler.schedule()
    qtbot.wait(100)
    assert scheduler.count == 1


def test_redraw_then_answers_once_a_frame_begun_after_the_request_is_drawn_in_parts(qtbot):
    done: list[list[str]] = []
    frames = Frames()
    scheduler = RedrawScheduler(frames)
    scheduler.redraw_then(lambda: done.append(list(frames.log)))
    assert done == []  # nothing is drawn inside the request: the frame gets turns of its own
    qtbot.waitUntil(lambda: bool(done), timeout=5000)
    assert done == [["1a", "1b", "1c"]]

    # asked while a frame is half drawn (a run ended meanwhile): that frame may lack the last records
    frames = Frames(during=lambda: scheduler.redraw_then(lambda: done.append(list(frames.log))))
    scheduler = RedrawScheduler(frames)
    scheduler.schedule()
    qtbot.waitUntil(lambda: len(done) == 2, timeout=5000)
    assert done[1] == ["1a", "1b", "1c", "2a", "2b", "2c"]


def test_the_window_counts_all_its_painting_not_only_the_plots(window, qtbot):
    """The redraw budget's painting: a label's repaint (no plot) is counted, from the window's backing-store sync."""
    window.show()
    qtbot.waitExposed(window)
    qtbot.wait(50)
    PaintClock.take()
    assert PaintClock.take() == 0.0
    window.statusBar().showMessage("a message that repaints the status bar")
    qtbot.waitUntil(lambda: PaintClock.spent_ms > 0.0, timeout=2000)
