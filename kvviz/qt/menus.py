"""The window's File (Quit), Run and View menus. Open, save and export are added to File by
kvviz.qt.file_actions, the Record menu by kvviz.qt.recorder, the Help menu by kvviz.qt.help."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence

from kvviz.qt import theme


class Menus:
    def __init__(self, window):
        bar = window.menuBar()
        file_menu = bar.addMenu("&File")
        quit_action = QAction("&Quit", window)
        quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        quit_action.triggered.connect(window.close)
        file_menu.addAction(quit_action)

        run_menu = bar.addMenu("&Run")
        self.run_action = QAction("&Run", window)
        self.run_action.setShortcuts([QKeySequence("Ctrl+Return"), QKeySequence("Ctrl+Enter")])
        self.run_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.run_action.triggered.connect(lambda *_: window.start_run())
        self.switch_action = QAction("S&witch strategy at the next step", window)
        self.switch_action.setShortcuts([QKeySequence("F6"), QKeySequence("Ctrl+Shift+Return")])
        self.switch_action.setToolTip("Convert the running cache (a run's or a chat's) to the strategy picked")
        self.switch_action.triggered.connect(lambda *_: window.switch_strategy())
        self.stop_action = QAction("&Stop", window)
        self.stop_action.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        self.stop_action.triggered.connect(window.stop_run)
        for action in (self.run_action, self.switch_action, self.stop_action):
            run_menu.addAction(action)
            window.addAction(action)

        view_menu = bar.addMenu("&View")
        themes = QActionGroup(window)
        self.theme_actions: dict[str, QAction] = {}
        for name in theme.THEMES:
            action = QAction(f"{name.title()} theme", window, checkable=True)
            action.triggered.connect(lambda _=False, n=name: window.set_theme(n))
            themes.addAction(action)
            view_menu.addAction(action)
            self.theme_actions[name] = action
        view_menu.addSeparator()
        for dock in (window.controls_dock, window.tokens_dock, window.runs_dock):
            view_menu.addAction(dock.toggleViewAction())
        view_menu.addSeparator()
        reset = QAction("Reset &layout", window)
        reset.setToolTip("Put the docks and plots back where they start, sized for this window")
        reset.triggered.connect(lambda *_: window.reset_layout())
        view_menu.addAction(reset)

    def set_enabled(self, can_start: bool, busy: bool, can_switch: bool) -> None:
        """can_start: the mode on screen would start something; busy: something runs; can_switch: the mode on
        screen would switch a running cache."""
        self.run_action.setEnabled(can_start)
        self.stop_action.setEnabled(busy)
        self.switch_action.setEnabled(can_switch)

    def check_theme(self, name: str) -> None:
        self.theme_actions[name].setChecked(True)
