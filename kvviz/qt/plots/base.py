"""Shared frame of every plot: a title row, a legend row and a PlotWidget, with a hover readout over it.

- The title keeps to one line at any width (kvviz.qt.plots.titles), and may add a detail after the title (the
  cache map names its run), cut first.
- The legend sits in a row of its own above the plot (kvviz.qt.plots.legend), so it never covers data.
- Axis labels keep their unit (kvviz.qt.plots.titles.unit_forms).
- The hover readout is drawn over the plot in the corner away from the mouse, only while the mouse
  is over the plot; it and the crosshair clear when the mouse leaves and when the runs shown change.
- `export_image(width)` and `export_svg(path, width)` draw a fresh copy of the panel (title, axes,
  legend and data) at a fixed layout size, scaled to the width asked for.

Plot items are created once per run and updated with `setData`; `redraw(runs, primary)` only
touches the curves of runs whose data grew since the last call.
"""

from __future__ import annotations

import html
import re
from contextlib import contextmanager
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QPoint, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtWidgets import QApplication, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from kvviz.qt import theme
from kvviz.qt.plots.legend import Entry, LegendBar
from kvviz.qt.plots.titles import TitleLabel, unit_forms
from kvviz.qt.series import RunSeries

PLOT_MIN_HEIGHT = 64  # px: the plot area never gets lower than this
LEGEND_AND_PLOT_MIN_HEIGHT = 110  # px: the legend's rows come out of this, so a legend never raises the minimum
EXPORT_LAYOUT_WIDTH = 960  # px: exports are laid out at this width and scaled to the width asked for
DEFAULT_EXPORT_WIDTH = 1920


def marker_line(colour: str, style: Qt.PenStyle, label: str, at: float, x: float | None = None) -> pg.InfiniteLine:
    """A thin vertical line marking an event (a switch, a restart, a pause, the prefill) at `x`, in `colour` and
    `style`, its label beside it at `at` of the plot's height; add it with ignoreBounds so it never widens the range."""
    return pg.InfiniteLine(
        pos=x,
        angle=90,
        movable=False,
        pen=pg.mkPen(colour, width=1, style=style),
        label=label,
        labelOpts={"position": at, "color": colour, "anchors": [(0, 0.5), (0, 0.5)]},
    )


class IntegerAxis(pg.AxisItem):
    """An axis of whole things (layers): ticks only at integers, never 0.5."""

    def tickSpacing(self, minVal, maxVal, size):  # noqa: N802,N803 - pyqtgraph override
        levels = super().tickSpacing(minVal, maxVal, size)
        return [(max(1.0, round(spacing)), offset) for spacing, offset in levels[:1]]


