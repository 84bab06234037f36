"""The Runs dock keeps the height the user chose by dragging its separator.

A smaller window squeezes the Runs table; when the window grows again the table gets that height back
(or, never chosen, the default share of the window: kvviz.qt.window_settings.runs_height_for).
The chosen height is `window.runs_height` (None: never chosen), kept between sessions by window_settings.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, QTimer

from kvviz.qt.window_settings import runs_height_for


class RunsHeightKeeper(QObject):
    """An event filter on the main window: notes separator drags, restores the height after resizes."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self._separator_drag = False  # a mouse press landed on a dock separator
        window.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        kind = event.type()
        if kind == QEvent.Type.MouseButtonPress:
            self._separator_drag = self.window.isSeparator(event.position().toPoint())
        elif kind == QEvent.Type.MouseButtonRelease and self._separator_drag:
            self._separator_drag = False
            QTimer.singleShot(0, self._note_chosen)  # once the window has handled the release
        elif kind == QEvent.Type.Resize:
            QTimer.singleShot(0, self._keep)
        return False

    def _note_chosen(self) -> None:
        dock = self.window.runs_dock
        if dock.isVisible() and not dock.isFloating():
            self.window.runs_height = dock.height()

    def _keep(self) -> None:
        window, dock = self.window, self.window.runs_dock
        if window.closing or dock.isFloating() or not dock.isVisible():
            return
        height = runs_height_for(window)
        if abs(dock.height() - height) > 2:
            window.resizeDocks([dock], [height], Qt.Orientation.Vertical)
