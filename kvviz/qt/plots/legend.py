"""A plot's legend as a row above the plot: it never covers the data, and wraps when the plot is narrow.

Each entry is a small drawn sample (a line in its pen's colour, width and dash style, a filled box, or a
marker) and its text. The bar hides itself while it has no entries, so an empty plot shows no empty
legend. Text that does not fit in the bar's width is cut with "…" (the whole text is the entry's tooltip).
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QLinearGradient, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

SAMPLE_WIDTH = 22  # px of the drawn sample
GAP = 5  # between sample and text
SPACING = 14  # between entries
ROW_PAD = 2  # above and below each row
MAX_ROWS = 2  # a narrow plot keeps its height: entries past the second row are left out, "…" says so


@dataclass(frozen=True)
class Entry:
    text: str
    colour: str
    kind: str = "line"  # "line", "box", "marker", "ramp" (a box shading from colour to to_colour), or "text"
    # (no sample: a heading for the entries after it)
    style: Qt.PenStyle = Qt.PenStyle.SolidLine
    width: float = 2.0
    marker: str = "o"  # for kind "marker": "o" (dot) or "star"
    tooltip: str = ""
    to_colour: str = ""  # for kind "ramp": the colour at its right end


class LegendBar(QWidget):
    def __init__(self, parent: QWidget | None = None, max_rows: int = MAX_ROWS):
        super().__init__(parent)
        self.setObjectName("legendBar")
        self.max_rows = max_rows
        self._entries: list[Entry] = []
        self._foreground = QColor("#d7dae0")
        self._boxes: list[tuple[QRectF, Entry]] = []  # where each entry was laid out, for tooltips
        policy = QSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        self.setMouseTracking(True)
        self.hide()

    # -- contents -----------------------------------------------------------------------------------

    def set_entries(self, entries: list[Entry]) -> None:
        """Show these entries (nothing changes when they are the ones shown); hidden while there are none."""
        if entries == self._entries:
            return
        self._entries = list(entries)
        self.setVisible(bool(entries))
        self.updateGeometry()
        self.update()

    def entries(self) -> list[Entry]:
        return list(self._entries)

    def texts(self) -> list[str]:
        return [e.text for e in self._entries]

    def set_foreground(self, colour: str) -> None:
        self._foreground = QColor(colour)
        self.update()

    # -- layout ---------------------------------------------------------------------------------------

    def _row_height(self) -> int:
        return QFontMetrics(self.font()).height() + 2 * ROW_PAD

    def _layout(self, width: int) -> list[tuple[QRectF, Entry, str]]:
        """(rectangle, entry, text as drawn) for each entry, wrapped into at most `max_rows` rows of `width`;
        when some do not fit, a last "…" entry names them in its tooltip."""
        metrics = QFontMetrics(self.font())
        row_height = self._row_height()
        x, y, placed = 6.0, 0.0, []
        usable = max(width - 12, SAMPLE_WIDTH + GAP + 20)
        more = metrics.horizontalAdvance("…") + SPACING
        for i, entry in enumerate(self._entries):
            text = entry.text
            sample = _sample_width(entry)
            needed = sample + metrics.horizontalAdvance(text)
            if needed > usable:  # alone on a row and still too wide: cut the text
                text = metrics.elidedText(text, Qt.TextElideMode.ElideRight, usable - sample)
                needed = sample + metrics.horizontalAdvance(text)
            last_row = y >= (self.max_rows - 1) * row_height
            reserve = more if last_row and i < len(self._entries) - 1 else 0  # room for "…" if more follow
            if x > 6.0 and x + needed + reserve > usable + 6:
                if last_row:
                    left_out = self._entries[i:]
                    tooltip = "also: " + ", ".join(e.text for e in left_out)
                    ellipsis = Entry("…", "#000000", kind="text", tooltip=tooltip)
                    placed.append((QRectF(x, y, more, row_height), ellipsis, "…"))
                    break
                x, y = 6.0, y + row_height
            placed.append((QRectF(x, y, needed, row_height), entry, text))
            x += needed + SPACING
        return placed

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt override
        placed = self._layout(width)
        return int(placed[-1][0].bottom()) if placed else 0

    def natural_width(self) -> int:
        """The width of all entries in one row."""
        metrics = QFontMetrics(self.font())
        widths = [_sample_width(e) + metrics.horizontalAdvance(e.text) for e in self._entries]
        return int(sum(widths) + SPACING * max(len(widths) - 1, 0) + 12)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        if self.max_rows == 1:  # in a row of its own kind (a tab bar's corner): as wide as its entries allow
            width = min(self.natural_width(), self.maximumWidth())
            return QSize(width, self._row_height() if self._entries else 0)
        width = max(self.width(), 200)
        return QSize(width, self.heightForWidth(width))

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(40, self.heightForWidth(max(self.width(), 40)) if self._entries else 0)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        if self.heightForWidth(self.width()) != self.height():
            self.updateGeometry()  # more or fewer rows at this width

    # -- drawing --------------------------------------------------------------------------------------

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        self._boxes = []
        for rect, entry, text in self._layout(self.width()):
            self._boxes.append((rect, entry))
            width = _sample_width(entry)
            painter.setPen(self._foreground)
            if width:
                draw_sample(painter, QRectF(rect.left(), rect.top(), SAMPLE_WIDTH, rect.height()), entry)
            painter.setPen(self._foreground)
            text_rect = QRectF(rect.left() + width, rect.top(), rect.width() - width, rect.height())
            painter.drawText(text_rect, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, text)
        painter.end()

    def event(self, event) -> bool:
        if event.type() == event.Type.ToolTip:
            for rect, entry in self._boxes:
                if rect.contains(QPointF(event.pos())):
                    QToolTip.showText(event.globalPos(), entry.tooltip or entry.text, self)
                    return True
            QToolTip.hideText()
            return True
        return super().event(event)


def _sample_width(entry: Entry) -> int:
    """Room taken before the entry's text."""
    if entry.kind == "text":
        return 0
    if entry.kind == "marker":
        return 12 + GAP
    return SAMPLE_WIDTH + GAP


