"""The "Choose" tab: the answer above (two sentences, then their caveats, smaller), the frontier plot (and, where the
sweep asked questions, the accuracy plot) with the picked configuration's curves beside it, and the table of every
configuration below (and, where questions were asked, each answer in a tab beside it).

The view only draws: `redraw(sweep, states, selected, header, answered)` takes the sweep on screen (kept by
kvviz.qt.choose.mode), each configuration's state, the configuration picked, the line saying what runs and the
sweep the answer is read from.
"""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QSplitter, QTabWidget, QVBoxLayout, QWidget

from kvviz.files import frontier
from kvviz.files.sweep import Sweep
from kvviz.qt import theme
from kvviz.qt.choose.accuracy_plot import AccuracyPlot
from kvviz.qt.choose.answers import AnswersTree
from kvviz.qt.choose.curves import MeasuredCachePlot, RunningDivergencePlot, RunningPerplexityPlot
from kvviz.qt.choose.frontier_plot import FrontierPlot
from kvviz.qt.choose.table import ChooseTable

FIRST_WORDS = ("Load a model, set the question under Controls ▸ Choose (the text, the context you will reach, how many "
               "sequences at once, the memory you have and the quality you accept), then press Choose: every "
               "configuration reads the text, and the answer appears here.")
TABLE_SHARE = 0.33  # of the tab's height for the table, in whole rows (six at 1280x720)
TABLE_MIN_ROWS = 3


def answer_html(sweep: Sweep, header: str) -> str:
    """The answer's sentences, then (smaller, muted) its caveats and what the window is doing."""
    said = frontier.answer(sweep)
    small = [escape(c) for c in said.caveats] + ([header] if header else [])
    muted = theme.current().muted
    return (f"<p style='margin:0'>{'<br>'.join(escape(s) for s in said.sentences)}</p>"
            f"<p style='margin:0; font-size:small; color:{muted}'>{' '.join(small)}</p>")


class ChooseView(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.answer = QLabel(FIRST_WORDS)
        self.answer.setObjectName("serverSummary")
        self.answer.setWordWrap(True)
        self.answer.setTextFormat(Qt.TextFormat.RichText)
        self.answer.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.frontier_plot = FrontierPlot()
        self.accuracy_plot = AccuracyPlot()  # where the sweep asked questions
        self.accuracy_plot.plot.setXLink(self.frontier_plot.plot)  # one memory axis: a point's place matches
        self.frontier_plot.sigCovers.connect(self.set_covers)
        self._drawn: Sweep | None = None  # the sweep last drawn: a new one is first shown at what its budget covers
        self.curve_plots = [RunningPerplexityPlot(), RunningDivergencePlot(), MeasuredCachePlot()]
        self.plots = [self.frontier_plot, self.accuracy_plot, *self.curve_plots]
        curves = QSplitter(Qt.Orientation.Vertical)
        for plot in self.curve_plots:
            curves.addWidget(plot)
        curves.setChildrenCollapsible(False)
        self.curves = curves
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(self.frontier_plot)
        top.addWidget(self.accuracy_plot)
        top.addWidget(curves)
        top.setStretchFactor(0, 3)
        top.setStretchFactor(1, 3)
        top.setStretchFactor(2, 2)
        top.setChildrenCollapsible(False)
        self.table = ChooseTable()
        self.answers = AnswersTree()
        self.below = QTabWidget()  # the configurations' table, and each answer where questions were asked
        self.below.setDocumentMode(True)
        self.below.addTab(self.table, "Configurations")
        self.below.addTab(self.answers, "Answers")
        self.below.setTabToolTip(1, "Each question asked, per configuration: right or wrong, and the model's answer")
        # no taller a minimum than the table's alone: the tab bar must not push a 720-pixel window off the screen
        self.below.setMinimumHeight(self.table.minimumSizeHint().height())
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(top)
        self.splitter.addWidget(self.below)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 0)
        self.splitter.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 0)
        layout.addWidget(self.answer)
        layout.addWidget(self.splitter, 1)
        self._user_sized = False  # the user dragged the table's edge: its height is theirs from then on
        self.splitter.splitterMoved.connect(self._dragged)
        # the scroll bar under the table comes and goes with the columns' width, once laid out: the rows fit again then
        self.table.horizontalScrollBar().rangeChanged.connect(lambda *_: QTimer.singleShot(0, self._fit_table))
        self.redraw(None, [], None, "", None)  # no sweep yet: no accuracy plot, no Answers tab, no curves

    def set_covers(self, covers: str) -> None:
        """Both plots' points at their caches' memory ("cache") or at the process's peak ("process")."""
        self.frontier_plot.set_covers(covers)
        self.accuracy_plot.set_covers(covers)

    def redraw(self, sweep: Sweep | None, states: list[str], selected: int | None, header: str,
               answered: Sweep | None) -> None:
        if sweep is not None and sweep is not self._drawn:
            self.set_covers(sweep.question.budget_covers)
        self._drawn = sweep
        if answered is None:
            self.answer.setText(FIRST_WORDS + (f"<br><i>{header}</i>" if header else ""))
        else:
            self.answer.setText(answer_html(answered, header))
        self.frontier_plot.show_sweep(sweep, selected)
        asked = sweep is not None and sweep.asked is not None
        self.accuracy_plot.show_sweep(sweep if asked else None)
        self.accuracy_plot.setVisible(asked)
        self.answers.show_sweep(sweep if asked else None)
        self.below.setTabVisible(1, asked)
        self.below.tabBar().setVisible(asked)
        for plot in self.curve_plots:
            plot.show_config(sweep, selected)
        self.curves.setVisible(selected is not None)
        self.table.show_sweep(sweep, states, selected)
        self._fit_table()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit_table()

    def _dragged(self, *_) -> None:
        self._user_sized = True

    def _fit_table(self) -> None:
        """The table's share of the tab, in whole rows: a row cut in half reads as a fault (at 1280x720 it showed
        four rows and a half)."""
        total = sum(self.splitter.sizes())
        if total <= 0 or self._user_sized:
            return
        table = self.table
        row = table.verticalHeader().defaultSectionSize()
        bar = table.horizontalScrollBar()
        if table.height() > 0:  # all but the rows, as laid out: header, frame, scroll bar, the tab widget's own room
            chrome = self.below.height() - table.viewport().height()
        else:
            chrome = (table.horizontalHeader().sizeHint().height() + 2 * table.frameWidth()
                      + (bar.sizeHint().height() if bar.isVisible() else 0))
        rows = max(TABLE_MIN_ROWS, int((total * TABLE_SHARE - chrome) // row))
        # no more than the plots above leave (the picked configuration's three curves need their height)
        room = total - self.splitter.widget(0).minimumSizeHint().height() - chrome
        rows = max(1, min(rows, int(room // row)))
        want = chrome + rows * row
        if self.splitter.sizes()[1] != want:
            self.splitter.setSizes([total - want, want])

    def apply_palette(self, palette: theme.Palette) -> None:
        for plot in self.plots:
            plot.apply_palette(palette)
