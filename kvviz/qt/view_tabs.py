"""The window's central tabs, one per mode (its view, title and tip), with the mode's corner widget (the local runs'
legend) in the tab row."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication, QTabWidget


class ViewTabs(QTabWidget):
    """The central tabs. The runs' legend sits in the tab row, in the width the tabs leave (a corner widget
    costs no height); it is fitted again whenever that width or the legend changes."""

    def __init__(self, modes, parent=None):
        super().__init__(parent)
        self.setDocumentMode(True)
        self._hidden: dict = {}  # whether each corner widget was hidden when it last left the corner
        for index, mode in enumerate(modes):
            self.addTab(mode.view, mode.title)
            self.setTabToolTip(index, mode.tip)

    def show_corner(self, widget) -> None:
        """`widget` (a mode's corner, or None) in the tab row's corner, shown as it was when it last left it (it hides
        itself while it has nothing to say; taken out, Qt hides it)."""
        before = self.cornerWidget(Qt.Corner.TopRightCorner)
        if before is widget:
            return
        if before is not None:
            self._hidden[before] = before.isHidden()
        self.setCornerWidget(widget, Qt.Corner.TopRightCorner)  # costs no height
        if widget is not None:
            widget.setHidden(self._hidden.get(widget, widget.isHidden()))

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
