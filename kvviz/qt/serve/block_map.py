"""The pool's block map: every block of the paged cache a cell, coloured by the request that holds it.

A block two or more requests share (a common prefix) carries their number; a complete block that no request holds
but a later prefix may take again (cached) is hatched; a free block is an empty cell. Each group of layers (full
attention, sliding attention) has its own rows. The cells fill the widget, so that 256 blocks and more stay
readable; hovering a cell names its block and holders.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QPainter
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from kvviz.files.serve_trace import Group, PoolState
from kvviz.qt import theme

GAP = 1.0  # px between cells
HEADER = 16  # px of a group's name above its cells
MIN_CELL_FOR_COUNT = 13  # px: a shared block's count is written in cells at least this wide
MAX_CELL = 48  # px: a small pool stays a map, not a few large tiles


class BlockMap(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMinimumSize(160, 120)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMouseTracking(True)
        self.palette_ = theme.PALETTES["dark"]
        self.groups: list[Group] = []
        self.state: PoolState | None = None
        self.colours: dict[str, str] = {}  # request id -> its colour
        self._cells: list[tuple[QRectF, str, int]] = []  # (cell, group, block) as last painted

    def show_pool(self, groups: list[Group], state: PoolState | None, colours: dict[str, str]) -> None:
        self.groups, self.state, self.colours = groups, state, colours
        self.update()

    def apply_palette(self, palette: theme.Palette) -> None:
        self.palette_ = palette
        self.update()

    def holders(self, group: str, block: int) -> list[str]:
        if self.state is None:
            return []
        return [rid for rid, blocks in self.state.tables.get(group, {}).items() if block in blocks]

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        painter.fillRect(self.rect(), QColor(self.palette_.background))
        self._cells = []
        if not self.groups:
            painter.setPen(QColor(self.palette_.muted))
            painter.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "Start serving, or open a serving run,\n"
                             "to see the pool's blocks")
            return
        height = self.height() / len(self.groups)
        for i, group in enumerate(self.groups):
            self._paint_group(painter, group, QRectF(0, i * height, self.width(), height))

    def _paint_group(self, painter: QPainter, group: Group, area: QRectF) -> None:
        palette = self.palette_
        painter.setPen(QColor(palette.foreground))
        held = self.state.held(group.name) if self.state is not None else 0
        named = f"{group.name.replace('_', ' ')}: " if len(self.groups) > 1 else ""
        text = f"{named}{held:,} of {group.blocks:,} blocks held, {group.page} tokens x {group.layers} layers each"
        line = area.adjusted(4, 0, -4, 0)
        painter.drawText(line, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop,
                         painter.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, int(line.width())))
        cells = area.adjusted(2, HEADER + 2, -2, -2)
        n = max(group.blocks, 1)
        columns = max(1, min(n, math.ceil(math.sqrt(n * cells.width() / max(cells.height(), 1.0)))))
        rows = math.ceil(n / columns)
        side = max(2.0, min(cells.width() / columns, cells.height() / rows, MAX_CELL))
        holders = self._holders_by_block(group.name)
        shared = self.state.shared.get(group.name, {}) if self.state is not None else {}
        cached = set(self.state.cached.get(group.name, [])) if self.state is not None else set()
        font = QFont(painter.font())
        font.setPixelSize(max(8, int(side * 0.55)))
        painter.setFont(font)
        for index in range(group.blocks):
            block = group.first_block + index
            row, column = divmod(index, columns)
            cell = QRectF(cells.left() + column * side, cells.top() + row * side, side - GAP, side - GAP)
            self._cells.append((cell, group.name, block))
            owners = holders.get(block, [])
            if owners:
                painter.fillRect(cell, QColor(self.colours.get(owners[0], palette.foreground)))
                count = int(shared.get(str(block), len(owners)))
                if count >= 2 and side >= MIN_CELL_FOR_COUNT:
                    painter.setPen(QColor("#000000"))
                    painter.drawText(cell, Qt.AlignmentFlag.AlignCenter, str(count))
            elif block in cached:
                painter.fillRect(cell, QColor(palette.unseen))
                painter.fillRect(cell, QBrush(QColor(palette.preallocated), Qt.BrushStyle.BDiagPattern))
            else:
                painter.fillRect(cell, QColor(palette.unseen))

    def _holders_by_block(self, group: str) -> dict[int, list[str]]:
        found: dict[int, list[str]] = {}
        if self.state is not None:
            for rid, blocks in self.state.tables.get(group, {}).items():
                for block in blocks:
                    found.setdefault(block, []).append(rid)
        return found

    def mouseMoveEvent(self, event) -> None:  # noqa: N802 - Qt override
        at = event.position()
        for cell, group, block in self._cells:
            if cell.contains(at):
                owners = self.holders(group, block)
                cached = self.state is not None and block in self.state.cached.get(group, [])
                what = (f"held by {', '.join(owners)}" if owners else
                        "cached: complete, held by no request, kept for a later prefix" if cached else "free")
                QToolTip.showText(event.globalPosition().toPoint(), f"block {block} ({group.replace('_', ' ')}): "
                                  f"{what}", self)
                return
        QToolTip.hideText()
