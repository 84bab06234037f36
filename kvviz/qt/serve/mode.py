"""The window's "Serve" mode: many requests through transformers' continuous batching and its paged cache, live, as
`kvviz serve` serves them.

`ServeMode` owns its widgets (`panel`: the requests and the pool, below the shared model chooser in its Controls;
`buttons` under them; `view` as the central "Serve" tab) and the run on screen. Serve sends the request to the
`ServeRunner` on the worker's thread; while it serves, the view is drawn again from the run's steps several times a
second (`TICK_MS`, under the window's 30 frames a second), and Stop ends it at once, keeping what was measured. The
run before stays on the pool plot to compare with. Kept serving runs (`kvviz-serve` files) open into the same view,
and the one on screen saves as that file.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QWidget

from kvviz.files.serve_trace import ServeRun
from kvviz.qt.jobs import JobControl
from kvviz.qt.mode_api import FileEntry, Mode, ModeHost
from kvviz.qt.serve.help import HELP
from kvviz.qt.serve.panel import ServePanel
from kvviz.qt.serve.runner import ServeRunner
from kvviz.qt.serve.view import ServeView

TICK_MS = 100  # the view is drawn again this often while a run serves


class ServeMode(Mode):
    key = "serve"
    title = "Serve"
    short_title = "Serve"
    tip = "Many requests through transformers' continuous batching: its paged cache's blocks, live"
    hides_docks = True
    formats = (ServeRun,)
    help = HELP

    sigRequestServe = Signal(int, object)  # to the runner: job id, request
    sigDone = Signal(int)  # job id: it ended (finished, stopped or failed) and its last state is drawn

    def __init__(self, host: ModeHost):
        super().__init__(host)
        self.runner = runner = ServeRunner(host.model.worker)
        self.jobs = JobControl(runner)
        self.panel = ServePanel()
        self.view = ServeView()
        self.serve_button = QPushButton("Serve")
        self.serve_button.setObjectName("runButton")
        self.serve_button.setToolTip("Send the requests through transformers' continuous batching on the loaded model")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop serving at once: what was measured stays")
        self.buttons = QWidget()
        row = QHBoxLayout(self.buttons)
        row.setContentsMargins(9, 0, 9, 0)
        row.addWidget(self.serve_button, 2)
        row.addWidget(self.stop_button, 1)
        self.controls = [host.panels.model_panel, self.panel]
        self.file_entries = (FileEntry("serve", "Save ser&ving run…", self._ask_save),)
        self.serve_button.clicked.connect(lambda *_: self.start())
        self.stop_button.clicked.connect(lambda *_: self.stop())
        self.sigRequestServe.connect(runner.serve)
        runner.sigStarted.connect(self._on_started)
        runner.sigFailed.connect(self._on_failed)
        runner.sigFinished.connect(self._on_finished)
        self.ticker = QTimer(self)
        self.ticker.setInterval(TICK_MS)
        self.ticker.timeout.connect(self._changed)
        self.run: ServeRun | None = None  # the run on screen
        self.previous: ServeRun | None = None  # the one before it, overlaid on the pool plot
        self.opened = False  # the run on screen came from a file
        self._dirty = False

    @property
    def busy(self) -> bool:
        return self.jobs.running is not None

    def can_start(self) -> bool:
        return self.serve_button.isEnabled()

    def update_controls(self, ready: bool) -> None:
        idle = not self.busy
        self.serve_button.setEnabled(ready and idle)
        self.stop_button.setEnabled(not idle)
        self.panel.setEnabled(idle)

    # -- a run -----------------------------------------------------------------------------------------

    def start(self, extra_settings=None) -> int | None:
        """Serve the requests set; the job's id, or None if it cannot start."""
        if not self.serve_button.isEnabled():
            return None
        from kvviz.errors import OptionError

        request = self.panel.request()
        try:
            request["settings"].check()
        except OptionError as exc:
            self.host.show_error(f"Cannot serve: {exc}")
            return None
        job_id = self.jobs.begin()
        self.host.hide_error()
        self.sigRequestServe.emit(job_id, request)
        self.ticker.start()
        self.host.update_controls()
        self._changed()
        return job_id

    def stop(self) -> None:
        if self.jobs.stop():
            self.host.hold("stopping: the requests still open are failed, the pool freed…")

    def _on_started(self, job_id: int, run: ServeRun) -> None:
        if not self.jobs.current(job_id):
            return
        if self.run is not None:
            self.previous = self.run
        self.run, self.opened = run, False
        self._changed()

    def _on_failed(self, job_id: int, message: str) -> None:
        if self.jobs.current(job_id):
            self.host.show_error(f"Cannot serve: {message}")

    def _on_finished(self, job_id: int) -> None:
        if not self.jobs.end(job_id):
            return
        self.ticker.stop()
        self.host.update_controls()
        self._dirty = True
        self.host.redraw()
        self.sigDone.emit(job_id)

    def _changed(self) -> None:
        self._dirty = True
        self.sigChanged.emit()

    # -- kept runs -------------------------------------------------------------------------------------

    def open(self, run: ServeRun) -> ServeRun | None:
        """Show a kept serving run, the one on screen becoming the one before; None (and a message) while one
        serves."""
        if self.busy:
            self.host.show_error("A run is serving: stop it before opening a serving run.")
            return None
        if self.run is not None:
            self.previous = self.run
        self.run, self.opened = run, True
        self._changed()
        return run

    def save(self, path: str | os.PathLike) -> Path | None:
        """File ▸ Save serving run: the run on screen as a kvviz-serve file; None (and a message saying why) when
        there is nothing to save or it cannot be written."""
        if self.busy or self.run is None:
            self.host.tell("Nothing to save", "Stop serving first." if self.busy else
                           "Serve first (Controls ▸ Serve), or open a serving run.")
            return None
        run = self.run
        return self.host.write("the serving run", lambda: run.save(path), path)

    def _ask_save(self) -> None:
        path = self.host.dialogs.save_file("serve", "Save serving run", "serve.json",
                                           "kvviz serving runs (*.json);;All files (*)")
        if path:
            self.save(path)

    # -- drawing --------------------------------------------------------------------------------------

    def redraw_parts(self) -> list:
        return [self._draw] if self._dirty else []

    def plots(self) -> list:
        return self.view.plots

    def _draw(self) -> None:
        self._dirty = False
        self.view.redraw(self.run, self.previous, self.header())

    def header(self) -> str:
        if self.busy and self.run is None:
            return "building the pool…"
        if self.run is None:
            return ""
        run = self.run
        model = run.model.get("name") or "?"
        pool = (f"{run.blocks:,} blocks of {run.page_size} tokens"
                + (" (sized from free memory by transformers)" if run.sized_from_memory else ""))
        state = ("opened from a file" if self.opened else "serving" if self.busy else
                 "stopped" if run.cancelled else "done")
        sharing = "prefix sharing " + ("on" if run.settings.prefix_sharing else "off")
        return f"{model}: {pool}, {run.settings.scheduler}, {sharing}; {state}" + (
            f"; {run.error}" if run.error else "")

    def status(self) -> str:
        if not self.busy or self.run is None:
            return "serving: building the pool…" if self.busy else ""
        done = sum(r.finished for r in self.run.requests)
        return f"serving: {done} of {len(self.run.requests)} requests answered, {len(self.run.steps):,} steps"

    def enter(self) -> None:
        self._dirty = True

    def reset_layout(self) -> None:
        self.view.reset_layout()

    def restyle(self, palette) -> None:
        self.view.apply_palette(palette)
        self._dirty = True

    def shutdown(self) -> None:
        self.ticker.stop()
        self.jobs.shutdown()
