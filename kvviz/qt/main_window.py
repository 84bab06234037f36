"""The kvviz main window: controls on the left, live plots in the middle, tokens and runs around them.

Data flow: the worker (own thread) emits records -> `_on_step` appends them to a pending list ->
a single-shot timer (at most ~30 redraws/s, only when something changed) moves them into the
run's numpy buffers and calls each plot's `redraw`. Runs are kept as `RunSeries` (a `Trace` plus
buffers), so a run opened from a trace file is drawn by the same code as a live one.
"""

from __future__ import annotations

import json
import time
from typing import Any

import psutil
from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QDockWidget,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPushButton,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QTabBar,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from kvviz.attach.request_trace import is_served
from kvviz.qt import theme
from kvviz.qt.panels.generation import PromptPanel, SettingsPanel
from kvviz.qt.panels.model import ModelPanel
from kvviz.qt.panels.runs import RunsTable
from kvviz.qt.panels.strategy import StrategyPanel
from kvviz.qt.panels.tokens import TokenView
from kvviz.qt.plots import CacheMapPlot, FidelityPlot, LatencyPlot, LayerBytesPlot, LayerTimePlot, MemoryPlot
from kvviz.qt.plots.base import PaintClock
from kvviz.qt.series import MIB, RunSeries
from kvviz.qt.server_mode import ServerMode
from kvviz.qt.worker import Worker, WorkerThread
from kvviz.trace import Trace

REDRAW_INTERVAL_MS = 1000.0 / 30.0  # at most ~30 redraws a second
REDRAW_BUDGET = 0.10  # and at most this share of wall time spent redrawing and painting
DEFAULT_PROMPT = "Explain in a few sentences what the key-value cache of a transformer does."


