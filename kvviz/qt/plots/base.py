"""Shared frame of every plot: a title row (title left, hover readout right) above a PlotWidget.

Plot items are created once per run and updated with `setData`; `redraw(runs, primary)` only
touches the curves of runs whose data grew since the last call.
"""

from __future__ import annotations

import time

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from kvviz.qt import theme
from kvviz.qt.series import RunSeries


class IntegerAxis(pg.AxisItem):
    """An axis of whole things (layers): ticks only at integers, never 0.5."""

    def tickSpacing(self, minVal, maxVal, size):  # noqa: N802,N803 - pyqtgraph override
        levels = super().tickSpacing(minVal, maxVal, size)
        return [(max(1.0, round(spacing)), offset) for spacing, offset in levels[:1]]


HINT_TEXT = "Drag to pan, mouse wheel to zoom, double-click to fit the data again."


class PaintClock:
    """Milliseconds spent painting plots since the last `take()` (the window budgets redraws by it)."""

    spent_ms = 0.0

    @classmethod
    def take(cls) -> float:
        spent, cls.spent_ms = cls.spent_ms, 0.0
        return spent


class TimedPlotWidget(pg.PlotWidget):
    def paintEvent(self, event):  # noqa: N802 - Qt override
        started = time.perf_counter()
        super().paintEvent(event)
        PaintClock.spent_ms += (time.perf_counter() - started) * 1000.0


class PlotPanel(QWidget):
    title = ""
    integer_axes: tuple[str, ...] = ()
    crosshair_line = False  # a vertical line follows the mouse over the plot

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("plotPanel")
        self.palette_ = theme.PALETTES["dark"]
        self.title_label = QLabel(self.title)
        self.title_label.setObjectName("plotTitle")
        self.readout = QLabel("")
        self.readout.setObjectName("plotReadout")
        self.readout.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.readout.setTextFormat(Qt.TextFormat.RichText)
        self.head = QHBoxLayout()  # the title row; a subclass may add a widget to it (a unit chooser)
        self.head.setContentsMargins(6, 2, 6, 0)
        self.head.addWidget(self.title_label, 0)
        self.head.addWidget(self.readout, 1)
        axes = {name: IntegerAxis(name) for name in self.integer_axes}
        self.widget = TimedPlotWidget(axisItems=axes)
        self.widget.setMinimumHeight(150)
        self.plot: pg.PlotItem = self.widget.getPlotItem()
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        for name in ("left", "bottom"):
            self.plot.getAxis(name).enableAutoSIPrefix(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addLayout(self.head)
        layout.addWidget(self.widget, 1)
        self._mouse = pg.SignalProxy(self.plot.scene().sigMouseMoved, rateLimit=30, slot=self._on_mouse)
        self.plot.scene().sigMouseClicked.connect(self._on_click)
        self.title_label.setToolTip(HINT_TEXT)
        self.widget.viewport().setToolTip("")
        # long readouts must never widen the window: they may be cut, the plot keeps its size
        self.readout.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.title_label.setMinimumWidth(1)  # its full width when there is room, cut when not
        self.crosshair = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#888888", width=1))
        self.crosshair.setVisible(False)
        if self.crosshair_line:
            self.plot.addItem(self.crosshair, ignoreBounds=True)
        self._runs: list[RunSeries] = []
        self._primary: RunSeries | None = None
        self._legend_item: pg.LegendItem | None = None  # not "legend": CacheMapPlot has a QLabel by that name

    def add_legend(self, offset: tuple[float, float] = (60, 6), **options) -> pg.LegendItem:
        """The plot's legend (named items enter it), styled by `apply_palette` for the current theme."""
        options.setdefault("labelTextSize", "9pt")
        self._legend_item = self.plot.addLegend(offset=offset, **options)
        self._style_legend()
        return self._legend_item

    def _style_legend(self) -> None:
        legend = self._legend_item
        if legend is None:
            return
        palette = self.palette_
        legend.setLabelTextColor(palette.foreground)
        background = pg.mkColor(palette.background)
        background.setAlpha(200)
        legend.setBrush(pg.mkBrush(background))
        legend.setPen(pg.mkPen(palette.muted))

    def set_labels(self, left: str, bottom: str) -> None:
        self.plot.setLabel("left", left)
        self.plot.setLabel("bottom", bottom)

    def apply_palette(self, palette: theme.Palette) -> None:
        self.palette_ = palette
        self.widget.setBackground(palette.background)
        theme.style_plot(self.plot, palette)
        self._style_legend()

    def redraw(self, runs: list[RunSeries], primary: RunSeries | None) -> None:
        self._runs = runs
        self._primary = primary

    def _on_mouse(self, event) -> None:
        pos = event[0]
        inside = self.plot.sceneBoundingRect().contains(pos)
        self.crosshair.setVisible(inside and self.crosshair_line)
        if not inside:
            return
        point = self.plot.vb.mapSceneToView(pos)
        self.crosshair.setPos(point.x())
        self.readout.setText(self.hover_text(point.x(), point.y()))

    def hover_text(self, x: float, y: float) -> str:
        return ""

    def _on_click(self, event) -> None:
        if event.double():
            self.reset_view()

    def reset_view(self) -> None:
        """Fit the data again after a manual zoom or pan."""
        self.plot.enableAutoRange()

    @staticmethod
    def swatch(colour: str, text: str) -> str:
        text = text.replace(" ", "&nbsp;")
        return f'<span style="color:{colour}">&#9632;</span>&nbsp;{text}'
