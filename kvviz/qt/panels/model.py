"""Model chooser: default, tiny, a folder, a .gguf file or a hub id, or a vLLM server; load progress; the card."""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from kvviz.present import model_card_rows

BUILTIN = ("default", "tiny")


class ModelPanel(QGroupBox):
    sigLoadRequested = Signal(str)
    sigServerRequested = Signal(str)  # a server's URL ("" when none was typed): the window's server mode
    sigBrowseRequested = Signal(bool)  # choose a model folder (True) or a .gguf file (False): File's dialogs ask

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Model", parent)
        self.spec = QComboBox()
        self.spec.setEditable(True)
        self.spec.addItems(BUILTIN)
        self.spec.lineEdit().setPlaceholderText("default, tiny, a folder, a .gguf file, a hub id or a server URL")
        self.spec.setToolTip(
            "default: SmolLM2-135M-Instruct (embedded)\ntiny: a random 4-layer Llama (instant, for trying things)\n"
            "or a model folder, a .gguf file, or a Hugging Face hub id such as org/name\n"
            "or a vLLM server's address such as http://127.0.0.1:8000 (connects to it)"
        )
        self.spec.lineEdit().returnPressed.connect(self._request)
        self.spec.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.spec.setMinimumContentsLength(12)  # a long model path must not widen the Controls
        self.folder_button = QPushButton("Folder…")
        self.folder_button.setToolTip("Choose a Hugging Face model folder")
        self.folder_button.clicked.connect(lambda *_: self.sigBrowseRequested.emit(True))
        self.file_button = QPushButton("GGUF…")
        self.file_button.setToolTip("Choose a .gguf file")
        self.file_button.clicked.connect(lambda *_: self.sigBrowseRequested.emit(False))
        self.server_button = QPushButton("Server…")
        self.server_button.setToolTip("Connect to a vLLM server and watch its KV cache, requests and latency")
        self.server_button.clicked.connect(lambda *_: self.sigServerRequested.emit(""))
        self.load_button = QPushButton("Load")
        self.load_button.clicked.connect(self._request)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setMaximumHeight(8)
        self.progress.hide()
        self.status, self.card = status_and_card("no model loaded")
        # Chosen once, seldom changed: once a model has loaded the chooser and the card fold away behind the
        # status line, so the Controls fit a 720-pixel-high screen; the arrow unfolds them.
        self.body = QWidget()
        self.fold_button = Fold(self.body, "Show or hide the model chooser and the model card")

        row = QHBoxLayout()
        row.addWidget(self.spec, 1)
        row.addWidget(self.load_button)
        buttons = QHBoxLayout()
        buttons.addWidget(self.folder_button)
        buttons.addWidget(self.file_button)
        buttons.addWidget(self.server_button)
        buttons.addStretch(1)
        body = QVBoxLayout(self.body)
        body.setContentsMargins(0, 0, 0, 0)
        body.setSpacing(4)
        body.addLayout(row)
        body.addLayout(buttons)
        body.addWidget(self.card)
        status_row = QHBoxLayout()
        status_row.setSpacing(2)
        status_row.addWidget(self.fold_button, 0, Qt.AlignmentFlag.AlignTop)
        status_row.addWidget(self.status, 1)
        layout = QVBoxLayout(self)
        layout.setSpacing(4)
        layout.addLayout(status_row)
        layout.addWidget(self.progress)
        layout.addWidget(self.body)
        self.card.hide()  # until a model is loaded
        self.fold_button.unfold(True)

    def current_spec(self) -> str:
        return self.spec.currentText().strip() or "default"

    def set_spec(self, spec: str) -> None:
        if self.spec.findText(spec) < 0:
            self.spec.addItem(spec)
        self.spec.setCurrentText(spec)

    def _request(self) -> None:
        spec = self.current_spec()
        if spec.startswith(("http://", "https://")):
            self.sigServerRequested.emit(spec)
        else:
            self.sigLoadRequested.emit(spec)

    def choose(self, path: str) -> None:
        """A model folder or .gguf file chosen: shown in the chooser and loaded."""
        self.set_spec(path)
        self._request()

    # -- state shown ---------------------------------------------------------------------------------

    def set_loading(self, message: str, fraction: float | None) -> None:
        self.progress.show()
        if fraction is None:
            self.progress.setRange(0, 0)  # busy indicator
        else:
            self.progress.setRange(0, 100)
            self.progress.setValue(int(round(100 * max(0.0, min(1.0, fraction)))))
        self.status.setText(message)
        self.load_button.setEnabled(False)

    def set_loaded(self, card: dict[str, Any]) -> None:
        self.progress.hide()
        self.load_button.setEnabled(True)
        self.status.setText(f"loaded {card.get('name') or 'a model'}")
        self.status.setToolTip(card_summary(card))
        self.card.setText(card_html(card))
        self.card.show()
        self.fold_button.unfold(False)

    def set_failed(self, message: str) -> None:
        self.progress.hide()
        self.load_button.setEnabled(True)
        self.status.setText("loading failed (see the message above the plots)")
        self.card.hide()
        self.fold_button.unfold(True)
        del message


class Fold(QToolButton):
    """An arrow before a status line that shows or folds away a body of settings (the model's, the server's)."""

    def __init__(self, body: QWidget, tooltip: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.body = body
        self.setObjectName("fold")
        self.setCheckable(True)
        self.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        self.setToolTip(tooltip)
        self.toggled.connect(self._show)
        self._show(False)

    def unfold(self, shown: bool) -> None:
        self.setChecked(shown)
        self._show(shown)

    def _show(self, shown: bool) -> None:
        self.setArrowType(Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow)
        self.body.setVisible(shown)


def status_and_card(status: str) -> tuple[QLabel, QLabel]:
    """A muted status line and a selectable rich-text card under it (the model's or the server's)."""
    label = QLabel(status)
    label.setObjectName("muted")
    label.setWordWrap(True)
    card = QLabel()
    card.setTextFormat(Qt.TextFormat.RichText)
    card.setWordWrap(True)
    card.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label, card


def card_summary(card: dict[str, Any]) -> str:
    """The model's name and the two numbers that size its cache, on one line."""
    parts = [str(card.get("name") or "a model")]
    if card.get("num_layers") is not None:
        parts.append(f"{card['num_layers']} layers")
    per_token = card.get("kv_bytes_per_token")
    if isinstance(per_token, int | float):
        parts.append(f"{per_token / 1024:.1f} KiB KV/token")
    return " · ".join(parts)


def card_html(card: dict[str, Any]) -> str:
    """The model card (kvviz.present.model_card_rows, as `kvviz model` prints it) as a small table."""
    return card_table(model_card_rows(card))


def card_table(rows: list[tuple[str, Any]]) -> str:
    """(label, value) rows as the cards' rich text: labels plain, values bold."""
    body = "".join(
        f"<tr><td style='padding-right:8px'>{html.escape(str(k))}</td><td><b>{html.escape(str(v))}</b></td></tr>"
        for k, v in rows
    )
    return f"<table cellspacing='0'>{body}</table>"
