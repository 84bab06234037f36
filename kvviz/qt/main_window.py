"""The kvviz main window: controls on the left, live plots in the middle, tokens and runs around them.

The window composes its parts and carries out the user's actions; each part is its own module (the
README's module map): the run store (every run, its trace and buffers), the local engine (the worker
thread that loads and generates, feeding the store), one folder per mode (local/, evaluate/, server/, choose/),
the Controls dock, the redraw scheduler, the status line, the menus and what is kept between sessions.

Data flow: the worker (own thread) appends records to its run's trace and signals each one; the
store notes the run, the redraw scheduler (at most ~30 redraws/s, only when something changed)
moves the new records into the run's numpy buffers and redraws the views that changed. A run opened
from a trace file is drawn by the same code as a live one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import QApplication, QMainWindow, QVBoxLayout, QWidget

from kvviz.files.conversation import ConversationTrace
from kvviz.files.evaluation import EvalRun
from kvviz.files.sweep import Sweep
from kvviz.files.trace import Trace
from kvviz.present import final_status
from kvviz.qt import theme, unsaved, wheel_guard, window_settings
from kvviz.qt.choose.mode import ChooseMode
from kvviz.qt.controls import CHOOSE, CONVERSATION, EVALUATE, SERVER, Controls
from kvviz.qt.conversation.mode import ConversationMode
from kvviz.qt.docks_aside import DocksAside
from kvviz.qt.evaluate.mode import EvalMode
from kvviz.qt.help import HelpMenu
from kvviz.qt.local.engine import LocalEngine
from kvviz.qt.local.view import LocalView
from kvviz.qt.menus import Menus
from kvviz.qt.panels.runs import RunsTable
from kvviz.qt.panels.tokens import TokenView
from kvviz.qt.redraw import RedrawScheduler
from kvviz.qt.run_store import RunStore
from kvviz.qt.runs_height import RunsHeightKeeper
from kvviz.qt.server.mode import ServerMode
from kvviz.qt.status import ErrorBar, StatusLine, window_figures, window_state
from kvviz.qt.view_tabs import ViewTabs


class MainWindow(QMainWindow):
    sigModelReady = Signal(str, bool)  # spec, loaded (False: failed); after the window updated
    sigRunDone = Signal(int, str)  # run id, status; once its final frame is drawn
    sigSaved = Signal(str)  # the full path of a file just saved (confirmed in the status bar)

    def __init__(self, settings: QSettings | None = None, parent=None):
        super().__init__(parent)
        self.setWindowTitle("kvviz: the key-value cache, live")
        self.settings = settings if settings is not None else QSettings("kvviz", "kvviz")
        self.theme_name = "dark"
        self.last_error = ""
        self.closing = False
        self.wheel_guard = wheel_guard.install(QApplication.instance())  # before any field is made

        self.store = RunStore(self)
        self.redraws = RedrawScheduler(self._frame, self)
        self.engine = LocalEngine(self.store, self)
        self.server = ServerMode(self, self.store)
        self.eval_mode = EvalMode(self, self.engine.worker)
        self.chat_mode = ConversationMode(self, self.engine.worker)
        self.choose_mode = ChooseMode(self, self.engine.worker)
        self.controls = Controls(self.server, self.eval_mode, self.chat_mode, self.choose_mode)
        self.local_view = LocalView()
        self.error_bar = ErrorBar()
        self.views = ViewTabs()
        self.views.setDocumentMode(True)
        self.views.addTab(self.local_view, "Local run")
        self.views.addTab(self.eval_mode.view, "Evaluate")
        self.views.addTab(self.server.view, "vLLM server")
        self.views.addTab(self.chat_mode.view, "Conversation")
        self.views.addTab(self.choose_mode.view, "Choose")
        self.views.setCornerWidget(self.local_view.run_legend, Qt.Corner.TopRightCorner)  # costs no height
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.error_bar)
        layout.addWidget(self.views, 1)
        self.setCentralWidget(central)
        self.token_view = TokenView(self.store)
        self.token_view.setMinimumWidth(200)
        self.runs_table = RunsTable(self.store)
        # the Controls take the window's whole height; the Runs table spans the plots and the tokens
        self.setCorner(Qt.Corner.BottomLeftCorner, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.setCorner(Qt.Corner.TopLeftCorner, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.controls_dock = window_settings.dock(self, "Controls", self.controls, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.tokens_dock = window_settings.dock(self, "Tokens", self.token_view, Qt.DockWidgetArea.RightDockWidgetArea)
        self.runs_dock = window_settings.dock(self, "Runs", self.runs_table, Qt.DockWidgetArea.BottomDockWidgetArea)
        self.docks_aside = DocksAside(self.tokens_dock, self.runs_dock)  # for the modes with views of their own
        self.runs_table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)  # compact rows
        self.runs_table.setMinimumHeight(window_settings.runs_table_min_height(self.runs_table))
        self.runs_height: int | None = None  # the Runs dock's height the user chose (None: sized to the window)
        self.runs_height_keeper = RunsHeightKeeper(self)
        self.status_line = StatusLine(self.statusBar(), self)
        self.menus = Menus(self)
        window_settings.restore(self)
        self.eval_mode.restore_settings(self.settings)

        controls = self.controls
        controls.run_button.clicked.connect(lambda *_: self.start_run())
        controls.stop_button.clicked.connect(self.stop_run)
        controls.switch_button.clicked.connect(lambda *_: self.switch_strategy())
        controls.model_panel.sigLoadRequested.connect(self.load_model)
        controls.model_panel.sigServerRequested.connect(self.connect_server)
        controls.source_tabs.currentChanged.connect(self.set_mode)
        self.views.currentChanged.connect(self.set_mode)
        self.server.sigChanged.connect(self.redraws.schedule)
        self.eval_mode.sigChanged.connect(self.redraws.schedule)
        self.chat_mode.sigChanged.connect(self.redraws.schedule)
        self.choose_mode.sigChanged.connect(self.redraws.schedule)
        self.store.sigRunsChanged.connect(self.redraws.schedule)
        self.store.sigShownChanged.connect(self.redraws.schedule)
        self.store.sigRunEnded.connect(self._on_run_ended)
        worker = self.engine.worker
        worker.sigReady.connect(self._on_ready)
        worker.sigLoadProgress.connect(self._on_load_progress)
        worker.sigModelLoaded.connect(self._on_model_loaded)
        worker.sigModelFailed.connect(self._on_model_failed)
        # bound methods of this window, never lambdas: a lambda has no thread, so Qt would call it on the
        # worker's thread, and widgets may only be touched on the GUI thread
        worker.sigRunFailed.connect(self._on_run_failed)
        worker.sigSwitchAccepted.connect(self._on_switch_accepted)
        worker.sigSwitchRefused.connect(self._on_switch_refused)
        worker.sigRunNotice.connect(self.status_line.notice)
        # the next run is checked as it is set up (the options here, the rest by the worker's model), so that Run
        # is off while it cannot work and the strategy panel says why before Run is pressed
        panel = controls.strategy_panel
        panel.sigChecked.connect(self.update_controls)
        panel.sigEdited.connect(self.update_controls)
        for edited in (panel.sigEdited, controls.prompt_panel.editor.textChanged, controls.settings_panel.raw.toggled,
                       controls.settings_panel.max_new_tokens.valueChanged):
            edited.connect(self._preflight)
        self.engine.sigPromptTokens.connect(panel.set_prompt_tokens)
        self.engine.sigPromptTokens.connect(controls.prompt_panel.set_count)
        self.engine.sigPreflight.connect(panel.set_preflight)
        # the engine computes the attention only while its view is on screen
        self.local_view.sigAttentionShown.connect(worker.desk.attention)
        worker.sigAttentionRefused.connect(self.local_view.attention_refused)
        self.update_controls()
        self.engine.start()
        from kvviz.qt.file_actions import install_file_actions  # noqa: I001 - File menu, drops, Record

        install_file_actions(self)
        controls.prompt_panel.sigOpenRequested.connect(self.file_actions.ask_prompt_file)
        self.help = HelpMenu(self)  # last: the rightmost menu

    # -- settings and mode ---------------------------------------------------------------------------

    def save_settings(self) -> None:
        with self.docks_aside.back():  # kept as the local mode has them
            window_settings.save(self)
        self.eval_mode.save_settings(self.settings)

    def reset_layout(self) -> None:
        """Docks back in their places and every part sized for the window's present size."""
        self.runs_height = None
        with self.docks_aside.back():  # laid out with every dock, then aside again for the mode on screen
            window_settings.default_layout(self)

    def say_saved(self, path, detail: str = "") -> None:
        """Confirm a save in the status bar with the file's full path (a note, not an error)."""
        from pathlib import Path

        full = str(Path(path).resolve())
        self.statusBar().showMessage(f"saved {full}" + (f" ({detail})" if detail else ""), 20_000)
        self.sigSaved.emit(full)

    def set_theme(self, name: str) -> None:
        self.theme_name = window_settings.apply_theme(self, name)
        self.eval_mode.restyle(theme.current())
        self.chat_mode.restyle(theme.current())
        self.choose_mode.restyle(theme.current())
        self.menus.check_theme(self.theme_name)
        self.redraws.schedule()

    def set_mode(self, index: int) -> None:
        """LOCAL: a model run here; EVALUATE: strategies read a document; SERVER: a vLLM server; CONVERSATION: a
        chat with the cache kept across turns; CHOOSE: a sweep that answers which cache to use. The controls and the
        central view follow together."""
        self.controls.set_mode(index)
        if self.views.currentIndex() != index:
            self.views.blockSignals(True)
            self.views.setCurrentIndex(index)
            self.views.blockSignals(False)
        if index in (EVALUATE, CONVERSATION, CHOOSE):
            self.docks_aside.enter()
        else:
            self.docks_aside.leave()
        if index == EVALUATE:
            self.eval_mode.enter()
        if index == CHOOSE:
            self.choose_mode.enter()
        self.update_controls()
        self.redraws.schedule()

    def visible_plots(self) -> list:
        """The plots of the central view on screen: the local run's, the evaluation's or the server's."""
        views = {SERVER: self.server.view, EVALUATE: self.eval_mode.view, CONVERSATION: self.chat_mode.view,
                 CHOOSE: self.choose_mode.view}
        return views.get(self.views.currentIndex(), self.local_view).plots

    def connect_server(self, url: str) -> None:
        """The model chooser's "Connect to a server" (and `kvviz --connect`): a URL given connects at once."""
        self.set_mode(SERVER)
        if url:
            self.server.connect_to(url)
        else:
            self.server.panel.url.setFocus()

    # -- the model -----------------------------------------------------------------------------------

    def load_model(self, spec: str) -> None:
        if self.store.generating is not None or self.eval_mode.running is not None or self.chat_mode.busy \
                or self.choose_mode.running is not None or self.closing:
            return
        self.controls.model_panel.set_spec(spec)
        self.controls.model_panel.set_loading(f"loading {spec}…", None)
        self.engine.load(spec)
        self.update_controls()

    def _on_ready(self, listing) -> None:
        self.server.connection.engine_ready.set()
        self.controls.strategy_panel.set_strategies(listing)
        self.eval_mode.set_strategies(listing)
        self.help.set_strategies(listing)
        self.update_controls()

    def _on_load_progress(self, message: str, fraction) -> None:
        if self.engine.loading:
            self.controls.model_panel.set_loading(message, fraction)

    def _on_model_loaded(self, spec: str, card: dict) -> None:
        self.controls.model_panel.set_loaded(card)
        self.error_bar.hide()
        self.update_controls()
        self.choose_mode.request_grid()
        self.sigModelReady.emit(spec, True)

    def _on_run_failed(self, run_id: int, message: str) -> None:
        if run_id in self.store.runs:
            self.show_error(f"Run #{run_id} failed: {message}")
        else:  # refused before it started: withdrawn, the runs shown before are shown again
            self.show_error(f"Cannot run: {message}")

    def _preflight(self, *_) -> None:
        controls = self.controls
        if controls.strategy_panel.current() is not None:
            self.engine.preflight({
                "prompt": controls.prompt_panel.text(), "raw": controls.settings_panel.raw.isChecked(),
                "strategy": controls.strategy_panel.current(), "options": controls.strategy_panel.values(),
                "max_new_tokens": controls.settings_panel.max_new_tokens.value(),
            })

    def _on_switch_accepted(self, strategy: str) -> None:
        self.status_line.say(f"switching to {strategy} at the next step…")

    def _on_switch_refused(self, strategy: str, why: str) -> None:
        self.show_error(f"Cannot switch: {why}")

    def _on_model_failed(self, spec: str, message: str) -> None:
        self.controls.model_panel.set_failed(message)
        self.show_error(f"Could not load the model {spec!r}: {message}" if spec else message)
        self.update_controls()
        self.sigModelReady.emit(spec, False)

    # -- runs ----------------------------------------------------------------------------------------

    def start_run(self, extra_settings: dict[str, Any] | None = None) -> int | None:
        """Start a run with the current controls; returns its id, or None if it cannot start.

        extra_settings: further GenerationSettings fields (the bench passes stop_at_eos=False).
        In the Evaluate mode (Ctrl+Enter there) it starts the evaluation instead, and returns None.
        """
        if self.views.currentIndex() == EVALUATE:
            self.eval_mode.start()
            return None
        if self.views.currentIndex() == CONVERSATION:
            self.chat_mode.send()
            return None
        if self.views.currentIndex() == CHOOSE:
            self.choose_mode.start()
            return None
        controls = self.controls
        if not controls.run_button.isEnabled():
            return None
        prompt = controls.prompt_panel.text()
        if not prompt.strip():
            self.show_error("Type a prompt first.")
            return None
        strategy = controls.strategy_panel.current()
        options = controls.strategy_panel.values()
        settings = {**controls.settings_panel.settings(), **(extra_settings or {})}
        header = Trace(
            model=dict(self.engine.card or {}),
            strategy={"name": strategy, "options": options},
            prompt=prompt,
            settings=settings,
        )
        request = {"strategy": strategy, "options": options, "settings": settings, "prompt": prompt}
        request["reference"] = controls.reference_box.isChecked()
        self.error_bar.hide()
        run_id = self.engine.run(header, request)
        self.update_controls()
        return run_id

    def switch_strategy(self) -> bool:
        """Ask the running generation to switch to the strategy and options chosen in the picker; False when
        nothing runs or an option is invalid. The worker answers with sigSwitchAccepted or sigSwitchRefused
        (shown above the plots)."""
        if self.views.currentIndex() == CONVERSATION:
            return self.chat_mode.switch()
        if self.store.generating is None:
            return False
        problem = self.controls.strategy_panel.problem()
        if problem:
            self.show_error(f"Cannot switch: {problem}")
            return False
        self.engine.switch(self.controls.strategy_panel.current(), self.controls.strategy_panel.values())
        return True

    def stop_run(self) -> None:
        if self.store.generating is not None:
            self.engine.cancel(self.store.generating)
            self.status_line.hold("stopping after this step…")
        self.eval_mode.stop()
        self.chat_mode.stop()
        self.choose_mode.stop()

    def show_kept(self, kept):
        """A trace opened from a file into the Runs table (returns its run id), an evaluation into the Evaluate
        tab, a sweep into the Choose tab, a conversation into the Conversation tab or a server session into the
        server view (returns it; None for an evaluation, a sweep or a conversation refused)."""
        if isinstance(kept, Trace):
            return self.store.add(kept, final_status(kept))
        if isinstance(kept, EvalRun):
            self.set_mode(EVALUATE)
            return self.eval_mode.open_run(kept)
        if isinstance(kept, Sweep):
            self.set_mode(CHOOSE)
            return self.choose_mode.open_sweep(kept)
        if isinstance(kept, ConversationTrace):
            self.set_mode(CONVERSATION)
            return self.chat_mode.open_trace(kept)
        self.server.open_session(kept)
        self.set_mode(SERVER)
        return kept

    def _on_run_ended(self, run_id: int, status: str) -> None:
        self.update_controls()
        self.redraws.redraw_then(lambda: self.sigRunDone.emit(run_id, status))

    # -- drawing -------------------------------------------------------------------------------------

    def redraw(self) -> None:
        """Draw every view now, with the records that have arrived (the scheduler does this on its own)."""
        self.redraws.redraw()

    def _frame(self) -> list[Callable[[], None]]:
        """Take the records that arrived; the parts that draw them (the scheduler may give each its own turn
        of the event loop): the local view's plots one by one, then the window around them."""
        store = self.store
        store.sync()
        shown, primary = store.shown_series(), store.primary()
        generating = store.generating is not None
        if self.views.currentIndex() == SERVER:
            parts = [self.server.redraw,
                     lambda: self.server.view.latency_plot.draw_frame(shown, primary)]  # names its runs itself
            self.local_view.run_legend.set_entries([])
        elif self.views.currentIndex() == EVALUATE:
            parts = [self.eval_mode.redraw]  # its plots name the strategies; the runs' legend is not theirs
            self.local_view.run_legend.set_entries([])
        elif self.views.currentIndex() == CHOOSE:
            parts = [self.choose_mode.redraw]
            self.local_view.run_legend.set_entries([])
        elif self.views.currentIndex() == CONVERSATION:
            parts = self.chat_mode.redraw_parts()  # one conversation, named in its header
            self.local_view.run_legend.set_entries([])
        else:
            parts = self.local_view.redraw_parts(shown, primary, generating)

        def around() -> None:
            self.views.fit_corner()
            if primary is not None:
                self.token_view.update_tokens()
            self.runs_table.refresh(live=generating)
            self._update_status()

        return [*parts, around]

    def _update_status(self) -> None:
        self.status_line.update(window_state(self), self.store.generating is not None, self.engine.card,
                                window_figures(self))

    def update_controls(self) -> None:
        generating = self.store.generating is not None
        idle = (not generating and self.eval_mode.running is None and not self.chat_mode.busy
                and self.choose_mode.running is None)
        loading = self.engine.loading
        ready = self.engine.card is not None and self.controls.strategy_panel.current() is not None
        valid = self.controls.strategy_panel.problem() is None  # its message is beside the field
        can_run = idle and not loading and ready and valid
        self.controls.set_enabled(can_run, generating, loading)
        self.controls.switch_button.setEnabled(generating and valid)
        self.controls.model_panel.load_button.setEnabled(idle and not loading)
        self.eval_mode.update_controls(idle and not loading and self.engine.card is not None)
        self.chat_mode.update_controls(idle and not loading and self.engine.card is not None and valid)
        self.choose_mode.update_controls(idle and not loading and self.engine.card is not None)
        mode_button = {EVALUATE: self.eval_mode.evaluate_button, CHOOSE: self.choose_mode.choose_button}
        button = mode_button.get(self.views.currentIndex())
        self.menus.set_enabled(button.isEnabled() if button is not None else can_run, not idle)
        self.menus.switch_action.setEnabled(generating and valid)
        self._update_status()

    def show_error(self, message: str) -> None:
        self.last_error = message
        self.error_bar.show_message(message)

    # -- closing -------------------------------------------------------------------------------------

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        if not self.closing:
            self.save_settings()
            self.shutdown()
            unsaved.remove_own()  # closed normally: what was not saved goes with the window, as always
        event.accept()

    def say_left_behind(self) -> list:
        """Say where the runs and evaluations of a window that ended without closing are kept; returns them."""
        left = unsaved.left_behind()
        if left:
            self.statusBar().showMessage(
                f"{len(left)} unsaved run(s) or evaluated strateg{'y' if len(left) == 1 else 'ies'} of a kvviz window "
                f"that ended without closing are kept in {unsaved.folder()}: File ▸ Open shows them", 60_000)
        return left

    def shutdown(self, timeout_ms: int = 1800) -> bool:
        """Stop the worker thread; True if it ended within timeout_ms (else engine.stuck is set)."""
        self.closing = True
        if self.recorder.recorder.recording:  # the recording is kept, complete, as Stop recording keeps it
            self.recorder.stop()
        self.redraws.stop()
        self.status_line.stop()
        self.server.shutdown()
        self.eval_mode.shutdown()
        self.chat_mode.shutdown()
        self.choose_mode.shutdown()
        stopped = self.engine.stop(timeout_ms)
        self.keep_conversation()
        return stopped

    def keep_conversation(self) -> Path | None:
        """At close (the close button, Ctrl-C, SIGTERM): the chat loses no finished turn (ConversationMode.
        keep_at_close). Where it lies goes to the status bar and to stderr: the window is closing, and the terminal
        it was started from is where the user still looks."""
        folder = unsaved.folder()
        try:
            path = self.chat_mode.keep_at_close(folder)
        except OSError as exc:
            print(f"kvviz: could not keep the conversation in {folder}: {exc.strerror or exc}", file=sys.stderr)
            return None
        if path is not None:
            self.say_saved(path, "the conversation, kept at close; File ▸ Open reopens it")
            print(f"kvviz: the conversation is kept in {path.resolve()}; File > Open reopens it", file=sys.stderr)
        return path
