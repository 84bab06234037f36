"""The Serve mode's controls: the load (prompts or built-in requests, a shared prefix, the arrival rate, the tokens
each answer may have) and the pool (page size, blocks, tokens a step, requests a batch, scheduler, prefix sharing),
as `kvviz serve` takes them."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
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

from kvviz.files.serve_trace import SCHEDULERS, ServeSettings

BUILTIN_REQUESTS = 8
POOL = {"page_size": 16, "blocks": 64, "max_batch_tokens": 256}  # a pool whose blocks one can count on screen
MAX_BLOCKS = 1_000_000
TEXT_ROWS = 4


def _spin(low: int, high: int, value: int, tip: str, special: str = "") -> QSpinBox:
    spin = QSpinBox()
    spin.setRange(low, high)
    spin.setValue(value)
    spin.setGroupSeparatorShown(True)
    spin.setAlignment(Qt.AlignmentFlag.AlignRight)
    spin.setToolTip(tip)
    if special:
        spin.setSpecialValueText(special)
    return spin


def _text(placeholder: str, tip: str) -> QPlainTextEdit:
    edit = QPlainTextEdit()
    edit.setPlaceholderText(placeholder)
    edit.setToolTip(tip)
    edit.setFixedHeight(edit.fontMetrics().lineSpacing() * TEXT_ROWS + 12)
    return edit


class LoadPanel(QGroupBox):
    """What arrives: the prompts and how fast."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Requests", parent)
        self.prompts = _text("one prompt per line; empty: summaries of the built-in text's passages",
                             "Each line is a request: the user turn of the model's chat template")
        self.requests = _spin(1, 4096, BUILTIN_REQUESTS, "How many built-in requests, when no prompt is written")
        self.prefix = _text("a text put before every prompt (optional)",
                            "Put before every prompt: requests that begin alike share the blocks of what they have "
                            "in common")
        self.rate = QDoubleSpinBox()
        self.rate.setRange(0.0, 1000.0)
        self.rate.setDecimals(1)
        self.rate.setSingleStep(0.5)
        self.rate.setSpecialValueText("all at once")
        self.rate.setSuffix(" / s")
        self.rate.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.rate.setToolTip("Requests per second, Poisson-spaced; 0: all arrive at once")
        self.new_tokens = _spin(1, 1_000_000, 32, "Tokens each answer may have (it ends at the end-of-sequence token)")
        form = QFormLayout(self)
        form.addRow("prompts", self.prompts)
        form.addRow("built-in requests", self.requests)
        form.addRow("shared prefix", self.prefix)
        form.addRow("arrivals", self.rate)
        form.addRow("new tokens", self.new_tokens)

    def texts(self, builtin) -> list[str]:
        """The requests' texts: the prompts written, or `builtin(n)`'s."""
        lines = [line.strip() for line in self.prompts.toPlainText().splitlines() if line.strip()]
        return lines or builtin(self.requests.value())


class PoolPanel(QGroupBox):
    """The paged cache: its blocks, and how the scheduler fills them."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Pool", parent)
        self.page_size = _spin(4, 4096, POOL["page_size"], "Tokens per block (transformers' least: 4)")
        self.blocks = _spin(0, MAX_BLOCKS, POOL["blocks"], "The pool's blocks; 0: sized by transformers from the "
                            "free memory (on CPU 60 % of it)", "sized from memory")
        self.max_batch_tokens = _spin(1, 1_000_000, POOL["max_batch_tokens"], "Query tokens a step at most: a longer "
                                      "prefill is split over steps")
        self.concurrency = _spin(0, 4096, 0, "Requests a batch at most; 0: transformers' choice", "transformers'")
        self.scheduler = QComboBox()
        self.scheduler.addItems(SCHEDULERS)
        self.scheduler.setToolTip("fifo: decoding requests first, then prefills in arrival order; prefill_first: "
                                  "split prefills first")
        self.sharing = QCheckBox("share blocks by prefix")
        self.sharing.setChecked(True)
        self.sharing.setToolTip("Requests that begin alike hold the same blocks for what they have in common")
        form = QFormLayout(self)
        form.addRow("page size", self.page_size)
        form.addRow("blocks", self.blocks)
        form.addRow("tokens a step", self.max_batch_tokens)
        form.addRow("requests a batch", self.concurrency)
        form.addRow("scheduler", self.scheduler)
        form.addRow("", self.sharing)


class ServePanel(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.load = LoadPanel()
        self.pool = PoolPanel()
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        for panel in (self.load, self.pool):
            panel.layout().setContentsMargins(8, 4, 8, 6)
            column.addWidget(panel)

    def settings(self) -> ServeSettings:
        pool, load = self.pool, self.load
        return ServeSettings(max_new_tokens=load.new_tokens.value(), page_size=pool.page_size.value(),
                             blocks=pool.blocks.value() or None, max_batch_tokens=pool.max_batch_tokens.value(),
                             concurrency=pool.concurrency.value() or None, scheduler=pool.scheduler.currentText(),
                             prefix_sharing=pool.sharing.isChecked(), rate=load.rate.value() or None)

    def request(self) -> dict[str, Any]:
        from kvviz.engine.serve import builtin_prompts

        return {"texts": self.load.texts(builtin_prompts), "prefix": self.load.prefix.toPlainText(),
                "settings": self.settings()}
