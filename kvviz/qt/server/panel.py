"""Controls of the "vLLM server" mode: where the server is, how to predict its KV bytes, and a bounded load."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kvviz.attach.load import MAX_CONCURRENCY, MAX_REQUESTS
from kvviz.attach.metrics import allocated_bytes_per_token
from kvviz.attach.poller import base_url
from kvviz.attach.request_trace import model_label
from kvviz.present import UNKNOWN, mib
from kvviz.qt.panels.model import Fold, card_table, status_and_card

DTYPES = ("auto", "bfloat16", "float16", "float32")


class ServerPanel(QGroupBox):
    """URL, polling interval and Connect / Disconnect; the connected server's cache card."""

    sigConnectRequested = Signal(str, float)  # url, interval
    sigDisconnectRequested = Signal()
    sigFolderRequested = Signal()  # choose the served model's folder: File's dialogs ask

    def __init__(self, parent: QWidget | None = None):
        super().__init__("vLLM server", parent)
        self.url = QComboBox()
        self.url.setEditable(True)
        self.url.lineEdit().setPlaceholderText("http://127.0.0.1:8000")
        self.url.setToolTip("The server's address: host:port, or its /v1 or /metrics URL")
        self.url.lineEdit().returnPressed.connect(self._connect_clicked)
        self.connect_button = QPushButton("Connect")
        self.connect_button.clicked.connect(self._connect_clicked)
        self.interval = QDoubleSpinBox()
        self.interval.setRange(0.1, 10.0)
        self.interval.setSingleStep(0.1)
        self.interval.setValue(0.5)
        self.interval.setSuffix(" s")
        self.interval.setToolTip("Seconds between scrapes of the server's /metrics")
        self.model_dir = QLineEdit()
        self.model_dir.setPlaceholderText("the served model's folder (optional)")
        self.model_dir.setToolTip(
            "kvviz predicts the KV bytes per token from this folder's config.json and shows it next to what "
            "the server allocated. Not needed when the server's model id is a local folder."
        )
        browse = QPushButton("…")
        browse.setToolTip("Choose the served model's folder")
        browse.clicked.connect(lambda *_: self.sigFolderRequested.emit())
        self.dtype = QComboBox()
        self.dtype.addItems(DTYPES)
        self.dtype.setToolTip("The server's --dtype, for the prediction (auto: the checkpoint's)")
        self.status, self.card = status_and_card("not connected")
        # once attached, the settings and the card fold away behind the status line (room for the prompt and
        # the load set at 720 pixels high); the arrow unfolds them
        self.body = QWidget()
        self.fold_button = Fold(self.body, "Show or hide the polling settings and the server's cache card")

        row = QHBoxLayout()
        row.addWidget(self.url, 1)
        row.addWidget(self.connect_button)
        folder = QHBoxLayout()
        folder.addWidget(self.model_dir, 1)
        folder.addWidget(browse)
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("poll every", self.interval)
        form.addRow("config", folder)
        form.addRow("dtype", self.dtype)
        body = QVBoxLayout(self.body)
        body.setContentsMargins(0, 0, 0, 0)
        body.addLayout(form)
        body.addWidget(self.card)
        status_row = QHBoxLayout()
        status_row.setSpacing(2)
        status_row.addWidget(self.fold_button, 0, Qt.AlignmentFlag.AlignTop)
        status_row.addWidget(self.status, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 6)
        layout.setSpacing(4)
        layout.addLayout(row)
        layout.addLayout(status_row)
        layout.addWidget(self.body)
        self.fold_button.unfold(True)
        self._connected = False

    def current_url(self) -> str:
        return self.url.currentText().strip()

    def set_url(self, url: str) -> None:
        if url and self.url.findText(url) < 0:
            self.url.addItem(url)
        self.url.setCurrentText(url)

    def _connect_clicked(self) -> None:
        if self._connected:
            self.sigDisconnectRequested.emit()
        else:
            self.sigConnectRequested.emit(self.current_url(), self.interval.value())

    # -- state shown ---------------------------------------------------------------------------------

    def set_connecting(self, url: str) -> None:
        self.status.setText(f"connecting to {url}…")
        self.connect_button.setEnabled(False)

    def set_connected(self, connected: bool, text: str) -> None:
        self._connected = connected
        self.connect_button.setEnabled(True)
        self.connect_button.setText("Disconnect" if connected else "Connect")
        for widget in (self.url, self.interval, self.model_dir, self.dtype):
            widget.setEnabled(not connected)
        self.status.setText(text)
        self.fold_button.unfold(not connected)

    def show_session(self, session) -> None:
        self.card.setText(cache_html(session.model, session.cache, session.prediction))


