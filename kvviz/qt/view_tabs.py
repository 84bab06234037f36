"""The window's central tabs (Local run, Evaluate, vLLM server), with the runs' legend in the tab row."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication, QTabWidget


class ViewTabs(QTabWidget):
    """The central tabs. The runs' legend sits in the tab row, in the width the tabs leave (a corner widget
    costs no height); it is fitted again whenever that width or the legend changes."""

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self.fit_corner()

    def fit_corner(self) -> None:
        corner = self.cornerWidget(Qt.Corner.TopRightCorner)
        if corner is None or corner.isHidden():
            return
        room = max(120, self.width() - self.tabBar().sizeHint().width() - 16)
        if corner.maximumWidth() != room or corner.width() != min(room, corner.sizeHint().width()):
            corner.setMaximumWidth(room)
            QApplication.sendEvent(self, QEvent(QEvent.Type.LayoutRequest))  # QTabWidget lays its row out again