def draw_sample(painter: QPainter, rect: QRectF, entry: Entry) -> None:
    """The entry's sample, centred in rect."""
    colour = QColor(entry.colour)
    middle = rect.center().y()
    if entry.kind == "ramp":
        side = min(10.0, rect.height() - 4)
        box = QRectF(rect.left() + 1, middle - side / 2, rect.width() - 2, side)
        gradient = QLinearGradient(box.topLeft(), box.topRight())
        gradient.setColorAt(0.0, colour)
        gradient.setColorAt(1.0, QColor(entry.to_colour))
        painter.fillRect(box, gradient)
    elif entry.kind == "box":
        side = min(10.0, rect.height() - 4)
        box = QRectF(rect.center().x() - side / 2, middle - side / 2, side, side)
        painter.fillRect(box, colour)
        edge = QColor(painter.pen().color())  # a faint edge: a box as pale as the background still shows
        edge.setAlpha(90)
        painter.setPen(QPen(edge, 1))
        painter.drawRect(box)
    elif entry.kind == "marker":
        centre = QPointF(rect.left() + 6, middle)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(colour)
        if entry.marker == "star":
            painter.drawPath(_star(centre, 6.0))
        else:
            painter.drawEllipse(centre, 3.5, 3.5)
        painter.setBrush(Qt.BrushStyle.NoBrush)
    else:
        pen = QPen(colour, entry.width)
        pen.setStyle(entry.style)
        pen.setCapStyle(Qt.PenCapStyle.FlatCap)
        painter.setPen(pen)
        painter.drawLine(QPointF(rect.left() + 1, middle), QPointF(rect.right() - 1, middle))


def _star(centre: QPointF, radius: float) -> QPainterPath:
    import math

    path = QPainterPath()
    for i in range(10):
        r = radius if i % 2 == 0 else radius * 0.45
        angle = math.pi / 2 + i * math.pi / 5
        point = QPointF(centre.x() + r * math.cos(angle), centre.y() - r * math.sin(angle))
        path.moveTo(point) if i == 0 else path.lineTo(point)
    path.closeSubpath()
    return path
