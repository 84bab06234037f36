"""The window's "Choose" mode: which cache should this model use, on this text, at this context, for this many
sequences, in this memory? A sweep (`kvviz.engine.sweep.SweepRun`) answers it live, as `kvviz choose` does.

`ChooseMode` owns its widgets (`controls_page`: the document, the question and the configurations, below the
shared model chooser in its Controls; `buttons` under them; `view` as the central "Choose" tab) and the sweep on
screen. Choose sends the request to the `SweepRunner` on the worker's thread; each configuration appears on the
frontier as it finishes, the time left is read from the running sweep at each redraw, and Stop keeps the
finished configurations. The runner journals every sweep as it goes (in the folder of unsaved work, `kvviz.qt.unsaved`,
until the window closes); opened, a journal of a sweep that did not end offers to continue it. Kept sweeps
(`kvviz-sweep` files) open into the same view, and the one on screen saves as that file, its CSV and the frontier
picture (PNG and SVG).
"""

from __future__ import annotations

import os
from html import escape
from pathlib import Path

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from kvviz.files import sweep_report
from kvviz.files.sweep import Sweep
from kvviz.present import NOT_RUN, WAITING, clock, counted
from kvviz.qt import unsaved
from kvviz.qt.choose.help import HELP
from kvviz.qt.choose.panel import DEFAULT_TOKENS, ConfigurationsPanel, QuestionPanel
from kvviz.qt.choose.questions import QuestionsPanel
from kvviz.qt.choose.runner import SweepRunner
from kvviz.qt.choose.view import ChooseView
from kvviz.qt.jobs import JobControl
from kvviz.qt.mode_api import FileEntry, Mode, ModeHost
from kvviz.qt.panels.document import DocumentPanel

MIN_TOKENS = 16  # a sweep's shortest text: its evicting budgets are fractions of it
PROGRESS_INTERVAL_MS = 500  # the time left is said again this often while a sweep runs