class MainWindow(QMainWindow):
    sigRequestLoad = Signal(str, str, str)  # to the worker: spec, dtype, device
    sigRequestRun = Signal(int, object)  # to the worker: run id, request dict
    sigRequestAdopt = Signal(object)  # to the worker: a LoadedModel
    sigModelReady = Signal(str, bool)  # spec, loaded (False: failed); after the window updated
    sigRunDone = Signal(int, str)  # run id, status; after the final redraw

    def __init__(self, settings: QSettings | None = None, autoload: str | None = None, parent=None):
        super().__init__(parent)
        self.setWindowTitle("kvviz: the key-value cache, live")
        self.settings = settings if settings is not None else QSettings("kvviz", "kvviz")
        self.runs: dict[int, RunSeries] = {}
        self.status_of: dict[int, str] = {}
        self.active_run: int | None = None
        self.shown_ids: list[int] = []
        self.card: dict[str, Any] | None = None
        self.loading = False
        self.thread_stuck = False
        self.last_error = ""
        self.redraw_count = 0
        self.last_redraw_ms = 0.0
        self.redraw_cost_ms = 0.0
        self._next_run = 1
        self._pending: dict[int, list] = {}
        self._dirty_rows: set[int] = set()
        self._last_redraw = 0.0
        self._last_table = 0.0
        self._last_layer_redraw = 0.0
        self._closing = False
        self._process = psutil.Process()
        self._rss_mib = self._process.memory_info().rss / MIB

        self._redraw_timer = QTimer(self)
        self._redraw_timer.setSingleShot(True)
        self._redraw_timer.timeout.connect(self.redraw)
        self._rss_timer = QTimer(self)
        self._rss_timer.setInterval(1000)
        self._rss_timer.timeout.connect(self._sample_rss)
        self._rss_timer.start()
        self._build_widgets()
        self._build_menus()
        self._restore_settings()

        self.worker = Worker()
        self.thread = WorkerThread(self.worker)
        self.worker.sigReady.connect(self._on_ready)
        self.worker.sigLoadProgress.connect(self._on_load_progress)
        self.worker.sigModelLoaded.connect(self._on_model_loaded)
        self.worker.sigModelFailed.connect(self._on_model_failed)
        self.worker.sigRunStarted.connect(self._on_run_started)
        self.worker.sigStep.connect(self._on_step)
        self.worker.sigRunFinished.connect(self._on_run_finished)
        self.worker.sigRunFailed.connect(self._on_run_failed)
        self.sigRequestLoad.connect(self.worker.load)
        self.sigRequestRun.connect(self.worker.run)
        self.sigRequestAdopt.connect(self.worker.adopt)
        self.thread.start()
        self._update_controls()
        if autoload:
            self.load_model(autoload)
        from kvviz.qt.file_actions import install_file_actions  # noqa: I001 - File menu, drops, Record

        install_file_actions(self)

    # -- building ------------------------------------------------------------------------------------

    def _build_widgets(self) -> None:
        self.model_panel = ModelPanel()
        self.model_panel.sigLoadRequested.connect(self.load_model)
        self.prompt_panel = PromptPanel()
        self.settings_panel = SettingsPanel()
        self.strategy_panel = StrategyPanel()
        self.run_button = QPushButton("Run")
        self.run_button.setObjectName("runButton")
        self.run_button.setToolTip("Run (Ctrl+Enter)")
        self.run_button.clicked.connect(lambda *_: self.start_run())
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop after the current step, keeping what was generated (Esc)")
        self.stop_button.clicked.connect(self.stop_run)
        self.switch_button = QPushButton("Switch")
        self.switch_button.setToolTip(
            "Convert the running generation's cache to the strategy chosen above, at the next step"
        )
        self.switch_button.clicked.connect(lambda *_: self.switch_strategy())
        self.reference_box = QCheckBox("Compare with the exact cache (fidelity)")
        self.reference_box.setToolTip(
            "Run a full-precision DynamicCache reference in lockstep on the same tokens and plot KL divergence; "
            "its time is measured apart and not counted in tokens/s"
        )
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button, 2)
        buttons.addWidget(self.switch_button, 1)
        buttons.addWidget(self.stop_button, 1)

        # Local model or vLLM server: the prompt and settings are shared, the rest swaps with the mode.
        self.server = ServerMode(self)
        self.model_panel.sigServerRequested.connect(self.connect_server)
        self.source_tabs = QTabBar()
        self.source_tabs.addTab("Local model")
        self.source_tabs.addTab("vLLM server")
        self.source_tabs.setExpanding(True)
        self.source_tabs.setToolTip("Run a model here, or attach to a vLLM server and watch its cache")
        self._stacks = [QStackedWidget() for _ in range(3)]
        for stack, pages in zip(
            self._stacks,
            [(self.model_panel, self.server.panel), (self.strategy_panel, self.server.load_panel)],
            strict=False,
        ):
            for page in pages:
                stack.addWidget(page)
        controls = QWidget()
        controls.setObjectName("controls")
        column = QVBoxLayout(controls)
        column.addWidget(self._stacks[0])
        column.addWidget(self.prompt_panel)
        column.addWidget(self.settings_panel)
        column.addWidget(self._stacks[1])
        column.addStretch(0)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(controls)
        scroll.setMinimumWidth(330)
        # Run and Stop stay in view below the scrolling controls.
        dock_body = QWidget()
        dock_layout = QVBoxLayout(dock_body)
        dock_layout.setContentsMargins(0, 0, 0, 6)
        dock_layout.addWidget(self.source_tabs)
        dock_layout.addWidget(scroll, 1)
        local_buttons = QWidget()
        local_column = QVBoxLayout(local_buttons)
        local_column.setContentsMargins(0, 0, 0, 0)
        reference_row = QHBoxLayout()
        reference_row.setContentsMargins(12, 0, 9, 0)
        reference_row.addWidget(self.reference_box)
        local_column.addLayout(reference_row)
        local_column.addLayout(buttons)
        buttons.setContentsMargins(9, 0, 9, 0)
        self._stacks[2].addWidget(local_buttons)
        self._stacks[2].addWidget(self.server.buttons)
        dock_layout.addWidget(self._stacks[2])
        self.controls_dock = self._dock("Controls", dock_body, Qt.DockWidgetArea.LeftDockWidgetArea)

        self.memory_plot = MemoryPlot()
        self.latency_plot = LatencyPlot()
        self.cache_map = CacheMapPlot()
        self.layer_bytes_plot = LayerBytesPlot()
        self.layer_time_plot = LayerTimePlot()
        self.fidelity_plot = FidelityPlot()
        self.fidelity_plot.hide()  # shown while a run with a reference is on screen
        self.plots = [
            self.memory_plot,
            self.latency_plot,
            self.fidelity_plot,
            self.cache_map,
            self.layer_bytes_plot,
            self.layer_time_plot,
        ]
        self.latency_plot.plot.setXLink(self.memory_plot.plot)
        self.fidelity_plot.plot.setXLink(self.memory_plot.plot)

        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.latency_plot)
        right.addWidget(self.fidelity_plot)
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(self.memory_plot)
        top.addWidget(right)
        bottom = QSplitter(Qt.Orientation.Horizontal)
        bottom.addWidget(self.layer_bytes_plot)
        bottom.addWidget(self.layer_time_plot)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(top)
        self.splitter.addWidget(self.cache_map)
        self.splitter.addWidget(bottom)
        self.splitter.setChildrenCollapsible(False)
        self._splitters = {"main": self.splitter, "top": top, "bottom": bottom, "right": right}

        self.error_bar = QFrame()
        self.error_bar.setObjectName("errorBar")
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QToolButton()
        close.setText("✕")
        close.setToolTip("Dismiss")
        close.clicked.connect(self.error_bar.hide)
        bar = QHBoxLayout(self.error_bar)
        bar.setContentsMargins(10, 6, 6, 6)
        bar.addWidget(self.error_label, 1)
        bar.addWidget(close)
        self.error_bar.hide()

        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.error_bar)
        self.views = QTabWidget()
        self.views.setDocumentMode(True)
        self.views.addTab(self.splitter, "Local run")
        self.views.addTab(self.server.view, "vLLM server")
        layout.addWidget(self.views, 1)
        self.setCentralWidget(central)
        self.source_tabs.currentChanged.connect(self.set_mode)
        self.views.currentChanged.connect(self.set_mode)

        self.token_view = TokenView()
        self.token_view.setMinimumWidth(240)
        self.tokens_dock = self._dock("Tokens", self.token_view, Qt.DockWidgetArea.RightDockWidgetArea)
        self.runs_table = RunsTable()
        self.runs_table.sigSelectionChanged.connect(self._on_selection)
        self.runs_dock = self._dock("Runs", self.runs_table, Qt.DockWidgetArea.BottomDockWidgetArea)

        self.status_labels = {name: QLabel() for name in ("state", "device", "threads", "rate", "cache", "rss")}
        for name in ("device", "threads", "rate", "cache", "rss"):
            self.statusBar().addPermanentWidget(self.status_labels[name])
        self.statusBar().addWidget(self.status_labels["state"], 1)

    def _dock(self, title: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"dock{title}")
        dock.setWidget(widget)
        features = QDockWidget.DockWidgetFeature
        dock.setFeatures(features.DockWidgetMovable | features.DockWidgetFloatable | features.DockWidgetClosable)
        self.addDockWidget(area, dock)
        return dock

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")  # open, save and export: kvviz.qt.file_actions
        quit_action = QAction("&Quit", self)
        quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        quit_action.triggered.connect(self.close)
        file_menu.addAction(quit_action)

        run_menu = self.menuBar().addMenu("&Run")
        self.run_action = QAction("&Run", self)
        self.run_action.setShortcuts([QKeySequence("Ctrl+Return"), QKeySequence("Ctrl+Enter")])
        self.run_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.run_action.triggered.connect(lambda *_: self.start_run())
        self.stop_action = QAction("&Stop", self)
        self.stop_action.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        self.stop_action.triggered.connect(self.stop_run)
        run_menu.addAction(self.run_action)
        run_menu.addAction(self.stop_action)
        self.addAction(self.run_action)
        self.addAction(self.stop_action)

        view_menu = self.menuBar().addMenu("&View")
        themes = QActionGroup(self)
        self.theme_actions = {}
        for name in theme.THEMES:
            action = QAction(f"{name.title()} theme", self, checkable=True)
            action.triggered.connect(lambda _=False, n=name: self.set_theme(n))
            themes.addAction(action)
            view_menu.addAction(action)
            self.theme_actions[name] = action
        view_menu.addSeparator()
        for dock in (self.controls_dock, self.tokens_dock, self.runs_dock):
            view_menu.addAction(dock.toggleViewAction())

    # -- settings ------------------------------------------------------------------------------------

    def _restore_settings(self) -> None:
        s = self.settings
        self.model_panel.set_spec(str(s.value("model/spec", "default")))
        self.prompt_panel.set_text(str(s.value("prompt/text", DEFAULT_PROMPT)))
        self.settings_panel.set_state(_json(s.value("generation/state"), {}))
        self.strategy_panel.set_all_values(_json(s.value("strategy/values"), {}))
        self.strategy_panel._current = str(s.value("strategy/name", "dynamic"))
        self.server.panel.set_url(str(s.value("server/url", "")))
        self.server.panel.model_dir.setText(str(s.value("server/model_dir", "")))
        self.server.load_panel.set_values(_json(s.value("server/load"), {}))
        self.set_theme(str(s.value("view/theme", "dark")))
        geometry = s.value("window/geometry")
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)
        else:
            self.resize(1600, 1000)
        state = s.value("window/state")
        if isinstance(state, QByteArray) and not state.isEmpty():
            self.restoreState(state)
        for name, splitter in self._splitters.items():
            value = s.value(f"window/splitter_{name}")
            if isinstance(value, QByteArray) and not value.isEmpty():
                splitter.restoreState(value)
        if not isinstance(state, QByteArray) or state.isEmpty():
            self.resizeDocks([self.controls_dock, self.tokens_dock], [340, 300], Qt.Orientation.Horizontal)
            self.resizeDocks([self.runs_dock], [170], Qt.Orientation.Vertical)
            self.splitter.setSizes([300, 260, 220])

    def save_settings(self) -> None:
        s = self.settings
        s.setValue("model/spec", self.model_panel.current_spec())
        s.setValue("prompt/text", self.prompt_panel.text())
        s.setValue("generation/state", json.dumps(self.settings_panel.state()))
        s.setValue("strategy/values", json.dumps(self.strategy_panel.all_values()))
        if self.strategy_panel.current():
            s.setValue("strategy/name", self.strategy_panel.current())
        s.setValue("server/url", self.server.panel.current_url())
        s.setValue("server/model_dir", self.server.panel.model_dir.text())
        s.setValue("server/load", json.dumps(self.server.load_panel.values()))
        s.setValue("view/theme", self.theme_name)
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/state", self.saveState())
        for name, splitter in self._splitters.items():
            s.setValue(f"window/splitter_{name}", splitter.saveState())
        s.sync()

    def set_theme(self, name: str) -> None:
        if name not in theme.PALETTES:
            name = "dark"
        self.theme_name = name
        palette = theme.PALETTES[name]
        app = QApplication.instance()
        if app is not None:
            app.setStyleSheet(theme.stylesheet(name))
        for plot in self.plots + self.server.view.plots:
            plot.apply_palette(palette)
            if hasattr(plot, "restyle"):
                plot.restyle()
        self.cache_map._drawn = (None, -1)
        self.token_view.apply_palette(palette)
        if name in getattr(self, "theme_actions", {}):
            self.theme_actions[name].setChecked(True)
        self._schedule()

    # -- model ---------------------------------------------------------------------------------------

    def set_mode(self, index: int) -> None:
        """0: a local model; 1: a vLLM server. The controls and the central view follow together."""
        for widget in (self.source_tabs, self.views, *self._stacks):
            if widget.currentIndex() != index:
                widget.blockSignals(True)
                widget.setCurrentIndex(index)
                widget.blockSignals(False)
        self._schedule()

    def visible_plots(self) -> list:
        """The plots of the central view on screen: the local run's or the server's."""
        return self.server.view.plots if self.views.currentIndex() == 1 else self.plots

    def connect_server(self, url: str) -> None:
        """The model chooser's "Connect to a server" (and `kvviz --connect`): a URL given connects at once."""
        self.set_mode(1)
        if url:
            self.server.connect_to(url)
        else:
            self.server.panel.url.setFocus()

    def load_model(self, spec: str) -> None:
        if self.active_run is not None or self._closing:
            return
        self.loading = True
        self.model_panel.set_spec(spec)
        self.model_panel.set_loading(f"loading {spec}…", None)
        self._update_controls()
        self.sigRequestLoad.emit(spec, "auto", "auto")

    def adopt_model(self, loaded) -> None:
        """Use an already loaded model (engine.models.LoadedModel); the bench shares one."""
        self.loading = True
        self._update_controls()
        self.sigRequestAdopt.emit(loaded)

    def _on_ready(self, listing) -> None:
        self.server.connection.engine_ready.set()
        self.strategy_panel.set_strategies(listing)
        self._update_controls()

    def _on_load_progress(self, message: str, fraction) -> None:
        if self.loading:
            self.model_panel.set_loading(message, fraction)

    def _on_model_loaded(self, spec: str, card: dict) -> None:
        self.loading = False
        self.card = card
        self.model_panel.set_loaded(card)
        self.error_bar.hide()
        self._update_controls()
        self.sigModelReady.emit(spec, True)

    def _on_model_failed(self, spec: str, message: str) -> None:
        self.loading = False
        self.model_panel.set_failed(message)
        self.show_error(f"Could not load the model {spec!r}: {message}" if spec else message)
        self._update_controls()
        self.sigModelReady.emit(spec, False)

    # -- runs ----------------------------------------------------------------------------------------

    def start_run(self, extra_settings: dict[str, Any] | None = None) -> int | None:
        """Start a run with the current controls; returns its id, or None if it cannot start.

        extra_settings: further GenerationSettings fields (the bench passes stop_at_eos=False).
        """
        if not self.run_button.isEnabled():
            return None
        prompt = self.prompt_panel.text()
        if not prompt.strip():
            self.show_error("Type a prompt first.")
            return None
        strategy = self.strategy_panel.current()
        options = self.strategy_panel.values()
        settings = {**self.settings_panel.settings(), **(extra_settings or {})}
        run_id = self._next_run
        self._next_run += 1
        trace = Trace(
            model=dict(self.card or {}),
            strategy={"name": strategy, "options": options},
            prompt=prompt,
            settings=settings,
        )
        series = RunSeries(run_id, trace)
        self.runs[run_id] = series
        self.status_of[run_id] = "starting"
        self.active_run = run_id
        self.error_bar.hide()
        self.runs_table.add_run(series, "starting", select=True)
        self._update_controls()
        request = {"strategy": strategy, "options": options, "settings": settings, "prompt": prompt}
        request["reference"] = self.reference_box.isChecked()
        self.sigRequestRun.emit(run_id, request)
        return run_id

    def switch_strategy(self) -> bool:
        """Switch the running generation to the strategy and options chosen in the picker."""
        if self.active_run is None:
            return False
        strategy = self.strategy_panel.current()
        problem = self.worker.switch(strategy, self.strategy_panel.values())
        if problem:
            self.show_error(f"Cannot switch: {problem}")
            return False
        self.status_labels["state"].setText(f"switching to {strategy} at the next step…")
        return True

    def stop_run(self) -> None:
        if self.active_run is not None:
            self.worker.cancel(self.active_run)
            self.status_labels["state"].setText("stopping after this step…")

    def add_trace(self, trace: Trace) -> int:
        """Add a finished trace (e.g. opened from a file) to the Runs table."""
        run_id = self._next_run
        self._next_run += 1
        self.runs[run_id] = RunSeries.from_trace(run_id, trace)
        self.status_of[run_id] = _final_status(trace)
        self.runs_table.add_run(self.runs[run_id], self.status_of[run_id], select=True)
        return run_id

    def add_live_run(self, trace: Trace, status: str = "streaming") -> int:
        """A run filled from outside the worker (kvviz's own request to a server), added to the overlay."""
        run_id = self._next_run
        self._next_run += 1
        self.runs[run_id] = RunSeries(run_id, trace)
        self.status_of[run_id] = status
        self.runs_table.add_run(self.runs[run_id], status, select=False)
        self.runs_table.select_runs([*self.shown_ids, run_id])
        return run_id

    def show_kept(self, kept):
        """A trace opened from a file into the Runs table (returns its run id), or a server session into
        the server view (returns it)."""
        if isinstance(kept, Trace):
            return self.add_trace(kept)
        self.server.open_session(kept)
        self.set_mode(1)
        return kept

    def _on_run_started(self, run_id: int, header: Trace) -> None:
        series = self.runs.get(run_id)
        if series is None:
            return
        series.trace.prompt_tokens = header.prompt_tokens
        series.trace.model = header.model or series.trace.model
        series.trace.strategy = header.strategy or series.trace.strategy
        series.trace.settings = header.settings or series.trace.settings
        self.status_of[run_id] = "running"
        self._dirty_rows.add(run_id)
        self._schedule()

    def _on_step(self, run_id: int, step) -> None:
        if run_id not in self.runs or self.runs[run_id].finished:
            return  # stale
        self._pending.setdefault(run_id, []).append(step)
        self._schedule()

    def _on_run_finished(self, run_id: int, trace: Trace) -> None:
        self._end_run(run_id, trace, _final_status(trace))

    def _on_run_failed(self, run_id: int, message: str, trace) -> None:
        self.show_error(f"Run #{run_id} failed: {message}")
        self._end_run(run_id, trace, "failed")

    def _end_run(self, run_id: int, trace: Trace | None, status: str) -> None:
        series = self.runs.get(run_id)
        if series is None:
            return
        self._flush(run_id)
        if trace is not None:
            trace.prompt_tokens = trace.prompt_tokens or series.trace.prompt_tokens
            series.finish(trace)
        else:
            series.finished = True
        self.status_of[run_id] = status
        self._dirty_rows.add(run_id)
        if self.active_run == run_id:
            self.active_run = None
        self._update_controls()
        self.redraw()
        self.sigRunDone.emit(run_id, status)

    def _flush(self, run_id: int) -> None:
        steps = self._pending.pop(run_id, None)
        if steps:
            self.runs[run_id].extend(steps)
            self._dirty_rows.add(run_id)

    def _on_selection(self, run_ids: list[int]) -> None:
        self.shown_ids = [r for r in run_ids if r in self.runs]
        primary = self.primary()
        if primary is not self.token_view.series:
            self.token_view.show_run(primary)
        self._schedule()

    def primary(self) -> RunSeries | None:
        """The run the single-run views (bars, cache map, tokens) show."""
        if self.active_run in self.shown_ids:
            return self.runs[self.active_run]
        if self.shown_ids:
            return self.runs[self.shown_ids[-1]]
        return None

    # -- drawing -------------------------------------------------------------------------------------

    def _schedule(self) -> None:
        if self._closing or self._redraw_timer.isActive():
            return
        since = (time.perf_counter() - self._last_redraw) * 1000.0
        interval = max(REDRAW_INTERVAL_MS, self.redraw_cost_ms / REDRAW_BUDGET)
        self._redraw_timer.start(int(max(0.0, interval - since)))

    def redraw(self) -> None:
        """Move pending records into the buffers and update every view that changed."""
        if self._closing:
            return
        started = time.perf_counter()
        for run_id in list(self._pending):
            self._flush(run_id)
        shown = [self.runs[r] for r in self.shown_ids]
        primary = self.primary()
        if self.views.currentIndex() == 1:
            self.server.redraw()
            self.server.view.latency_plot.redraw(shown, primary)
        else:
            self._redraw_local(shown, primary, started)
        if primary is not None:
            self.token_view.update_tokens()
        # The row's numbers come from Trace.summary() (linear in the steps): twice a second is enough.
        if self._dirty_rows and (started - self._last_table >= 0.5 or self.active_run is None):
            for run_id in self._dirty_rows:
                self.runs_table.update_run(self.runs[run_id], self.status_of[run_id])
            self._dirty_rows.clear()
            self._last_table = started
        self._update_status()
        self._last_redraw = time.perf_counter()
        self.last_redraw_ms = (self._last_redraw - started) * 1000.0
        # cost of a frame: this update plus the painting of the previous one
        cost = self.last_redraw_ms + PaintClock.take()
        self.redraw_cost_ms = 0.7 * self.redraw_cost_ms + 0.3 * cost
        self.redraw_count += 1

    def _redraw_local(self, shown: list[RunSeries], primary: RunSeries | None, started: float) -> None:
        # Served runs have timings only: the latency plot shows them, the cache views do not.
        local = [r for r in shown if not is_served(r.trace)]
        local_primary = primary if primary in local else (local[-1] if local else None)
        # The per-layer views change little from one token to the next: 4 times a second is enough
        # while generating (each costs a full repaint of its plot).
        full = self.active_run is None or started - self._last_layer_redraw >= 0.25
        self.fidelity_plot.setVisible(any(r.has_reference for r in local))
        for plot in self.plots if full else self.plots[:3]:  # memory, latency, fidelity are live
            plot.redraw(shown if plot is self.latency_plot else local, local_primary)
        if full:
            self._last_layer_redraw = started

    def _update_status(self) -> None:
        card = self.card or {}
        labels = self.status_labels
        labels["device"].setText(f"device {card.get('device', '–')}")
        labels["threads"].setText(f"{card.get('threads', '–')} threads")
        active = self.runs.get(self.active_run) if self.active_run is not None else None
        series = active or self.primary()
        if self.loading:
            state = "loading model…"
        elif active is not None:
            state = f"generating run #{active.run_id}: {active.n} tokens"
        elif self.card is None:
            state = "no model loaded"
        else:
            state = "ready"
        if not labels["state"].text().startswith("stopping") or active is None:
            labels["state"].setText(state)
        rate = series.tokens_per_s if series is not None else None
        labels["rate"].setText(f"{rate:.1f} tokens/s" if rate else "– tokens/s")
        labels["cache"].setText(f"cache {series.cache_mib:.2f} MiB" if series is not None else "cache –")
        labels["rss"].setText(f"RSS {self._rss_mib:,.0f} MiB")

    def _sample_rss(self) -> None:
        try:
            self._rss_mib = self._process.memory_info().rss / MIB
        except psutil.Error:
            return
        self.status_labels["rss"].setText(f"RSS {self._rss_mib:,.0f} MiB")

    def _update_controls(self) -> None:
        idle = self.active_run is None
        can_run = idle and not self.loading and self.card is not None and self.strategy_panel.current() is not None
        self.run_button.setEnabled(can_run)
        self.run_action.setEnabled(can_run)
        self.stop_button.setEnabled(not idle)
        self.stop_action.setEnabled(not idle)
        self.switch_button.setEnabled(not idle)
        self.reference_box.setEnabled(idle)
        self.model_panel.load_button.setEnabled(idle and not self.loading)
        self._update_status()

    def show_error(self, message: str) -> None:
        self.last_error = message
        self.error_label.setText(message)
        self.error_bar.show()

    # -- closing -------------------------------------------------------------------------------------

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        if not self._closing:
            self.save_settings()
            self.shutdown()
        event.accept()

    def shutdown(self, timeout_ms: int = 1800) -> bool:
        """Stop the worker thread; True if it ended within timeout_ms (else thread_stuck is set)."""
        self._closing = True
        self._redraw_timer.stop()
        self._rss_timer.stop()
        self.server.shutdown()
        finished = self.thread.stop(timeout_ms)
        self.thread_stuck = not finished
        return finished


def _final_status(trace: Trace) -> str:
    if trace.error:
        return "failed"
    return "cancelled" if trace.cancelled else "finished"


def _json(value, default):
    if not isinstance(value, str):
        return default
    try:
        return json.loads(value)
    except ValueError:
        return default
