"""A plot that says why it is empty: a centred note over its data area, in the theme's muted colour."""

from __future__ import annotations

import html

import pyqtgraph as pg

from kvviz.qt.plots.base import PlotPanel


class NotePlot(PlotPanel):
    """A plot with a centred note over its data area, for when there is nothing to draw and a reason why."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.note = pg.TextItem("", anchor=(0.5, 0.5))
        self.note.setParentItem(self.plot.vb)
        self.note.setTextWidth(360)
        self.plot.vb.sigResized.connect(self._place_note)
        self._note = ""

    def set_note(self, text: str) -> None:
        if text != self._note:
            self._note = text
            self.note.setHtml(f'<div style="color:{self.palette_.muted}; text-align:center">{html.escape(text)}</div>'
                              if text else "")
            self._place_note()

    def note_text(self) -> str:
        """The note shown ("" when none is)."""
        return self._note

    def _place_note(self, *_):
        rect = self.plot.vb.boundingRect()
        self.note.setTextWidth(max(120.0, min(420.0, rect.width() - 20)))
        self.note.setPos(rect.width() / 2, rect.height() / 2)

    def apply_palette(self, palette):
        super().apply_palette(palette)
        note, self._note = self._note, ""
        self.set_note(note)
