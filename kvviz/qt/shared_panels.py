"""The panels several modes show in their Controls (kvviz.qt.controls lays them out; kvviz.qt.mode_api hands them to
the modes): its own module, below both, so that neither imports the other."""

from __future__ import annotations

from kvviz.qt.panels.generation import PromptPanel, SettingsPanel
from kvviz.qt.panels.model import ModelPanel
from kvviz.qt.panels.pins import PinPanel
from kvviz.qt.panels.strategy import StrategyPanel


class SharedPanels:
    """The panels several modes show in their Controls: made once, so that a model, a prompt, the settings and a
    strategy chosen in one mode are the ones the next mode uses."""

    def __init__(self):
        self.model_panel = ModelPanel()
        self.prompt_panel = PromptPanel()
        self.settings_panel = SettingsPanel()
        self.strategy_panel = StrategyPanel()
        self.pin_panel = PinPanel()  # the spans of the prompt a local run watches (the Tokens panel pins there too)
        for group in (self.model_panel, self.prompt_panel, self.settings_panel, self.strategy_panel, self.pin_panel):
            group.layout().setContentsMargins(8, 4, 8, 6)  # the groups' frames take what the fields need
