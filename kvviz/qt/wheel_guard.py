"""The mouse wheel changes a combo box or spin box only when it has the keyboard focus.

Without this, scrolling the Controls dock changes whatever field passes under the pointer ("decoding"
flipped from greedy to sampling). `guard` puts one event filter on each such field of a widget: a wheel
turn over a field without focus scrolls the enclosing scroll area instead, and the field stays as it was.
The window guards itself once its parts are built, and a part that builds fields later (the strategy
options, built as strategies are picked; a dialog) guards what it built. The filter sits on the fields
alone: installed on the application, it took every event of every widget of the window into Python
(about 1.8 ms a frame while a run is drawn, its GIL taken from the decoding thread each time).
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QAbstractSpinBox, QComboBox, QWidget

GUARDED = (QComboBox, QAbstractSpinBox)


class WheelGuard(QObject):
    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt override
        kind = event.type()
        if kind in (QEvent.Type.Polish, QEvent.Type.Show):  # a style's polish may give the focus policy back
            _no_wheel_focus(obj)
        elif kind == QEvent.Type.Wheel and not obj.hasFocus():
            area = _scroll_area(obj)
            if area is not None:
                bar = area.verticalScrollBar()
                if bar.isVisible():
                    QCoreApplication.sendEvent(bar, event)
            return True  # the field keeps its value
        return False


def guard(root: QWidget) -> None:
    """Guard every combo box and spin box of `root` (itself included); guarding a field twice changes nothing."""
    app = QCoreApplication.instance()
    wheel_guard = app.findChild(WheelGuard, options=Qt.FindChildOption.FindDirectChildrenOnly) or WheelGuard(app)
    fields = [root] if isinstance(root, GUARDED) else []
    for kind in GUARDED:
        fields += root.findChildren(kind)
    for field in fields:
        _no_wheel_focus(field)
        field.installEventFilter(wheel_guard)  # installed again, it is moved first, not doubled (Qt)


def _no_wheel_focus(field: QWidget) -> None:
    # a click or Tab gives focus, a passing wheel does not (Qt gives a WheelFocus field the focus before any event
    # filter sees the wheel)
    if field.focusPolicy() == Qt.FocusPolicy.WheelFocus:
        field.setFocusPolicy(Qt.FocusPolicy.StrongFocus)


def _scroll_area(widget: QWidget) -> QAbstractScrollArea | None:
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QAbstractScrollArea) and not isinstance(parent, GUARDED):
            return parent
        parent = parent.parentWidget()
    return None