class PlotPanel(QWidget):
    title = ""
    integer_axes: tuple[str, ...] = ()
    crosshair_line = False  # a vertical line follows the mouse over the plot
    legend_runs = "shown"  # the runs the legend names: "shown", "primary" (a plot of one run) or "none"
    export_aspect = 9 / 16  # height / width of an exported image

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("plotPanel")
        self.palette_ = theme.PALETTES["dark"]
        # False where the window names the runs once above several plots (kvviz.qt.local.view)
        self.show_run_legend = True
        self.title_label = TitleLabel(self.title)
        self.head = QHBoxLayout()  # the title row; a subclass may add a widget to it (a unit chooser)
        self.head.setContentsMargins(6, 2, 6, 0)
        self.head.addWidget(self.title_label, 1)
        self.legend_bar = LegendBar()
        axes = {name: IntegerAxis(name) for name in self.integer_axes}
        # no context menus: built at the start and never shown, pyqtgraph's menus took a fifth of the window's start
        self.widget = pg.PlotWidget(axisItems=axes, enableMenu=False)
        self.widget.setMinimumHeight(LEGEND_AND_PLOT_MIN_HEIGHT)
        # the plot paints all its area (an opaque background, `apply_palette`): the widgets under it are not painted
        # again at each of its repaints (the splitter, the tab pages and the main window were, several times a frame)
        self.widget.viewport().setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)
        self.plot: pg.PlotItem = self.widget.getPlotItem()
        self.plot.hideButtons()
        for name in ("left", "bottom"):
            self.plot.getAxis(name).enableAutoSIPrefix(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addLayout(self.head)
        layout.addWidget(self.legend_bar)
        layout.addWidget(self.widget, 1)
        # the readout floats over the plot: long readouts never move or widen anything
        self.readout = QLabel(self.widget)
        self.readout.setObjectName("plotReadout")
        self.readout.setTextFormat(Qt.TextFormat.RichText)
        self.readout.setWordWrap(True)
        self.readout.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.readout.hide()
        self._mouse_inside = False
        self._mouse = pg.SignalProxy(self.plot.scene().sigMouseMoved, rateLimit=30, slot=self._on_mouse)
        self.plot.scene().sigMouseClicked.connect(self._on_click)
        self.widget.viewport().installEventFilter(self)
        self.widget.viewport().setToolTip("")
        self.crosshair = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#888888", width=1))
        self.crosshair.setVisible(False)
        if self.crosshair_line:
            self.plot.addItem(self.crosshair, ignoreBounds=True)
        self._axis_forms: dict[str, list[str]] = {}
        self._axis_shown: dict[str, str] = {}
        self.plot.vb.sigResized.connect(self._fit_axis_labels)
        self._runs: list[RunSeries] = []
        self._primary: RunSeries | None = None
        self._shown_ids: tuple[int, ...] = ()

    # -- title, labels and legend ---------------------------------------------------------------------

    def set_title_detail(self, detail: str) -> None:
        """Words after the title, cut first when room is short (the cache map's run)."""
        self.title_label.set_title(detail=detail)

    def set_labels(self, left: str, bottom: str) -> None:
        self.set_axis_label("left", left)
        self.set_axis_label("bottom", bottom)

    def set_axis_label(self, name: str, label: str) -> None:
        """An axis label with its unit; a shorter form that keeps the unit is shown where it does not fit."""
        self._axis_forms[name] = unit_forms(label)
        self._axis_shown.pop(name, None)
        self.plot.setLabel(name, label)
        self._fit_axis_labels()

    def axis_label(self, name: str) -> str:
        """The label shown on an axis now."""
        return self._axis_shown.get(name, self.plot.getAxis(name).labelText)

    def _fit_axis_labels(self, *_) -> None:
        vb = self.plot.vb.boundingRect()
        for name, forms in self._axis_forms.items():
            room = vb.height() if name in ("left", "right") else vb.width()
            if room <= 1:
                continue
            axis = self.plot.getAxis(name)
            for text in forms:  # the longest that fits, as drawn (the label's own margins included)
                if self._axis_shown.get(name) != text:
                    axis.setLabel(text)
                    axis.resizeEvent()  # pyqtgraph centres a label only on resize: a longer one would be cut
                    self._axis_shown[name] = text
                if axis.label.boundingRect().width() <= room - 12:  # room for pyqtgraph's nudge and rounding
                    break

    def legend_entries(self) -> list[Entry]:
        """This plot's own legend entries (what its line styles and markers mean); the runs come first."""
        return []

    def run_entries(self, runs: list[RunSeries]) -> list[Entry]:
        return [
            Entry(series.short_label(), theme.run_colour(series.run_id), width=3.0, tooltip=series.label())
            for series in runs
        ]

    def has_data(self) -> bool:
        return bool(self._runs)

    def update_legend(self) -> None:
        """The legend row: the runs (unless named elsewhere) and this plot's entries; none on an empty plot."""
        if not self.has_data():
            self.legend_bar.set_entries([])
            self._reserve_legend_room()
            return
        named = {"shown": self._runs, "primary": [self._primary] if self._primary else [], "none": []}
        runs = self.run_entries(named[self.legend_runs]) if self.show_run_legend else []
        self.legend_bar.set_entries(runs + self.legend_entries())
        self._reserve_legend_room()

    def _reserve_legend_room(self) -> None:
        """The plot's minimum height gives way to the legend's rows: the panel's minimum stays the same whether
        a legend is shown or not (the window never grows when runs appear)."""
        legend = self.legend_bar.heightForWidth(self.width()) if self.legend_bar.isVisibleTo(self) else 0
        minimum = max(PLOT_MIN_HEIGHT, LEGEND_AND_PLOT_MIN_HEIGHT - legend)
        if self.widget.minimumHeight() != minimum:
            self.widget.setMinimumHeight(minimum)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._reserve_legend_room()  # the legend's rows change with the width

    def apply_palette(self, palette: theme.Palette) -> None:
        self.palette_ = palette
        self.widget.setBackground(palette.background)
        theme.style_plot(self.plot, palette)
        self.legend_bar.set_foreground(palette.foreground)
        self.update_legend()

    # -- drawing --------------------------------------------------------------------------------------

    def redraw(self, runs: list[RunSeries], primary: RunSeries | None) -> None:
        self._runs = runs
        self._primary = primary
        shown = tuple(r.run_id for r in runs)
        if shown != self._shown_ids:  # another run started or the selection changed: old hover is stale
            self._shown_ids = shown
            self.clear_hover()
        self.update_legend()

    def draw_frame(self, runs: list[RunSeries], primary: RunSeries | None) -> None:
        """`redraw`, then the view's new range and transform applied now, in the frame's part. Left to
        pyqtgraph, they are applied as the plot starts to paint, which moves the axes and items again and
        paints the plot a second time: two paints per plot per live frame, measured."""
        self.redraw(runs, primary)
        self.plot.vb.prepareForPaint()

    # -- hover ----------------------------------------------------------------------------------------

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt override
        kind = event.type()
        if kind in (QEvent.Type.Enter, QEvent.Type.MouseMove):
            self._mouse_inside = True
        elif kind == QEvent.Type.Leave:
            self._mouse_inside = False
            self.clear_hover()
        return False

    def hideEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.clear_hover()
        super().hideEvent(event)

    def clear_hover(self) -> None:
        """No crosshair, no readout (the mouse left, or what the plot shows changed)."""
        self.crosshair.setVisible(False)
        self.readout.clear()
        self.readout.hide()

    def readout_text(self) -> str:
        """The readout on screen, without markup ("" when none is)."""
        if self.readout.isHidden():
            return ""
        return re.sub(r"<[^>]+>", "", html.unescape(self.readout.text().replace("&nbsp;", " "))).strip()

    def _on_mouse(self, event) -> None:
        if self._mouse_inside:  # the rate-limited proxy may deliver a move after the mouse left
            self.hover_at(event[0])

    def hover_at(self, scene_pos) -> None:
        """Crosshair and readout for the mouse at a scene position (clears them outside the data area)."""
        if not self.plot.vb.sceneBoundingRect().contains(scene_pos):
            self.clear_hover()
            return
        point = self.plot.vb.mapSceneToView(scene_pos)
        self.crosshair.setPos(point.x())
        self.crosshair.setVisible(self.crosshair_line)
        self._show_readout(self.hover_text(point.x(), point.y()), scene_pos.x())

    def _show_readout(self, text: str, mouse_x: float) -> None:
        if not text:
            self.readout.clear()
            self.readout.hide()
            return
        area = self.widget.mapFromScene(self.plot.vb.sceneBoundingRect()).boundingRect()
        widest = max(80, int(area.width() * 0.7))
        self.readout.setMaximumWidth(widest)
        self.readout.setWordWrap(False)
        self.readout.setText(text)
        if self.readout.sizeHint().width() > widest:  # too long for one line: one value a line
            self.readout.setText(text.replace(" &nbsp; ", "<br>"))
            self.readout.setWordWrap(True)
        self.readout.adjustSize()
        # the corner away from the mouse, so the readout never hides what is pointed at
        mouse_on_right = self.widget.mapFromScene(pg.Point(mouse_x, 0)).x() > area.center().x()
        x = area.left() + 4 if mouse_on_right else area.right() - self.readout.width() - 4
        self.readout.move(max(0, x), area.top() + 4)
        self.readout.show()
        self.readout.raise_()

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

    # -- export ---------------------------------------------------------------------------------------

    def fill_export_copy(self, copy: PlotPanel) -> None:
        """Give a fresh panel of this kind what this one shows (the runs; server plots override)."""
        copy.redraw(self._runs, self._primary)

    @contextmanager
    def _export_copy(self):
        """A fresh panel like this one, laid out offscreen at EXPORT_LAYOUT_WIDTH, its data fitted."""
        copy = type(self)()
        copy.apply_palette(self.palette_)
        copy.show_run_legend = True
        size = QSize(EXPORT_LAYOUT_WIDTH, round(EXPORT_LAYOUT_WIDTH * self.export_aspect))
        copy.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)
        copy.resize(size)
        copy.show()
        try:
            self.fill_export_copy(copy)
            copy.reset_view()
            QApplication.processEvents()  # layout, then the ranges pyqtgraph updates before painting
            copy.reset_view()
            QApplication.processEvents()
            yield copy, size
        finally:
            copy.close()
            copy.deleteLater()

    def export_image(self, width: int = DEFAULT_EXPORT_WIDTH) -> QImage:
        """The panel (title, legend, axes, data) as an image `width` pixels wide."""
        with self._export_copy() as (copy, size):
            scale = width / size.width()
            image = QImage(width, round(size.height() * scale), QImage.Format.Format_ARGB32)
            # a device pixel ratio: text, ticks and layout scale; the data's pens (cosmetic, in device pixels)
            # are widened by the same factor so that lines keep their weight next to the text
            image.setDevicePixelRatio(scale)
            image.fill(QColor(self.palette_.background))
            _widen_pens(copy.plot, scale)
            copy.render(image)
        image.setDevicePixelRatio(1.0)
        return image

    def export_svg(self, path: str | Path, width: int = DEFAULT_EXPORT_WIDTH) -> Path:
        """The panel as a vector SVG whose page is `width` pixels wide."""
        from PySide6.QtSvg import QSvgGenerator

        path = Path(path)
        with self._export_copy() as (copy, size):
            generator = QSvgGenerator()
            generator.setFileName(str(path))
            generator.setSize(QSize(width, round(size.height() * width / size.width())))
            generator.setViewBox(QRect(0, 0, size.width(), size.height()))
            generator.setTitle(self.title_label.title or type(self).__name__)
            painter = QPainter(generator)
            try:
                painter.fillRect(QRectF(0, 0, size.width(), size.height()), QColor(self.palette_.background))
                copy.render(painter, QPoint(0, 0))
            finally:
                painter.end()
        return path


def _widen_pens(plot: pg.PlotItem, factor: float) -> None:
    """Multiply the width of every data curve's and marker line's pen (and marker size) by factor."""
    for item in plot.items:
        if isinstance(item, pg.PlotDataItem):
            pen = item.opts.get("pen")
            if pen is not None:
                pen = pg.mkPen(pen)
                pen.setWidthF(max(pen.widthF(), 1.0) * factor)
                item.setPen(pen)
            if item.opts.get("symbol") is not None:
                item.setSymbolSize(item.opts["symbolSize"] * factor)
        elif isinstance(item, pg.ScatterPlotItem):
            item.setSize(item.opts["size"] * factor)
        elif isinstance(item, pg.InfiniteLine) and item.isVisible():
            pen = pg.mkPen(item.pen)
            pen.setWidthF(max(pen.widthF(), 1.0) * factor)
            item.setPen(pen)
