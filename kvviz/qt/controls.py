"""The Controls dock: a tab per mode above the mode's Controls (scrolling), and its buttons below them, always in
view.

Each mode lists its Controls, top to bottom (`Mode.controls`): its own panels and the panels it shares with other
modes (`kvviz.qt.shared_panels.SharedPanels`: the model chooser, the prompt, the generation settings, the strategy
picker and the pinned spans). The column holds the current mode's, in its order; the rest are out of the layout and
hidden. The tab bar and the buttons follow the mode (`set_mode`), driven by the same list of modes as the central
tabs.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QScrollArea, QTabBar, QVBoxLayout, QWidget

from kvviz.qt.mode_api import Mode
from kvviz.qt.shared_panels import SharedPanels


class PageSwap(QWidget):
    """One of its pages at a time, as tall as that page (a QStackedWidget is as tall as its tallest page,
    which would leave the local mode's controls with the server page's height)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._pages: list[QWidget] = []
        self._current = -1
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)

    def addWidget(self, page: QWidget) -> None:  # noqa: N802 - QStackedWidget's name
        self._pages.append(page)
        self.layout().addWidget(page)
        if self._current < 0:
            self._current = 0
        page.setVisible(len(self._pages) - 1 == self._current)

    def currentIndex(self) -> int:  # noqa: N802
        return self._current

    def setCurrentIndex(self, index: int) -> None:  # noqa: N802
        self._current = index
        for i, page in enumerate(self._pages):
            page.setVisible(i == index)


class Controls(QWidget):
    def __init__(self, panels: SharedPanels, modes: list[Mode], parent: QWidget | None = None):
        super().__init__(parent)
        self.modes = modes
        self.model_panel, self.prompt_panel = panels.model_panel, panels.prompt_panel
        self.settings_panel, self.strategy_panel = panels.settings_panel, panels.strategy_panel
        self.source_tabs = QTabBar()
        for i, mode in enumerate(modes):  # short names: the modes share the dock's width (the central tabs say more)
            self.source_tabs.addTab(mode.short_title)
            self.source_tabs.setTabToolTip(i, mode.tip)
        self.source_tabs.setExpanding(True)
        self.source_tabs.setUsesScrollButtons(False)  # every mode in view
        self.buttons = PageSwap()
        for mode in modes:
            self.buttons.addWidget(mode.buttons)
        self.column_widget = QWidget()
        self.column_widget.setObjectName("controls")
        self.column = QVBoxLayout(self.column_widget)
        self.column.setContentsMargins(6, 4, 6, 4)
        self.column.setSpacing(2)
        self.column.addStretch(0)  # what a tall screen leaves after the prompt's sixteen lines
        self._shown: list[QWidget] = []  # the panels in the column now
        for mode in modes:  # every panel a child of the column, hidden until its mode shows it
            for panel in mode.controls:
                panel.setParent(self.column_widget)
                panel.hide()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.column_widget)
        # the controls are laid out to the dock's width; only a very low window scrolls them (vertically)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        widest = 0
        for index in range(len(modes)):
            self._fill(index)
            widest = max(widest, self.column_widget.minimumSizeHint().width())
        scroll.setMinimumWidth(widest + scroll.verticalScrollBar().sizeHint().width())
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 6)
        layout.addWidget(self.source_tabs)
        layout.addWidget(scroll, 1)
        layout.addWidget(self.buttons)
        self.set_mode(0)

    def _fill(self, index: int) -> None:
        """The column holds mode `index`'s Controls, in its order; the others' are out of it and hidden."""
        wanted = self.modes[index].controls
        for panel in self._shown:
            self.column.removeWidget(panel)  # (never takeAt: PySide would let go of the panel's Python object)
            if panel not in wanted:
                panel.hide()
        for place, panel in enumerate(wanted):
            self.column.insertWidget(place, panel, 1 if panel is self.prompt_panel else 0)  # the prompt takes the rest
            panel.show()
        self._shown = list(wanted)

    def set_mode(self, index: int) -> None:
        """Mode `index`'s tab, Controls and buttons, without echoing the change."""
        if self.source_tabs.currentIndex() != index:
            self.source_tabs.blockSignals(True)
            self.source_tabs.setCurrentIndex(index)
            self.source_tabs.blockSignals(False)
        self._fill(index)
        self.buttons.setCurrentIndex(index)
        self.strategy_panel.set_prompt_relevant(self.prompt_panel in self.modes[index].controls)
