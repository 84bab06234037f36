"""The kvviz main window, the shell the modes plug into: Controls on the left, the mode's view in the middle, tokens
and runs around it.

The shell composes the parts (the run store, the model host with its worker thread, the Controls dock, the redraw
scheduler, the status line, the menus, the settings: a module each) and loops over kvviz.qt.modes.MODES for what a
mode does: its tabs, Controls and view, starting and stopping, its part of each redraw and of the status line, its
kept files, its shutdown. A mode reaches the window only through its ModeHost (kvviz.qt.window_host). The worker
appends records and signals them; the redraw scheduler (at most ~30 frames/s, only when something changed) draws
them. A run opened from a file is drawn by the same code as a live one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QSettings, Qt, Signal
from PySide6.QtWidgets import QMainWindow, QVBoxLayout, QWidget

from kvviz.qt import modes, unsaved, wheel_guard, window_settings
from kvviz.qt.controls import Controls
from kvviz.qt.docks_aside import DocksAside
from kvviz.qt.file_actions import FileActions
from kvviz.qt.help import HelpMenu
from kvviz.qt.menus import Menus
from kvviz.qt.mode_api import Mode
from kvviz.qt.model_host import ModelHost
from kvviz.qt.panels.runs import RunsTable
from kvviz.qt.panels.tokens import TokenView
from kvviz.qt.redraw import PaintClock, RedrawScheduler
from kvviz.qt.run_store import RunStore
from kvviz.qt.runs_height import RunsHeightKeeper
from kvviz.qt.shared_panels import SharedPanels
from kvviz.qt.status import ErrorBar, StatusLine, state_words, window_figures
from kvviz.qt.view_tabs import ViewTabs
from kvviz.qt.window_host import WindowHost


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

        self.store = RunStore(self)
        self.redraws = RedrawScheduler(self._frame, self)
        self.model = ModelHost(self)
        self.error_bar = ErrorBar()
        self.status_line = StatusLine(self.statusBar(), self)
        self.file_actions = FileActions(self)
        self.panels = SharedPanels()
        host = WindowHost(self)
        self._order: list[Mode] = [cls(host) for cls in modes.MODES]  # as their tabs
        self.modes: dict[str, Mode] = {mode.key: mode for mode in self._order}
        self.controls = Controls(self.panels, self._order)
        self.views = ViewTabs(self._order)
        for mode in self._order:
            mode.setParent(self)  # goes with the window, on the GUI thread
            mode.sigChanged.connect(self.redraws.schedule)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.error_bar)
        layout.addWidget(self.views, 1)
        self.setCentralWidget(central)
        self.token_view = TokenView(self.store)
        self.token_view.setMinimumWidth(200)
        self.token_view.sigPin.connect(self.panels.pin_panel.add)
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
        self.menus = Menus(self)
        self.set_mode(self.mode)
        window_settings.restore(self)
        for tabs in (self.controls.source_tabs, self.views):
            tabs.currentChanged.connect(lambda index: self.set_mode(self._order[index]))
        self.panels.model_panel.sigLoadRequested.connect(self.load_model)
        self.store.sigRunsChanged.connect(self.redraws.schedule)
        self.store.sigShownChanged.connect(self.redraws.schedule)
        self.store.sigRunEnded.connect(self._on_run_ended)
        worker = self.model.worker
        worker.sigReady.connect(self._on_ready)
        worker.sigLoadProgress.connect(self._on_load_progress)
        worker.sigModelLoaded.connect(self._on_model_loaded)
        worker.sigModelFailed.connect(self._on_model_failed)
        worker.sigRunNotice.connect(self.status_line.notice)
        self.update_controls()
        self.model.start()
        self.file_actions.install(self._order)
        self.help = HelpMenu(self, self._order)  # last: the rightmost menu
        wheel_guard.guard(self)  # every field the parts built

    # -- the modes -----------------------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        """The mode on screen."""
        return self._order[self.views.currentIndex()]

    def set_mode(self, mode: Mode | str) -> None:
        """Bring a mode (or the mode of that key) on screen: its tabs, Controls and view follow together."""
        mode = self.modes[mode] if isinstance(mode, str) else mode
        index = self._order.index(mode)
        if self.views.currentIndex() != index:
            self.views.blockSignals(True)
            self.views.setCurrentIndex(index)
            self.views.blockSignals(False)
        self.controls.set_mode(index)
        self.views.show_corner(mode.corner)
        if mode.hides_docks:
            self.docks_aside.enter()
        else:
            self.docks_aside.leave()
        mode.enter()
        self.update_controls()
        self.redraws.schedule()

    def set_theme(self, name: str) -> None:
        self.theme_name = window_settings.apply_theme(self, name)
        self.menus.check_theme(self.theme_name)
        self.redraws.schedule()

    def save_settings(self) -> None:  # (the settings' one home is kvviz.qt.window_settings)
        window_settings.save(self)

    def reset_layout(self) -> None:
        """Docks back in their places and every part sized for the window's present size."""
        self.runs_height = None
        window_settings.default_layout(self)

    def say_saved(self, path, detail: str = "") -> None:
        """Confirm a save in the status bar with the file's full path (a note, not an error)."""
        self.statusBar().showMessage(f"saved {Path(path).resolve()}" + (f" ({detail})" if detail else ""), 20_000)
        self.sigSaved.emit(str(Path(path).resolve()))

    def show_error(self, message: str) -> None:
        self.last_error = message
        self.error_bar.show_message(message)

    # -- the model -----------------------------------------------------------------------------------

    def load_model(self, spec: str) -> None:
        if self.closing or self.model.loading or any(mode.busy for mode in self._order):
            return
        self.panels.model_panel.set_spec(spec)
        self.panels.model_panel.set_loading(f"loading {spec}…", None)
        self.model.load(spec)
        self.update_controls()

    def _on_ready(self, listing) -> None:
        self.panels.strategy_panel.set_strategies(listing)
        self.update_controls()

    def _on_load_progress(self, message: str, fraction) -> None:
        if self.model.loading:
            self.panels.model_panel.set_loading(message, fraction)

    def _on_model_loaded(self, spec: str, card: dict) -> None:
        self.panels.model_panel.set_loaded(card)
        self.error_bar.hide()
        self.update_controls()
        self.sigModelReady.emit(spec, True)

    def _on_model_failed(self, spec: str, message: str) -> None:
        self.panels.model_panel.set_failed(message)
        self.show_error(f"Could not load the model {spec!r}: {message}" if spec else message)
        self.update_controls()
        self.sigModelReady.emit(spec, False)

    # -- what the user starts and stops ----------------------------------------------------------------

    def start_run(self, extra_settings: dict[str, Any] | None = None) -> Any:
        """Run ▸ Run (Ctrl+Enter): the mode on screen starts what its main button starts (a run, an evaluation, a
        message, a sweep); returns what it returns (a local run's id), None when it cannot start.
        extra_settings: further GenerationSettings fields (the bench passes stop_at_eos=False)."""
        return self.mode.start(extra_settings)

    def switch_strategy(self) -> bool:
        """Run ▸ Switch (F6): the mode on screen converts its running cache to the strategy in the picker."""
        return self.mode.switch()

    def stop_run(self) -> None:
        """Run ▸ Stop (Esc): whatever runs stops, keeping what it measured."""
        for mode in self._order:
            mode.stop()

    def show_kept(self, kept) -> Any:
        """A kept record (kvviz.files.formats.read_kept) shown by the mode that opens its kind, on screen; what that
        mode's `open` returns (a trace's run id; None where it refused)."""
        for mode in self._order:
            if isinstance(kept, mode.formats):
                self.set_mode(mode)
                return mode.open(kept)
        raise TypeError(f"no mode opens {type(kept).__name__}")

    def _on_run_ended(self, run_id: int, status: str) -> None:
        self.update_controls()
        self.redraws.redraw_then(lambda: self.sigRunDone.emit(run_id, status))

    def update_controls(self) -> None:
        busy = any(mode.busy for mode in self._order)
        loading = self.model.loading
        ready = not busy and not loading and self.model.card is not None
        for mode in self._order:
            mode.update_controls(ready)
        self.panels.model_panel.load_button.setEnabled(not busy and not loading)
        self.menus.set_enabled(self.mode.can_start(), busy, self.mode.can_switch())
        self._update_status()

    # -- drawing -------------------------------------------------------------------------------------

    def redraw(self) -> None:
        """Draw every view now, with the records that have arrived (the scheduler does this on its own)."""
        self.redraws.redraw()

    def _frame(self) -> list[Callable[[], None]]:
        """Take the records that arrived; the parts that draw them (the scheduler may give each its own turn of the
        event loop): the mode's, then the window around them."""
        store = self.store
        store.sync()
        primary, generating = store.primary(), store.generating is not None
        parts = self.mode.redraw_parts()

        def around() -> None:
            self.views.fit_corner()
            if primary is not None:
                self.token_view.update_tokens()
            self.runs_table.refresh(live=generating)
            self._update_status()

        return [*parts, around]

    def _update_status(self) -> None:
        self.status_line.update(state_words(self._order, self.mode, self.model), any(m.busy for m in self._order),
                                self.model.card, window_figures(self._order, self.mode, self.store))

    # -- closing -------------------------------------------------------------------------------------

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        if not self.closing:
            self.save_settings()
            self.shutdown()
            unsaved.remove_own()  # closed normally: what was not saved goes with the window, as always
        event.accept()

    def event(self, event: QEvent) -> bool:
        if event.type() != QEvent.Type.UpdateRequest:
            return super().event(event)
        with PaintClock.timing():  # every widget's painting: the redraw budget counts it
            return super().event(event)

    def say_left_behind(self) -> list:
        return unsaved.say_left_behind(self.statusBar())

    def shutdown(self) -> None:
        """Stop every mode, join the worker thread (every way out of the window comes here: a QThread destroyed while
        it runs aborts the process), then keep what must not be lost."""
        self.closing = True
        if self.recorder.recorder.recording:  # the recording is kept, complete, as Stop recording keeps it
            self.recorder.stop()
        self.redraws.stop()
        self.status_line.stop()
        for mode in self._order:
            mode.shutdown()
        self.model.stop()
        for mode in self._order:
            self._keep_at_close(mode)

    def _keep_at_close(self, mode: Mode) -> None:
        """What a mode keeps once the worker stopped (the chat's turns), said in the status bar and on stderr: the
        window is closing, and the terminal it was started from is where the user still looks."""
        try:
            path = mode.keep_at_close()
        except OSError as exc:
            print(f"kvviz: could not keep the {mode.title} mode's work in {unsaved.folder()}: {exc.strerror or exc}",
                  file=sys.stderr)
            return
        if path is not None:
            self.say_saved(path, "kept at close; File ▸ Open reopens it")
            print(f"kvviz: kept at close: {path.resolve()}; File > Open reopens it", file=sys.stderr)
