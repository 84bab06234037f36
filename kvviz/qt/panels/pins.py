"""The spans of the prompt the next local run watches ("pinned"): text selected in the prompt or the Tokens panel,
or the needle of a task item (kvviz.engine.tasks) written into the prompt. The run records after every step how many
of each span's tokens every layer and KV head still holds (`Decoder.pin_text`, `StepRecord.pins_held`); the cache map
outlines them and the Runs table says in how many layer-heads they are held.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kvviz.engine.tasks import TASKS

ITEM_TOKENS = 1000  # a task item's length at first: RULER's needles at about 1,000 tokens, as the issue measured
LABEL_CHARS = 40  # a pinned span's text is cut to this in the list (its tooltip has it whole)


class PinPanel(QGroupBox):
    sigWriteItem = Signal(str, int)  # task name, tokens: write an item of it into the prompt (on the worker)

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Pinned spans", parent)
        self.texts: list[str] = []
        self.pin_button = QPushButton("Pin selection")
        self.pin_button.setToolTip("Watch the words selected in the prompt in the next run (or right-click words of "
                                   "the prompt in the Tokens panel): the cache map outlines them")
        self.clear_button = QPushButton("Unpin all")
        self.clear_button.setToolTip("Watch no span")
        self.tasks = QComboBox()
        self.tasks.addItem("Needle item…")
        for name, recipe in TASKS.items():
            self.tasks.addItem(name)
            self.tasks.setItemData(self.tasks.count() - 1, f"{recipe.summary} ({recipe.source})",
                                   Qt.ItemDataRole.ToolTipRole)
        self.tasks.setToolTip("Write an item of a retrieval task into the prompt, its needle pinned (item 1, seed 0: "
                              "the one `kvviz choose --task NAME --items 1` asks)")
        self.tasks.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.tasks.setMinimumContentsLength(6)  # the Controls' width is the narrowest mode's; the row is its own
        self.length = QSpinBox()
        self.length.setRange(64, 1_000_000)
        self.length.setSingleStep(250)
        self.length.setValue(ITEM_TOKENS)
        self.length.setGroupSeparatorShown(True)
        self.length.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.length.setToolTip("The tokens the item is written to fit: its context, question and answer")
        self.listing = QLabel()
        self.listing.setObjectName("muted")
        self.listing.setWordWrap(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.pin_button, 1)
        buttons.addWidget(self.clear_button)
        length = QFormLayout()
        length.setContentsMargins(0, 0, 0, 0)
        length.addRow("item length (tokens)", self.length)
        layout = QVBoxLayout(self)
        layout.setSpacing(4)
        layout.addLayout(buttons)
        layout.addWidget(self.tasks)
        layout.addLayout(length)
        layout.addWidget(self.listing)
        self.clear_button.clicked.connect(lambda *_: self.set_texts([]))
        self.tasks.activated.connect(self._picked)
        self._show()

    def add(self, text: str) -> None:
        """Watch `text` too (its first place in the prompt the model reads); blank or repeated text is ignored."""
        if text.strip() and text not in self.texts:
            self.set_texts([*self.texts, text])

    def set_texts(self, texts: list[str]) -> None:
        self.texts = list(texts)
        self._show()

    def _picked(self, index: int) -> None:
        if index > 0:
            self.sigWriteItem.emit(self.tasks.itemText(index), self.length.value())
        self.tasks.setCurrentIndex(0)

    def say(self, text: str) -> None:
        """A word under the buttons until the spans change (an item written, why one could not be)."""
        self.listing.setText(text)
        self.listing.setToolTip("")

    def _show(self) -> None:
        if not self.texts:
            self.listing.setText("none: select words of the prompt and pin them, or write a needle item")
            self.listing.setToolTip("")
            return
        cut = [t if len(t) <= LABEL_CHARS else t[: LABEL_CHARS - 1] + "…" for t in self.texts]
        self.listing.setText("; ".join(f"“{c.strip()}”" for c in cut))
        self.listing.setToolTip("\n\n".join(self.texts))
