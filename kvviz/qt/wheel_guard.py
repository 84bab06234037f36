"""The mouse wheel changes a combo box or spin box only when it has the keyboard focus.

Without this, scrolling the Controls dock changes whatever field passes under the pointer ("decoding"
flipped from greedy to sampling). One application-wide event filter covers every such field, including
the strategy options built as strategies are picked: a wheel turn over a field without focus scrolls
the enclosing scroll area instead, and the field stays as it was.
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QAbstractSpinBox, QComboBox, QWidget

GUARDED = (QComboBox, QAbstractSpinBox)


class WheelGuard(QObject):
    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt override
        if not isinstance(obj, GUARDED):  # most events, and the cheapest test: every event of the window passes here
            return False
        kind = event.type()
        if kind in (QEvent.Type.Polish, QEvent.Type.Show):
            # a click or Tab gives focus, a passing wheel does not (Qt gives a WheelFocus field the focus
            # before any event filter sees the wheel)
            if obj.focusPolicy() == Qt.FocusPolicy.WheelFocus:
                obj.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        elif kind == QEvent.Type.Wheel and not obj.hasFocus():
            area = _scroll_area(obj)
            if area is not None:
                bar = area.verticalScrollBar()
                if bar.isVisible():
                    QCoreApplication.sendEvent(bar, event)
            return True  # the field keeps its value
        return False


def _scroll_area(widget: QWidget) -> QAbstractScrollArea | None:
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QAbstractScrollArea) and not isinstance(parent, GUARDED):
            return parent
        parent = parent.parentWidget()
    return None


def install(app: QCoreApplication) -> WheelGuard:
    """Install the guard on the application once; returns it (kept as the application's child)."""
    existing = app.findChild(WheelGuard)
    if existing is not None:
        return existing
    guard = WheelGuard(app)
    app.installEventFilter(guard)
    return guard
