"""What the window keeps between sessions (QSettings), and its colour theme.

Kept: the model loaded last (never one that failed to load), the prompt, the generation settings,
every strategy's options and the one chosen, the server address, model folder and load set, the theme,
and the window's geometry, dock layout and splitter sizes.
"""

from __future__ import annotations

import json

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtWidgets import QApplication

from kvviz.qt import theme

DEFAULT_PROMPT = "Explain in a few sentences what the key-value cache of a transformer does."


def restore(window) -> None:
    s = window.settings
    controls, server = window.controls, window.server
    controls.model_panel.set_spec(str(s.value("model/spec", "default")))
    controls.prompt_panel.set_text(str(s.value("prompt/text", DEFAULT_PROMPT)))
    controls.settings_panel.set_state(_json(s.value("generation/state"), {}))
    controls.strategy_panel.set_all_values(_json(s.value("strategy/values"), {}))
    controls.strategy_panel.set_current(str(s.value("strategy/name", "dynamic")))  # applied once listed
    server.panel.set_url(str(s.value("server/url", "")))
    server.panel.model_dir.setText(str(s.value("server/model_dir", "")))
    server.load_panel.set_values(_json(s.value("server/load"), {}))
    window.set_theme(str(s.value("view/theme", "dark")))
    geometry = s.value("window/geometry")
    if isinstance(geometry, QByteArray) and not geometry.isEmpty():
        window.restoreGeometry(geometry)
    else:
        window.resize(1600, 1000)
    state = s.value("window/state")
    if isinstance(state, QByteArray) and not state.isEmpty():
        window.restoreState(state)
    for name, splitter in window.local_view.splitters.items():
        value = s.value(f"window/splitter_{name}")
        if isinstance(value, QByteArray) and not value.isEmpty():
            splitter.restoreState(value)
    if not isinstance(state, QByteArray) or state.isEmpty():
        window.resizeDocks([window.controls_dock, window.tokens_dock], [340, 300], Qt.Orientation.Horizontal)
        window.resizeDocks([window.runs_dock], [170], Qt.Orientation.Vertical)
        window.local_view.setSizes([300, 260, 220])


def save(window) -> None:
    s = window.settings
    controls, server = window.controls, window.server
    if window.engine.loaded_spec is not None:  # only a model that loaded is worth loading at the next start
        s.setValue("model/spec", window.engine.loaded_spec)
    s.setValue("prompt/text", controls.prompt_panel.text())
    s.setValue("generation/state", json.dumps(controls.settings_panel.state()))
    s.setValue("strategy/values", json.dumps(controls.strategy_panel.all_values()))
    if controls.strategy_panel.current():
        s.setValue("strategy/name", controls.strategy_panel.current())
    s.setValue("server/url", server.panel.current_url())
    s.setValue("server/model_dir", server.panel.model_dir.text())
    s.setValue("server/load", json.dumps(server.load_panel.values()))
    s.setValue("view/theme", window.theme_name)
    s.setValue("window/geometry", window.saveGeometry())
    s.setValue("window/state", window.saveState())
    for name, splitter in window.local_view.splitters.items():
        s.setValue(f"window/splitter_{name}", splitter.saveState())
    s.sync()


def apply_theme(window, name: str) -> str:
    """Style the application and every plot and view of the window; returns the theme applied (dark when
    `name` is not a theme)."""
    if name not in theme.PALETTES:
        name = "dark"
    palette = theme.PALETTES[name]
    app = QApplication.instance()
    if app is not None:
        app.setStyleSheet(theme.stylesheet(name))
    for plot in window.local_view.plots + window.server.view.plots:
        plot.apply_palette(palette)
        if hasattr(plot, "restyle"):
            plot.restyle()
    window.token_view.apply_palette(palette)
    return name


def _json(value, default):
    if not isinstance(value, str):
        return default
    try:
        return json.loads(value)
    except ValueError:
        return default