class ChooseMode(Mode):
    key = "choose"
    title = "Choose"
    short_title = "Choose"
    tip = "Which cache should I use? A sweep of configurations on your text, and the answer"
    hides_docks = True
    formats = (Sweep,)
    help = HELP

    sigRequestGrid = Signal(int, object)  # to the runner: tokens, the tokens budgets are fractions of (None: those)
    sigRequestSweep = Signal(int, object)  # to the runner: sweep id, request
    sigDone = Signal(int)  # sweep id: it ended (finished, stopped or failed) and its last state is drawn

    def __init__(self, host: ModeHost):
        super().__init__(host)
        self.runner = runner = SweepRunner(host.model.worker)
        self.jobs = JobControl(runner)
        self.document_panel = DocumentPanel(DEFAULT_TOKENS)
        self.document_panel.tokens.setMinimum(MIN_TOKENS)
        self.document_panel.tokens.setSpecialValueText("")  # every sweep measures a given number of tokens
        self.question_panel = QuestionPanel()
        self.asked_panel = QuestionsPanel()
        self.config_panel = ConfigurationsPanel()
        self.controls_page = QWidget()
        column = QVBoxLayout(self.controls_page)
        column.setContentsMargins(0, 0, 0, 0)
        for panel in (self.document_panel, self.question_panel, self.asked_panel, self.config_panel):
            panel.layout().setContentsMargins(8, 4, 8, 6)
            column.addWidget(panel)
        self.view = ChooseView()
        self.choose_button = QPushButton("Choose")
        self.choose_button.setObjectName("runButton")
        self.choose_button.setToolTip("Read the text through every configuration ticked, compare each with the exact "
                                      "cache and answer the question")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the sweep after this forward: the finished configurations stay")
        self.buttons = QWidget()
        row = QHBoxLayout(self.buttons)
        row.setContentsMargins(9, 0, 9, 0)
        row.addWidget(self.choose_button, 2)
        row.addWidget(self.stop_button, 1)
        self.controls = [host.panels.model_panel, self.controls_page]
        self.file_entries = (FileEntry("sweep", "Save s&weep (file, CSV, frontier picture)…", self._ask_save),)
        self.choose_button.clicked.connect(lambda *_: self.start())
        self.stop_button.clicked.connect(lambda *_: self.stop())
        self.document_panel.sigOpenRequested.connect(self._ask_document)
        self.document_panel.tokens.editingFinished.connect(self.request_grid)
        self.config_panel.sigChanged.connect(host.update_controls)
        self.asked_panel.sigOpenRequested.connect(self._ask_questions)
        self.asked_panel.toggled.connect(self.request_grid)
        self.asked_panel.length.editingFinished.connect(self.request_grid)
        host.model.worker.sigModelLoaded.connect(self.request_grid)
        host.model.worker.sigReady.connect(self._on_strategies)
        self.view.frontier_plot.sigPicked.connect(self.pick)
        self.view.table.sigPicked.connect(self.pick)
        self.view.accuracy_plot.sigPicked.connect(self.pick)
        self.view.answers.sigPicked.connect(self.pick)
        self.sigRequestGrid.connect(runner.grid)
        self.sigRequestSweep.connect(runner.choose)
        runner.sigGrid.connect(self._on_grid)
        runner.sigStarted.connect(self._on_started)
        runner.sigConfiguration.connect(self._on_configuration)
        runner.sigFailed.connect(self._on_failed)
        runner.sigFinished.connect(self._on_finished)
        self.ticker = QTimer(self)
        self.ticker.setInterval(PROGRESS_INTERVAL_MS)
        self.ticker.timeout.connect(self._changed)

        self.sweep: Sweep | None = None  # the sweep on screen
        self.run = None  # the engine's SweepRun while it runs (its progress and time left)
        self.done: set[int] = set()  # the configurations (indices) that have ended
        self.selected: int | None = None  # the configuration whose curves are shown
        self.opened = False  # the sweep on screen came from a file
        self.continuing: Path | None = None  # the journal of the sweep that runs, where it continues one
        self.offer = None  # the question asked when a journal was opened
        self.notice = ""  # why the text was cut
        self._dirty = False

    # -- the controls ---------------------------------------------------------------------------------

    def request_grid(self, *_) -> None:
        """Ask the worker for the default grid at the tokens set (after a model loaded, or the tokens changed)."""
        if self.host.model.card is not None and not self.busy:
            self.sigRequestGrid.emit(self.document_panel.tokens.value(), self.asked_panel.budgets_of())

    def _on_strategies(self, listing) -> None:
        """The engine's strategies: their defaults name the configurations shortly on the frontier."""
        self.view.frontier_plot.defaults = self.view.accuracy_plot.defaults = self.host.model.defaults()
        self._changed()

    def _on_grid(self, tokens: int, budgets_of, entries: list, skipped: list) -> None:
        if (tokens, budgets_of) == (self.document_panel.tokens.value(), self.asked_panel.budgets_of()):
            self.config_panel.set_grid(entries, skipped)

    def _ask_document(self) -> None:
        self.document_panel.ask(self.host.dialogs, "Open a text to choose on", self.host.show_error,
                                "Cannot choose on this text")

    def _ask_questions(self) -> None:
        path = self.host.dialogs.open_file("questions", "Open a question file",
                                           "Questions (*.jsonl *.json);;All files (*)")
        if path:
            self.open_questions(path)

    def open_questions(self, path: str | os.PathLike) -> bool:
        """Ask the questions of a JSONL file (or a kept conversation's) instead of the tasks; False (and the command's
        message) when it cannot be used, the file chosen before kept."""
        problem = self.asked_panel.open_path(path)
        if problem:
            self.host.show_error(f"Cannot use this question file: {problem}")
            return False
        self.host.hide_error()
        self.request_grid()
        return True

    def open_document(self, path: str | os.PathLike) -> bool:
        """A user's .txt or .md file as the text; False (and a message saying why) when it cannot be used."""
        return self.document_panel.open_path(path, self.host.show_error, "Cannot choose on this text")

    @property
    def busy(self) -> bool:
        return self.jobs.running is not None

    def can_start(self) -> bool:
        return self.choose_button.isEnabled()

    def update_controls(self, ready: bool) -> None:
        idle = not self.busy
        self.choose_button.setEnabled(ready and idle and bool(self.config_panel.chosen()))
        self.stop_button.setEnabled(not idle)
        for panel in (self.document_panel, self.question_panel, self.asked_panel):
            panel.setEnabled(idle)
        self.config_panel.set_enabled(idle)

    # -- a sweep ---------------------------------------------------------------------------------------

    def start(self, extra_settings=None) -> int | None:
        """Sweep the configurations ticked; the sweep's id, or None if it cannot start (a budget or tolerance
        that does not read: the message says what is accepted, and every field keeps what was typed)."""
        if not self.choose_button.isEnabled():
            return None
        problem = self.question_panel.problem() or self.asked_panel.problem()
        if problem:
            self.host.show_error(f"Cannot choose: {problem}")
            return None
        return self._begin({"document": self.document_panel.document(), "tokens": self.document_panel.tokens.value(),
                            "configurations": self.config_panel.chosen(), "asked": self.asked_panel.request(),
                            **self.question_panel.question()})

    def _begin(self, request: dict) -> int:
        sweep_id = self.jobs.begin()
        self.continuing = request.get("journal")
        self.run, self.sweep = None, None
        self.done, self.selected, self.opened, self.notice = set(), None, False, ""
        self.host.hide_error()
        self.sigRequestSweep.emit(sweep_id, request)
        self.ticker.start()
        self.host.update_controls()
        self._changed()
        return sweep_id

    def stop(self) -> None:
        if self.jobs.stop():
            self.host.hold("stopping the sweep after this forward…")

    def _on_started(self, sweep_id: int, start: dict) -> None:
        if not self.jobs.current(sweep_id):
            return
        self.run = start["run"]
        self.sweep = self.run.sweep
        self.notice = start["notice"] or ""
        # refused on this model before reading, or finished before a continuation: ended already
        self.done = {i for i, c in enumerate(self.sweep.configurations) if c.run.error or c.finished}
        self._changed()

    def _on_configuration(self, sweep_id: int, index: int) -> None:
        if not self.jobs.current(sweep_id):
            return
        self.done.add(index)
        self._changed()

    def _on_failed(self, sweep_id: int, message: str) -> None:
        if self.jobs.current(sweep_id):
            self.host.show_error(f"Cannot choose: {message}")

    def _on_finished(self, sweep_id: int) -> None:
        if not self.jobs.end(sweep_id):
            return
        self.run = None
        self.ticker.stop()
        self.host.update_controls()
        self._dirty = True
        self.host.redraw()
        if self.continuing is not None and self.sweep is not None and not self.sweep.cancelled:
            self._finish_journal(self.continuing)
        self.sigDone.emit(sweep_id)

    # -- a sweep a journal holds ----------------------------------------------------------------------

    def offer_to_continue(self, kept, journal: Path) -> None:
        """A sweep's journal opened (`kvviz choose --out` killed or stopped, a window's sweep stopped or killed, or a
        sweep continued here): ask to continue it on the loaded model, as `kvviz choose --resume` would."""
        if not isinstance(kept, Sweep) or not kept.cancelled or self.busy:
            return
        done = sum(1 for c in kept.configurations if c.status != "cancelled")
        total = len(kept.configurations)
        kept_as = ("File ▸ Save sweep keeps it once it ends" if unsaved.holds(journal) else
                   "The sweep's files are written beside the journal when it ends")
        self.offer = self.host.ask(
            "Continue this sweep?",
            f"{journal.name} holds a sweep of {kept.model.get('name', '?')} that stopped after {done} of "
            f"{counted(total, 'configuration')}. Continue it with the model loaded here? The configurations that "
            f"finished are kept as measured; the exact cache reads the text again, then the rest. {kept_as}.",
            "Continue", lambda: self.continue_sweep(journal))

    def continue_sweep(self, journal: Path) -> int | None:
        """Continue the sweep `journal` holds (opened: its text chosen in the Document box); its id, or None (and
        a message) while something runs or no model is loaded."""
        if self.busy or self.host.model.card is None or self.sweep is None:
            self.host.show_error("Cannot continue the sweep: " + ("something is running" if self.busy else
                                                                   "load a model first"))
            return None
        return self._begin({"document": self.document_panel.document(), "tokens": self.sweep.document.get("tokens"),
                            "journal": journal})

    def _finish_journal(self, journal: Path) -> None:
        """A continued sweep ended: its files beside its journal, as `kvviz choose --out` writes them; then the
        journal goes. But in the folder of unsaved work, where the journal stays for the folder's rule (the tab shows
        the sweep: File ▸ Save sweep)."""
        if unsaved.holds(journal):
            return
        if self.save(journal.parent):
            journal.unlink(missing_ok=True)

    def pick(self, index: int) -> None:
        """Show configuration `index`'s curves along the text (a finished one's: one stopped part-way is on no
        plot, and its row says so)."""
        if self.sweep is not None and index in self.done and self.sweep.configurations[index].finished:
            self.selected = index
            self._changed()

    def _changed(self) -> None:
        self._dirty = True
        self.sigChanged.emit()

    # -- kept sweeps ----------------------------------------------------------------------------------

    def open(self, sweep: Sweep) -> Sweep | None:
        """Show a kept sweep in place of the one on screen, its text named in the Document box; None (and a
        message) while a sweep runs."""
        if self.busy:
            self.host.show_error("A sweep is running: stop it before opening a sweep file.")
            return None
        self.sweep, self.opened, self.selected, self.notice = sweep, True, None, sweep.document.get("cut") or ""
        self.done = set(range(len(sweep.configurations)))
        self.document_panel.show_record(sweep.document, "the opened sweep")
        # what it asked, in the Controls: Choose asks it again (the tokens changed bring the default grid back)
        self.question_panel.show_question(sweep.question)
        self.asked_panel.blockSignals(True)  # its toggle would ask for the default grid in place of the sweep's
        self.asked_panel.show_asked(sweep.asked)
        self.asked_panel.blockSignals(False)
        self.config_panel.show_configurations([(c.run.strategy["name"], dict(c.run.strategy.get("options") or {}))
                                               for c in sweep.configurations])
        self._changed()
        return sweep

    def save(self, folder: str | os.PathLike) -> list[Path]:
        """File ▸ Save sweep: the sweep on screen as `kvviz choose --out` keeps it (`sweep_report.keep`):
        sweep.json (kvviz-sweep), sweep.csv, report.md and the frontier picture as frontier.png and frontier.svg;
        [] (and a message saying why) when there is nothing to save or it cannot be written."""
        if self.busy or self.sweep is None:
            self.host.tell("Nothing to save", "Stop the sweep first." if self.busy else
                           "Choose first (Controls ▸ Choose), or open a sweep file.")
            return []
        folder, plot = Path(folder), self.view.frontier_plot

        def write() -> list[Path]:
            folder.mkdir(parents=True, exist_ok=True)
            figures = {}
            if plot.has_data():
                png = folder / "frontier.png"
                if not plot.export_image().save(str(png)):
                    raise OSError(f"could not write {png}")
                figures = {"png": png, "svg": plot.export_svg(folder / "frontier.svg")}
            return sweep_report.keep(self.sweep, folder, figures)

        return self.host.write("the sweep", write, folder, lambda written: ", ".join(p.name for p in written)) or []

    def _ask_save(self) -> None:
        folder = self.host.dialogs.folder("sweeps", "Save sweep into folder")
        if folder:
            self.save(folder)

    # -- drawing --------------------------------------------------------------------------------------

    def states(self) -> list[str]:
        """Each configuration's state in the table's words."""
        if self.sweep is None:
            return []
        unfinished = WAITING if self.busy else NOT_RUN
        return [c.status if i in self.done else unfinished for i, c in enumerate(self.sweep.configurations)]

    def answered(self) -> Sweep | None:
        """The sweep the answer is read from: while (or after) a sweep ran here, only the configurations that
        ended, so that the ones still waiting are not taken for failures."""
        if self.sweep is None or self.opened:
            return self.sweep
        s = self.sweep
        ended = [c for i, c in enumerate(s.configurations) if i in self.done]
        return Sweep(s.model, s.document, s.question, ended, s.speed, s.cancelled)

    def redraw_parts(self) -> list:
        return [self._draw] if self._dirty else []

    def plots(self) -> list:
        return self.view.plots

    def _draw(self) -> None:
        self._dirty = False
        self.view.redraw(self.sweep, self.states(), self.selected, self.header(), self.answered())

    def header(self) -> str:
        """What the sweep is and where it stands: the model and text, then its progress or how it ended."""
        if self.busy and self.run is None:
            return "reading the text and building the caches…"
        if self.sweep is None:
            return ""
        doc = self.sweep.document
        title = doc.get("title") or doc.get("name") or "?"
        tokens = f", {doc['tokens']:,} tokens" if doc.get("tokens") else ""
        line = f"{escape(self.sweep.model.get('name') or '?')} reading {escape(title)}{tokens}: "
        if self.opened:
            line += "opened from a file"
        elif self.busy:
            line += escape(self.progress())
        else:
            line += "stopped" if self.sweep.cancelled else "done"
        if self.notice:
            line += f"; {escape(self.notice)}"
        return line

    def progress(self) -> str:
        """"5 of 12 configurations, 31 % of the predictions, 1:02 left" (time left from the predictions' measured
        times; "+" where some configuration has not started, so it is a lower bound)."""
        total = len(self.sweep.configurations)
        text = f"{len(self.done)} of {counted(total, 'configuration')}"
        if self.run is None:
            return text
        made, predictions = self.run.progress()
        if predictions:
            text += f", {100 * made / predictions:.0f} % of the predictions"
        left, complete = self.run.seconds_left()
        if left is not None:
            text += f", {clock(left)}{'' if complete else '+'} left"
        return text

    def status(self) -> str:
        if not self.busy:
            return ""
        return f"choosing: {self.progress()}" if self.sweep is not None else "choosing: reading the text…"

    def enter(self) -> None:
        self._dirty = True
        if not self.config_panel.chosen() and not self.busy:
            self.request_grid()

    def restyle(self, palette) -> None:
        self.view.apply_palette(palette)
        self._dirty = True

    def shutdown(self) -> None:
        self.ticker.stop()
        self.jobs.shutdown()
