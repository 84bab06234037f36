"""The Controls dock's body: the model (or server) chooser, the prompt, the generation settings, the
strategy (or server load), and the Run, Switch and Stop buttons that stay in view below them.

"Local model" and "vLLM server" share the prompt and the settings; the rest swaps with the mode
(`set_mode`), and so do the buttons. The server mode's own widgets come from kvviz.qt.server_mode.
"Evaluate" keeps the model and the strategy picker, and puts the document above the picker and the
list of strategies to evaluate below it in place of the prompt and settings (kvviz.qt.evaluate.mode).
"Choose" keeps the model and puts its question (the text, the target, the budget and tolerance, the configurations)
in place of the strategy picker (kvviz.qt.choose.mode).
"Chat" keeps the model, the settings (max new tokens per answer) and the strategy picker, with Switch below
them; its messages are typed in the central Conversation tab (kvviz.qt.conversation.mode).
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QPushButton,
    QScrollArea,
    QTabBar,
    QVBoxLayout,
    QWidget,
)

from kvviz.qt.panels.generation import PromptPanel, SettingsPanel
from kvviz.qt.panels.model import ModelPanel
from kvviz.qt.panels.strategy import StrategyPanel

# the modes: a model run here, evaluated on a document, a vLLM server watched, a chat with the cache kept, or a
# sweep that chooses a cache
LOCAL, EVALUATE, SERVER, CONVERSATION, CHOOSE = 0, 1, 2, 3, 4
# the page each of the three swapping stacks (chooser, strategy or load, buttons) shows in each mode
PAGES = {LOCAL: (0, 0, 0), EVALUATE: (0, 0, 2), SERVER: (1, 1, 1), CONVERSATION: (0, 0, 3), CHOOSE: (0, 2, 4)}


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
    def __init__(self, server, evaluate, conversation, choose, parent: QWidget | None = None):
        """server: the window's ServerMode, whose panel, load panel and buttons fill the server pages;
        evaluate: its EvalMode, whose document and strategy list panels and buttons fill the Evaluate mode;
        conversation: its ConversationMode, whose buttons (Switch) fill the Conversation mode's page;
        choose: its ChooseMode, whose controls page and buttons fill the Choose mode's pages."""
        super().__init__(parent)
        self.model_panel = ModelPanel()
        self.prompt_panel = PromptPanel()
        self.settings_panel = SettingsPanel()
        self.strategy_panel = StrategyPanel()
        self.run_button = QPushButton("Run")
        self.run_button.setObjectName("runButton")
        self.run_button.setToolTip("Run (Ctrl+Enter)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop after the current step, keeping what was generated (Esc)")
        self.switch_button = QPushButton("Switch")
        self.switch_button.setToolTip(
            "Convert the running generation's cache to the strategy chosen above, at the next step"
        )
        self.reference_box = QCheckBox("Compare with the exact cache (fidelity)")
        self.reference_box.setToolTip(
            "Run a full-precision DynamicCache reference in lockstep on the same tokens and plot KL divergence; "
            "its time is measured apart and not counted in tokens/s"
        )
        self.source_tabs = QTabBar()
        # short names: four modes share the dock's width (the central tabs say them in full)
        tabs = (("Local", "A model run here"), ("Evaluate", "Strategies read a long document"),
                ("Server", "A vLLM server's cache, watched"),
                ("Chat", "A conversation with the cache kept across turns"),
                ("Choose", "Which cache should I use? A sweep of configurations on your text, and the answer"))
        for i, (name, tip) in enumerate(tabs):
            self.source_tabs.addTab(name)
            self.source_tabs.setTabToolTip(i, tip)
        self.source_tabs.setExpanding(True)
        self.source_tabs.setUsesScrollButtons(False)  # every mode in view: the dock is as wide as five names
        self.source_tabs.setToolTip(
            "Run a model here, evaluate strategies on a long document, attach to a vLLM server and watch its cache, "
            "chat with the cache kept across turns, or choose a cache for your text, context and memory"
        )
        self.stacks = [PageSwap() for _ in range(3)]  # chooser, strategy or load, buttons
        pages = [
            (self.model_panel, server.panel),
            (self.strategy_panel, server.load_panel),
            (self._buttons(), server.buttons),
        ]
        for stack, (local_page, server_page) in zip(self.stacks, pages, strict=True):
            stack.addWidget(local_page)
            stack.addWidget(server_page)
        self.stacks[2].addWidget(evaluate.buttons)
        self.stacks[2].addWidget(conversation.buttons)
        self.stacks[1].addWidget(choose.controls_page)
        self.stacks[2].addWidget(choose.buttons)
        self.document_panel, self.eval_list_panel = evaluate.document_panel, evaluate.list_panel
        self.document_panel.hide()
        self.eval_list_panel.hide()

        groups = (self.model_panel, self.prompt_panel, self.settings_panel, self.strategy_panel, self.document_panel,
                  self.eval_list_panel)
        for group in groups:
            group.layout().setContentsMargins(8, 4, 8, 6)  # the groups' frames take what the fields need
        controls = QWidget()
        controls.setObjectName("controls")
        column = QVBoxLayout(controls)
        column.addWidget(self.stacks[0])
        column.addWidget(self.prompt_panel, 1)  # the prompt editor takes the room left
        column.addWidget(self.settings_panel)
        column.addWidget(self.document_panel)
        column.addWidget(self.stacks[1])
        column.addWidget(self.eval_list_panel)
        column.addStretch(0)  # what a tall screen leaves after the prompt's sixteen lines
        column.setContentsMargins(6, 4, 6, 4)
        column.setSpacing(2)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(controls)
        # the controls are laid out to the dock's width; only a very low window scrolls them (vertically)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(controls.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width())
        # Run and Stop stay in view below the scrolling controls.
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 6)
        layout.addWidget(self.source_tabs)
        layout.addWidget(scroll, 1)
        layout.addWidget(self.stacks[2])

    def _buttons(self) -> QWidget:
        """The local mode's page under the controls: the reference check box above Run, Switch and Stop."""
        page = QWidget()
        column = QVBoxLayout(page)
        column.setContentsMargins(0, 0, 0, 0)
        reference_row = QHBoxLayout()
        reference_row.setContentsMargins(12, 0, 9, 0)
        reference_row.addWidget(self.reference_box)
        buttons = QHBoxLayout()
        buttons.setContentsMargins(9, 0, 9, 0)
        buttons.addWidget(self.run_button, 2)
        buttons.addWidget(self.switch_button, 1)
        buttons.addWidget(self.stop_button, 1)
        column.addLayout(reference_row)
        column.addLayout(buttons)
        return page

    def set_mode(self, index: int) -> None:
        """LOCAL, EVALUATE or SERVER: the tab bar and the swapping pages follow, without echoing the change."""
        for widget, page in ((self.source_tabs, index), *zip(self.stacks, PAGES[index], strict=True)):
            if widget.currentIndex() != page:
                widget.blockSignals(True)
                widget.setCurrentIndex(page)
                widget.blockSignals(False)
        evaluating = index == EVALUATE
        self.strategy_panel.set_prompt_relevant(index in (LOCAL, SERVER))
        self.prompt_panel.setVisible(index in (LOCAL, SERVER))  # a chat's messages are typed in its own view
        self.settings_panel.setVisible(index in (LOCAL, SERVER, CONVERSATION))
        for panel in (self.document_panel, self.eval_list_panel):
            panel.setVisible(evaluating)

    def set_enabled(self, can_run: bool, generating: bool, loading: bool) -> None:
        self.run_button.setEnabled(can_run)
        self.stop_button.setEnabled(generating)
        self.switch_button.setEnabled(generating)
        self.reference_box.setEnabled(not generating)
        self.model_panel.load_button.setEnabled(not generating and not loading)
