"""Prompt editor with example prompts, a prompt file and the prompt's token count; the generation settings."""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QToolButton,
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


MAX_LINES = 16  # the prompt editor grows up to this many lines on a tall screen


class PromptEditor(QPlainTextEdit):
    """Asks for four lines (a QPlainTextEdit asks for about twelve); it grows into the room the Controls leave."""

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(super().sizeHint().width(), 4 * self.fontMetrics().lineSpacing() + 14)


class PromptPanel(QGroupBox):
    """The prompt. Its token count comes from the model's tokenizer on the worker's thread (the window's
    preflight of the next run, once typing pauses) through `set_count`."""

    sigOpenRequested = Signal()  # "Open…": choose a prompt file

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Prompt", parent)
        self.examples = QComboBox()
        self.examples.addItem("Examples…")
        self.examples.setToolTip("Example prompts")
        self._prompts = example_prompts()
        for prompt in self._prompts:
            self.examples.addItem(prompt["name"])
        self.examples.activated.connect(self._pick)
        self.examples.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.examples.setMinimumContentsLength(4)  # long example names must not widen the Controls
        self.open_button = QPushButton("Open…")
        self.open_button.setToolTip("Open a prompt from a UTF-8 .txt or .md file")
        self.open_button.clicked.connect(lambda *_: self.sigOpenRequested.emit())
        self.editor = PromptEditor()
        self.editor.setPlaceholderText("Type a prompt, then press Run (Ctrl+Enter)")
        self.editor.setMinimumHeight(58)  # three lines; it takes the room the Controls leave, up to MAX_LINES
        self.count_label = QLabel("– tokens")
        self.count_label.setMinimumWidth(self.count_label.fontMetrics().horizontalAdvance("8,888 tokens"))
        self.count_label.setObjectName("muted")
        self.count_label.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.count_label.setToolTip(
            "Tokens the model will read for this prompt, counted by its tokenizer (with its chat template "
            "unless the raw prompt is chosen); – while no model is loaded"
        )
        self.editor.textChanged.connect(self._counting)
        row = QHBoxLayout()  # under the editor: where prompts come from, and how long this one is
        row.addWidget(self.examples, 1)
        row.addWidget(self.open_button)
        row.addWidget(self.count_label)
        layout = QVBoxLayout(self)
        layout.setSpacing(4)
        layout.addWidget(self.editor, 1)
        layout.addLayout(row)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        self._cap_height()

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._cap_height()

    def _cap_height(self) -> None:
        """The editor up to MAX_LINES lines, and the group no taller than that (a tall screen's spare room
        stays below the controls instead of opening a gap inside this group)."""
        self.editor.setMaximumHeight(MAX_LINES * self.editor.fontMetrics().lineSpacing())
        layout = self.layout()
        outer, inner = self.contentsMargins(), layout.contentsMargins()
        row = layout.itemAt(1).sizeHint().height()
        extra = outer.top() + outer.bottom() + inner.top() + inner.bottom() + layout.spacing()
        self.setMaximumHeight(self.editor.maximumHeight() + row + extra)

    # -- the token count ------------------------------------------------------------------------------

    def _counting(self) -> None:
        if self.count_label.text() != "– tokens":
            self.count_label.setText("counting…")

    def set_count(self, count: int | None) -> None:
        """The prompt's token count as a run would feed it; None: no model to count with."""
        self.count_label.setText("– tokens" if count is None else f"{count:,} tokens")

    # -- the text -------------------------------------------------------------------------------------

    def _pick(self, index: int) -> None:
        if index > 0:
            self.editor.setPlainText(self._prompts[index - 1]["text"])
        self.examples.setCurrentIndex(0)

    def text(self) -> str:
        return self.editor.toPlainText()

    def set_text(self, text: str) -> None:
        self.editor.setPlainText(text)


class SettingsPanel(QGroupBox):
    """The generation settings. The token limit is always in view; the rest folds away behind a button that
    says how it decodes ("greedy", "sampling, raw"), so the Controls fit a 720-pixel-high screen."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Generation", parent)
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(1, 32768)
        self.max_new_tokens.setValue(128)
        self.max_new_tokens.setToolTip("Most new tokens to generate (the run stops earlier at end-of-text)")
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
        self.seed.setToolTip("The random seed of sampling: the same seed gives the same text")
        self.more = QToolButton()
        self.more.setObjectName("fold")
        self.more.setCheckable(True)
        self.more.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.more.setToolTip("Show or hide decoding, sampling and chat-template settings")
        self.more.toggled.connect(self._mode_changed)
        self.max_new_tokens.setMaximumWidth(self.max_new_tokens.fontMetrics().horizontalAdvance("888888") + 40)
        first = QHBoxLayout()
        first.addWidget(self.max_new_tokens, 1)
        first.addWidget(self.more)
        self.form = QFormLayout(self)
        self.form.addRow("max tokens", first)
        self.form.addRow("decoding", self.mode)
        self.form.addRow("temperature", self.temperature)
        self.form.addRow("top-k", self.top_k)
        self.form.addRow("top-p", self.top_p)
        self.form.addRow("seed", self.seed)
        self.form.addRow(self.raw)
        for widget in (self.temperature, self.top_k, self.top_p):
            widget.valueChanged.connect(self._mode_changed)
        self.raw.toggled.connect(self._mode_changed)
        self._mode_changed()

    def _mode_changed(self, *_: Any) -> None:
        """Folded: only max new tokens. Unfolded: decoding and the raw prompt, and the sampling settings while
        sampling (greedy decoding ignores them)."""
        unfolded = self.more.isChecked()
        sampling = self.mode.currentText() == "sampling"
        self.form.setRowVisible(self.mode, unfolded)
        self.form.setRowVisible(self.raw, unfolded)
        for widget in (self.temperature, self.top_k, self.top_p, self.seed):
            self.form.setRowVisible(widget, unfolded and sampling)
        self.more.setText(self.mode.currentText() + (", raw" if self.raw.isChecked() else ""))
        self.more.setArrowType(Qt.ArrowType.DownArrow if unfolded else Qt.ArrowType.RightArrow)

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
            "unfolded": self.more.isChecked(),
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
            self.more.setChecked(bool(state.get("unfolded", False)))
        except (TypeError, ValueError):
            pass
