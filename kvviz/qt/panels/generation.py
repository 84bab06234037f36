"""Prompt editor with example prompts, and the generation settings."""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kvviz.qt import theme


def example_prompts() -> list[dict[str, str]]:
    """Example prompts shipped in resources/prompts/*.json ([{"name", "text"}, ...])."""
    folder = theme.resources_dir() / "prompts"
    prompts: list[dict[str, str]] = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for item in data if isinstance(data, list) else []:
            if isinstance(item, dict) and isinstance(item.get("text"), str):
                prompts.append({"name": str(item.get("name") or item["text"][:40]), "text": item["text"]})
    return prompts


class PromptPanel(QGroupBox):
    def __init__(self, parent: QWidget | None = None):
        super().__init__("Prompt", parent)
        self.examples = QComboBox()
        self.examples.addItem("Example prompts…")
        self._prompts = example_prompts()
        for prompt in self._prompts:
            self.examples.addItem(prompt["name"])
        self.examples.activated.connect(self._pick)
        self.editor = QPlainTextEdit()
        self.editor.setPlaceholderText("Type a prompt, then press Run (Ctrl+Enter)")
        self.editor.setMinimumHeight(80)
        self.editor.setMaximumHeight(150)
        layout = QVBoxLayout(self)
        layout.addWidget(self.examples)
        layout.addWidget(self.editor, 1)

    def _pick(self, index: int) -> None:
        if index > 0:
            self.editor.setPlainText(self._prompts[index - 1]["text"])
        self.examples.setCurrentIndex(0)

    def text(self) -> str:
        return self.editor.toPlainText()

    def set_text(self, text: str) -> None:
        self.editor.setPlainText(text)


class SettingsPanel(QGroupBox):
    def __init__(self, parent: QWidget | None = None):
        super().__init__("Generation", parent)
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(1, 32768)
        self.max_new_tokens.setValue(128)
        self.max_new_tokens.setToolTip("Tokens to generate (the run stops earlier at end-of-text)")
        self.mode = QComboBox()
        self.mode.addItems(["greedy", "sampling"])
        self.mode.currentIndexChanged.connect(self._mode_changed)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.05, 5.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setValue(0.8)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 100000)
        self.top_k.setToolTip("0 = no top-k limit")
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setDecimals(2)
        self.top_p.setValue(1.0)
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.raw = QCheckBox("raw prompt (no chat template)")
        form = QFormLayout(self)
        form.addRow("max new tokens", self.max_new_tokens)
        form.addRow("decoding", self.mode)
        form.addRow("temperature", self.temperature)
        form.addRow("top-k", self.top_k)
        form.addRow("top-p", self.top_p)
        form.addRow("seed", self.seed)
        form.addRow(self.raw)
        self._mode_changed()

    def _mode_changed(self, *_: Any) -> None:
        sampling = self.mode.currentText() == "sampling"
        for widget in (self.temperature, self.top_k, self.top_p):
            widget.setEnabled(sampling)

    def settings(self) -> dict[str, Any]:
        """Keyword arguments of engine.decode.GenerationSettings."""
        sampling = self.mode.currentText() == "sampling"
        return {
            "max_new_tokens": self.max_new_tokens.value(),
            "temperature": self.temperature.value() if sampling else 0.0,
            "top_k": self.top_k.value() if sampling else 0,
            "top_p": self.top_p.value() if sampling else 1.0,
            "seed": self.seed.value(),
            "raw": self.raw.isChecked(),
        }

    def state(self) -> dict[str, Any]:
        return {
            "max_new_tokens": self.max_new_tokens.value(),
            "mode": self.mode.currentText(),
            "temperature": self.temperature.value(),
            "top_k": self.top_k.value(),
            "top_p": self.top_p.value(),
            "seed": self.seed.value(),
            "raw": self.raw.isChecked(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        try:
            self.max_new_tokens.setValue(int(state.get("max_new_tokens", self.max_new_tokens.value())))
            self.mode.setCurrentText(str(state.get("mode", self.mode.currentText())))
            self.temperature.setValue(float(state.get("temperature", self.temperature.value())))
            self.top_k.setValue(int(state.get("top_k", self.top_k.value())))
            self.top_p.setValue(float(state.get("top_p", self.top_p.value())))
            self.seed.setValue(int(state.get("seed", self.seed.value())))
            self.raw.setChecked(bool(state.get("raw", False)))
        except (TypeError, ValueError):
            pass
