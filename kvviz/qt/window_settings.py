"""What the window keeps between sessions (QSettings), its colour theme, and its layout's default sizes: the one
home of each, for the shell and (through the Mode hooks) every mode.

Kept: the model loaded last (never one that failed to load), the prompt, the generation settings, every strategy's
options and the one chosen, the theme, and the window's geometry, dock layout and Runs height; each mode keeps its
own part (`Mode.save_settings`: the local view's splitters, the server's address, model folder and load set, the
Evaluate mode's document and list).

Default sizes follow the window (1280x720 up to 4K): the docks take a share of its width and height
within fixed bounds, so the plots keep most of the room on a small screen and the side docks do not
grow without need on a large one.
"""

from __future__ import annotations

import json

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtWidgets import QApplication, QDockWidget, QTableWidget, QWidget

from kvviz.qt import theme

DEFAULT_PROMPT = "Explain in a few sentences what the key-value cache of a transformer does."


def dock(window, title: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
    """`widget` in a movable, floatable, closable dock named for the saved layout (dockControls, ...)."""
    made = QDockWidget(title, window)
    made.setObjectName(f"dock{title}")
    made.setWidget(widget)
    features = QDockWidget.DockWidgetFeature
    made.setFeatures(features.DockWidgetMovable | features.DockWidgetFloatable | features.DockWidgetClosable)
    window.addDockWidget(area, made)
    return made


def restore(window) -> None:
    s = window.settings
    panels = window.panels
    panels.model_panel.set_spec(str(s.value("model/spec", "default")))
    panels.prompt_panel.set_text(str(s.value("prompt/text", DEFAULT_PROMPT)))
    panels.settings_panel.set_state(stored_json(s.value("generation/state"), {}))
    panels.strategy_panel.set_all_values(stored_json(s.value("strategy/values"), {}))
    panels.strategy_panel.set_current(str(s.value("strategy/name", "dynamic")))  # applied once listed
    for mode in window.modes.values():
        mode.restore_settings(s)
    window.set_theme(str(s.value("view/theme", "dark")))
    height = s.value("window/runs_height")
    window.runs_height = int(height) if str(height or "").isdigit() else None
    geometry = s.value("window/geometry")
    if isinstance(geometry, QByteArray) and not geometry.isEmpty():
        window.restoreGeometry(geometry)
    else:
        window.resize(*default_size())
    state = s.value("window/state")
    if isinstance(state, QByteArray) and not state.isEmpty():
        with window.docks_aside.back():  # kept as the local runs have them
            window.restoreState(state)
    else:
        default_layout(window)


def default_size() -> tuple[int, int]:
    """1600x1000, or 90 % of a smaller screen."""
    screen = QApplication.primaryScreen()
    if screen is None:
        return 1600, 1000
    room = screen.availableGeometry()
    return min(1600, int(room.width() * 0.9)), min(1000, int(room.height() * 0.9))


def _between(value: float, low: int, high: int) -> int:
    return int(max(low, min(high, value)))


def runs_table_min_height(table: QTableWidget) -> int:
    """Room for the header and three rows (and a horizontal scroll bar): never a single row."""
    rows = 3 * table.verticalHeader().defaultSectionSize()
    return table.horizontalHeader().sizeHint().height() + rows + 14 + 2 * table.frameWidth()


def runs_height_for(window) -> int:
    """The Runs dock's height: the one the user chose, else a share of the window; at most a third of it."""
    minimum = window.runs_table.minimumHeight() + window.runs_dock.fontMetrics().height() + 10  # and its title
    wanted = window.runs_height or _between(window.height() * 0.2, minimum, 260)
    return _between(wanted, minimum, max(minimum, window.height() // 3))


def default_layout(window) -> None:
    """Every dock in its place, sized for the window as it is now, and every mode's view as it starts."""
    with window.docks_aside.back():  # laid out with every dock, then aside again for the mode on screen
        _dock_layout(window)
    for mode in window.modes.values():
        mode.reset_layout()


def _dock_layout(window) -> None:
    for dock, area in (
        (window.controls_dock, Qt.DockWidgetArea.LeftDockWidgetArea),
        (window.tokens_dock, Qt.DockWidgetArea.RightDockWidgetArea),
        (window.runs_dock, Qt.DockWidgetArea.BottomDockWidgetArea),
    ):
        if dock.isFloating():
            dock.setFloating(False)
        if window.dockWidgetArea(dock) != area:
            window.addDockWidget(area, dock)
        dock.show()
    width = window.width()
    controls = _between(width * 0.22, 330, 420)
    tokens = _between(width * 0.18, 220, 420)
    window.resizeDocks([window.controls_dock, window.tokens_dock], [controls, tokens], Qt.Orientation.Horizontal)
    window.resizeDocks([window.runs_dock], [runs_height_for(window)], Qt.Orientation.Vertical)


def save(window) -> None:
    s = window.settings
    panels = window.panels
    if window.model.loaded_spec is not None:  # only a model that loaded is worth loading at the next start
        s.setValue("model/spec", window.model.loaded_spec)
    s.setValue("prompt/text", panels.prompt_panel.text())
    s.setValue("generation/state", json.dumps(panels.settings_panel.state()))
    s.setValue("strategy/values", json.dumps(panels.strategy_panel.all_values()))
    if panels.strategy_panel.current():
        s.setValue("strategy/name", panels.strategy_panel.current())
    s.setValue("view/theme", window.theme_name)
    s.setValue("window/runs_height", str(window.runs_height) if window.runs_height else "")
    s.setValue("window/geometry", window.saveGeometry())
    with window.docks_aside.back():  # kept as the local runs have them
        s.setValue("window/state", window.saveState())
    for mode in window.modes.values():
        mode.save_settings(s)
    s.sync()


def apply_theme(window, name: str) -> str:
    """Style the application, every mode's view and the docks; returns the theme applied (dark when `name` is not
    a theme)."""
    if name not in theme.PALETTES:
        name = "dark"
    palette = theme.use(name)
    app, sheet = QApplication.instance(), theme.stylesheet(name)
    if app is not None and app.styleSheet() != sheet:  # setting it again re-polishes every widget (about 1 s)
        app.setStyleSheet(sheet)
    for mode in window.modes.values():
        mode.restyle(palette)
    window.token_view.apply_palette(palette)
    return name


def stored_json(value, default):
    """A setting kept as JSON text, parsed; `default` where it is missing or damaged."""
    if not isinstance(value, str):
        return default
    try:
        return json.loads(value)
    except ValueError:
        return default