def check_url(text: str) -> str | None:
    """A problem with a typed server address, or None if it can be tried."""
    if not text:
        return "Type the server's address first, for example http://127.0.0.1:8000."
    url = base_url(text)
    if not url.startswith(("http://", "https://")):
        return f"{text!r} is not an http(s) address; type one such as http://127.0.0.1:8000."
    return None


def cache_html(model: str | None, cache: dict[str, Any], prediction: dict[str, Any] | None) -> str:
    """The server's cache configuration and the bytes-per-token check, as a small table."""
    tokens, memory = cache.get("kv_cache_size_tokens"), cache.get("kv_cache_memory_bytes")
    allocated = allocated_bytes_per_token(cache)
    rows = [
        ("model", model_label(model) or UNKNOWN),
        ("cache size", f"{tokens:,} tokens" if isinstance(tokens, int | float) else UNKNOWN),
        ("cache memory", mib(memory, 0) if isinstance(memory, int | float) else UNKNOWN),
        ("block size", cache.get("block_size", UNKNOWN)),
        ("cache dtype", cache.get("cache_dtype", UNKNOWN)),
        ("prefix caching", {True: "on", False: "off"}.get(cache.get("enable_prefix_caching"), UNKNOWN)),
        ("allocated / token", f"{allocated:,.1f} B" if allocated else UNKNOWN),
    ]
    if prediction:
        ratio = prediction.get("ratio")
        rows.append(("predicted / token", f"{prediction['predicted_bytes_per_token']:,} B ({prediction['dtype']})"))
        rows.append(("allocated ÷ predicted", f"{ratio:.4f}" if ratio else UNKNOWN))
    else:
        rows.append(("predicted / token", f"{UNKNOWN} (choose the model's folder to predict)"))
    return card_table(rows)


class LoadPanel(QGroupBox):
    """N requests at concurrency C within S seconds, with an optional shared prefix."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Load", parent)
        self.requests = QSpinBox()
        self.requests.setRange(1, MAX_REQUESTS)
        self.requests.setValue(16)
        self.concurrency = QSpinBox()
        self.concurrency.setRange(1, MAX_CONCURRENCY)
        self.concurrency.setValue(4)
        self.duration = QDoubleSpinBox()
        self.duration.setRange(1.0, 3600.0)
        self.duration.setValue(60.0)
        self.duration.setSuffix(" s")
        self.duration.setToolTip("No request starts after this; requests still streaming are given only the time left")
        self.prefix = QLineEdit()
        self.prefix.setPlaceholderText("text every load prompt starts with (optional)")
        self.prefix.setToolTip(
            "vLLM reuses cached blocks of a shared prefix and counts prefix-cache hits; it matches whole "
            "blocks, so the prefix must be longer than one block (block size, often 128 tokens)"
        )
        self.ignore_eos = QCheckBox("ignore end of text")
        self.ignore_eos.setChecked(True)
        self.ignore_eos.setToolTip(
            "Ask the server to ignore end-of-sequence (vLLM's ignore_eos), so every request holds its cache "
            "for as long as it is asked to; otherwise a model may stop after a few tokens"
        )
        form = QFormLayout(self)
        form.addRow("requests", self.requests)
        form.addRow("concurrency", self.concurrency)
        form.addRow("at most", self.duration)
        form.addRow("shared prefix", self.prefix)
        form.addRow("", self.ignore_eos)

    def values(self) -> dict[str, Any]:
        return {
            "requests": self.requests.value(),
            "concurrency": self.concurrency.value(),
            "duration": self.duration.value(),
            "shared_prefix": self.prefix.text(),
            "ignore_eos": self.ignore_eos.isChecked(),
        }

    def set_values(self, values: dict[str, Any]) -> None:
        for key, box in (("requests", self.requests), ("concurrency", self.concurrency), ("duration", self.duration)):
            if isinstance(values.get(key), int | float):
                box.setValue(type(box.value())(values[key]))
        if isinstance(values.get("shared_prefix"), str):
            self.prefix.setText(values["shared_prefix"])
        if isinstance(values.get("ignore_eos"), bool):
            self.ignore_eos.setChecked(values["ignore_eos"])
