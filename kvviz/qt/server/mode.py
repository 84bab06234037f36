"""The window's "vLLM server" mode: its controls, its plots, and kvviz's own requests as runs.

`ServerMode` owns the `ServerConnection` and its widgets: `panel` (where the server is) above the shared prompt and
generation settings and `load_panel` below them in its Controls, `buttons` under them, `view` as the central
"vLLM server" tab. Scrapes arrive as queued signals and go into a `ServerSeries`; the plots redraw
from it on the window's redraw timer (`sigChanged` asks for one). kvviz's own requests become runs in
the run store (see kvviz.attach.request_trace), so they share the latency plot and token view with
local runs: each arrived token is a record appended to the request's trace.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from kvviz.attach.request_trace import model_label, record_trace, token_step
from kvviz.attach.session import Session
from kvviz.present import FAILED, FINISHED, STREAMING, final_status
from kvviz.qt.mode_api import FileEntry, Mode, ModeHost
from kvviz.qt.plots import LatencyPlot
from kvviz.qt.server.connection import ServerConnection
from kvviz.qt.server.help import HELP
from kvviz.qt.server.panel import LoadPanel, ServerPanel, cache_html, check_url
from kvviz.qt.server.plots import PrefixHitPlot, RequestsPlot, ServerLatencyPlot, ThroughputPlot, UsagePlot
from kvviz.qt.server.series import ServerSeries
from kvviz.qt.window_settings import stored_json


class ServedLatencyPlot(LatencyPlot):
    title = "Per-token latency: own requests and local runs"


class ServerView(QWidget):
    """The central "vLLM server" tab: a summary line above six plots."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.summary = QLabel("Not connected. Type a server's address under Controls ▸ vLLM server and Connect.")
        self.summary.setObjectName("serverSummary")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.usage_plot = UsagePlot()
        self.requests_plot = RequestsPlot()
        self.latency_plot = ServedLatencyPlot()
        self.percentile_plot = ServerLatencyPlot()
        self.throughput_plot = ThroughputPlot()
        self.prefix_plot = PrefixHitPlot()
        self.time_plots = [
            self.usage_plot,
            self.requests_plot,
            self.percentile_plot,
            self.throughput_plot,
            self.prefix_plot,
        ]
        self.requests_plot.plot.setXLink(self.usage_plot.plot)
        self.throughput_plot.plot.setXLink(self.usage_plot.plot)
        self.prefix_plot.plot.setXLink(self.usage_plot.plot)
        self.percentile_plot.plot.setXLink(self.usage_plot.plot)
        grid = QGridLayout()
        grid.setSpacing(6)
        for i, plot in enumerate(
            [
                self.usage_plot,
                self.requests_plot,
                self.latency_plot,
                self.percentile_plot,
                self.throughput_plot,
                self.prefix_plot,
            ]
        ):
            grid.addWidget(plot, i // 2, i % 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 0)
        layout.addWidget(self.summary)
        layout.addLayout(grid, 1)

    @property
    def plots(self):
        return [*self.time_plots, self.latency_plot]

    def redraw(self, series: ServerSeries) -> None:
        for plot in self.time_plots:
            plot.redraw_server(series)


class ServerMode(Mode):
    key = "server"
    title = "vLLM server"
    short_title = "Server"
    tip = "A vLLM server's cache, watched: usage, requests, latency, prefix hits; and its replies timed"
    formats = (Session,)
    help = HELP

    def __init__(self, host: ModeHost):
        super().__init__(host)
        self.store = host.store
        self.connection = ServerConnection(self)
        self.series = ServerSeries()
        self.source = ""  # what the view shows: a server's URL, or a session file
        self.run_of: dict[int, int] = {}  # request key -> run id
        self._last_token: dict[int, object] = {}  # request key -> its latest TokenTiming
        self.panel = ServerPanel()
        self.load_panel = LoadPanel()
        self.view = ServerView()
        self.send_button = QPushButton("Send prompt")
        self.send_button.setObjectName("runButton")
        self.send_button.setToolTip("Stream the prompt above through the server and time every token")
        self.send_button.clicked.connect(lambda *_: self.send_prompt())
        self.load_button = QPushButton("Start load")
        self.load_button.setToolTip("Send the load set below, to watch usage climb and prefix hits appear")
        self.load_button.clicked.connect(lambda *_: self.start_load())
        self.stop_button = QPushButton("Stop load")
        self.stop_button.clicked.connect(self.connection.stop_load)
        self.buttons = QWidget()
        row = QHBoxLayout(self.buttons)
        row.setContentsMargins(9, 0, 9, 0)
        row.addWidget(self.send_button, 2)
        row.addWidget(self.load_button, 1)
        row.addWidget(self.stop_button, 1)
        panels = host.panels
        self.controls = [self.panel, panels.prompt_panel, panels.settings_panel, self.load_panel]
        self.file_entries = (FileEntry("session", "Save se&rver session…", self._ask_save),)
        self._dirty = False
        self._header = ""
        self._cache: dict = {}
        self._prediction: dict | None = None

        self.panel.sigConnectRequested.connect(self.connect_to)
        self.panel.sigDisconnectRequested.connect(self.disconnect)
        c = self.connection
        c.sigConnected.connect(self._on_connected)
        c.sigPrediction.connect(self._on_prediction)
        c.sigConnectFailed.connect(self._on_connect_failed)
        c.sigPoint.connect(self._on_point)
        c.sigNotice.connect(self._on_notice)
        c.sigRequestStarted.connect(self._on_request_started)
        c.sigToken.connect(self._on_token)
        c.sigRequestDone.connect(self._on_request_done)
        c.sigLoadDone.connect(self._on_load_done)
        # the model chooser's "Server…" (and its URL typed there): this mode comes on screen and connects
        panels.model_panel.sigServerRequested.connect(self.connect_requested)
        self.panel.sigFolderRequested.connect(self._ask_model_folder)
        host.model.worker.sigReady.connect(self._on_engine_ready)
        self._update_buttons()

    def connect_requested(self, url: str) -> None:
        """The model chooser's "Connect to a server" (and `kvviz --connect`): a URL given connects at once."""
        self.host.show(self)
        if url:
            self.connect_to(url)
        else:
            self.panel.url.setFocus()

    def _ask_model_folder(self) -> None:
        """The served model's folder (for the bytes per token kvviz predicts)."""
        path = self.host.dialogs.folder("models", "The served model's folder")
        if path:
            self.panel.model_dir.setText(path)

    def _on_engine_ready(self, listing) -> None:
        self.connection.engine_ready.set()  # the worker has imported the engine: predictions may import it too

    # -- actions --------------------------------------------------------------------------------------

    def connect_to(self, url: str, interval: float | None = None) -> bool:
        problem = check_url(url)
        if problem:
            self.host.show_error(problem)
            return False
        self.panel.set_url(url)
        self.panel.set_connecting(url)
        interval = interval if interval is not None else self.panel.interval.value()
        self.connection.connect_to(url, interval, self.panel.model_dir.text(), self.panel.dtype.currentText())
        self.host.update_controls()
        return True

    def disconnect(self) -> None:
        self.connection.disconnect()
        self.panel.set_connected(False, f"disconnected from {self.source}; what was collected is kept")
        self.host.update_controls()

    def send_prompt(self) -> int | None:
        prompt = self.host.panels.prompt_panel.text()
        if not prompt.strip():
            self.host.show_error("Type a prompt first.")
            return None
        settings = self.host.panels.settings_panel.settings()
        return self.connection.send_prompt(prompt, settings["max_new_tokens"], settings["temperature"])

    def start_load(self) -> bool:
        values = self.load_panel.values()
        max_tokens = self.host.panels.settings_panel.settings()["max_new_tokens"]
        started = self.connection.start_load(max_tokens=max_tokens, **values)
        if started:
            self.panel.status.setText(
                f"load: {values['requests']} requests at concurrency {values['concurrency']}, "
                f"at most {values['duration']:g} s"
            )
        self.host.update_controls()
        return started

    def save(self, path: str | os.PathLike) -> Path | None:
        """File ▸ Save server session: everything collected (the `kvviz attach --out` format); None (and a message
        saying why) when not connected or it cannot be written."""
        session = self.connection.session()
        if session is None:
            self.host.tell("Nothing to save", "Connect to a vLLM server first (Controls ▸ vLLM server).")
            return None
        return self.host.write("the session", lambda: session.save(path), path)

    def _ask_save(self) -> None:
        path = self.host.dialogs.save_file("kept", "Save server session", "server.kvviz-attach.json",
                                           "kvviz sessions (*.json)")
        if path:
            self.save(path)

    def open(self, session: Session) -> Session:
        """Show a saved session: its plots again, its own requests as runs. Disconnects first."""
        if self.connection.connected:
            self.disconnect()
        self.source = session.url
        self.series.clear()
        self.series.extend(session.points())
        self.panel.show_session(session)
        self.panel.set_connected(False, f"opened a session of {session.url} ({len(session.snapshots)} scrapes)")
        for record in session.requests:
            if record.tag == "own":
                trace = record_trace(session.url, session.model, record)
                self.store.add(trace, final_status(trace))
        self._summarise(session.model, session.url, opened=True)
        self._dirty = True
        self.sigChanged.emit()
        return session

    # -- from the connection ---------------------------------------------------------------------------

    def _on_connected(self, session) -> None:
        self.source = session.url
        self.series.clear()
        self._cache, self._prediction = session.cache, session.prediction
        self.panel.set_connected(True, f"attached to {session.url}; polling /metrics")
        self.panel.show_session(session)
        self.host.hide_error()
        for _, message in session.errors:
            self.host.show_error(message)
        self._summarise(session.model, session.url)
        self.host.update_controls()

    def _on_prediction(self, prediction: dict) -> None:
        session = self.connection.session()
        if session is not None:
            self._prediction = prediction
            self.panel.card.setText(cache_html(session.model, self._cache, prediction))

    def _on_connect_failed(self, url: str, message: str) -> None:
        self.panel.set_connected(False, "not connected")
        self.host.show_error(f"Could not attach to {url}: {message}")
        self.host.update_controls()

    def _on_point(self, snapshot, point) -> None:
        if point is not None:
            self.series.add(point)
            if snapshot.cache and snapshot.cache != self._cache:  # a restart may bring a new cache size
                self._cache = snapshot.cache
                self.panel.card.setText(cache_html(snapshot.model, snapshot.cache, self._prediction))
            self._dirty = True
            self.sigChanged.emit()

    def _on_notice(self, message: str, is_error: bool) -> None:
        if is_error:
            self.host.show_error(f"{self.source}: {message}")
        else:
            self.host.note(message, 10_000)

    def _on_request_started(self, key: int, trace) -> None:
        self.run_of[key] = self.store.add(trace, STREAMING, overlay=True)
        self.host.update_controls()

    def _on_token(self, key: int, timing) -> None:
        run_id = self.run_of.get(key)
        if run_id is None:
            return
        # this mode is the request trace's producer: the arrived token is its next record
        self.store.runs[run_id].trace.steps.append(token_step(timing, self._last_token.get(key)))
        self.store.records_arrived(run_id)
        self._last_token[key] = timing

    def _on_request_done(self, key: int, record) -> None:
        run_id = self.run_of.pop(key, None)
        self._last_token.pop(key, None)
        if run_id is None:
            return
        self.store.end(run_id, FAILED if record.error else FINISHED, error=record.error)
        if record.error:
            self.host.show_error(f"kvviz's own request to {self.source} failed: {record.error}")
        elif not record.tokens:
            self.host.show_error(
                f"The server returned no text for this prompt (finish reason {record.finish_reason!r}). Its "
                "completions endpoint takes the prompt as raw text, and an instruct model may end at once: "
                'end the prompt mid-sentence, for example "The key-value cache of a transformer".'
            )
        self.host.update_controls()

    def _on_load_done(self, summary) -> None:
        self.panel.status.setText(
            f"load done: {summary['completed']} of {summary['requested']} completed, {summary['failed']} failed, "
            f"{summary['not_started']} not started, {summary['wall_s']:.1f} s"
        )
        if summary["errors"]:
            self.host.show_error(f"Load on {self.source}: {summary['errors'][0]}")
        self.host.update_controls()

    # -- drawing --------------------------------------------------------------------------------------

    def redraw_parts(self) -> list:
        """Its plots of the scrapes, then the latency of its own requests beside the local runs (which names the runs
        itself: the runs' legend beside the tabs is the local view's)."""
        store = self.host.store
        shown, primary = store.shown_series(), store.primary()
        return [self._draw, lambda: self.view.latency_plot.draw_frame(shown, primary)]

    def _draw(self) -> None:
        if self._dirty:
            self._dirty = False
            self.view.redraw(self.series)
            self._summarise_live()

    def plots(self) -> list:
        return self.view.plots

    def restyle(self, palette) -> None:
        for plot in self.view.plots:
            plot.apply_palette(palette)
            if hasattr(plot, "restyle"):
                plot.restyle()

    def _summarise(self, model, url, opened: bool = False) -> None:
        self._header = f"<b>{model_label(model) or '?'}</b> at {url}" + (
            " (opened from a session file)" if opened else ""
        )
        self.view.summary.setText(self._header)

    def _summarise_live(self) -> None:
        point = self.series.latest
        if point is None:
            return
        parts = [self._header]
        if point.usage is not None:
            parts.append(f"KV cache {point.usage:.1%}")
        if point.usage_tokens is not None:
            parts.append(f"{point.usage_tokens:,.0f} tokens")
        if point.running is not None:
            parts.append(f"{point.running:.0f} running, {point.waiting or 0:.0f} waiting")
        if point.prefix_hit_rate_total is not None:
            parts.append(f"prefix hits {point.prefix_hit_rate_total:.0%}")
        self.view.summary.setText(" · ".join(parts))

    def update_controls(self, ready: bool) -> None:
        self._update_buttons()

    def can_start(self) -> bool:
        return self.send_button.isEnabled()

    def start(self, extra_settings=None) -> int | None:
        """Run ▸ Run (Ctrl+Enter) sends the prompt to the server."""
        return self.send_prompt()

    def _update_buttons(self) -> None:
        c = self.connection
        self.send_button.setEnabled(c.connected)
        self.load_button.setEnabled(c.connected and not c.load_running)
        self.stop_button.setEnabled(c.load_running)

    # -- settings and closing ------------------------------------------------------------------------

    def restore_settings(self, settings) -> None:
        self.panel.set_url(str(settings.value("server/url", "")))
        self.panel.model_dir.setText(str(settings.value("server/model_dir", "")))
        self.load_panel.set_values(stored_json(settings.value("server/load"), {}))

    def save_settings(self, settings) -> None:
        settings.setValue("server/url", self.panel.current_url())
        settings.setValue("server/model_dir", self.panel.model_dir.text())
        settings.setValue("server/load", json.dumps(self.load_panel.values()))

    def shutdown(self) -> None:
        self.connection.shutdown()
