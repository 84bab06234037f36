"""The window's "Evaluate" mode: long-context perplexity of several strategies along one document, live.

`EvaluateMode` owns its widgets (`document_panel` and `list_panel` around the shared strategy picker in its
Controls, `buttons` under them, `view` as the central "Evaluate" tab) and the evaluation on screen: one
`StrategySeries` per strategy. Evaluate sends the request to the `Evaluator`
on the worker's thread (kvviz.qt.evaluate.evaluator), which runs them as `kvviz eval` does (one after another, in
chunks); its answers
arrive as queued signals, and the records themselves are read from the engine's runs when the window
redraws (on its redraw timer, `sigChanged` asks for one). Stop stops every strategy. Kept evaluations
(`kvviz-eval` files) open into the same view, and the one on screen saves as those files and the
summary CSV `kvviz eval --out` writes.

The Tokens and Runs docks belong to the local runs: they step aside while this mode is on screen.
"""

from __future__ import annotations

import json
import os
from html import escape as html_escape
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QWidget

from kvviz.files import evaluation, evaluation_csv
from kvviz.files.evaluation import EvalRun
from kvviz.present import CANCELLED, FAILED, FINAL_STATUSES, FINISHED, NOT_RUN, STARTING, clock, number
from kvviz.qt import unsaved
from kvviz.qt.evaluate.evaluator import Evaluator
from kvviz.qt.evaluate.help import HELP
from kvviz.qt.evaluate.panel import DEFAULT_TOKENS, StrategyListPanel
from kvviz.qt.evaluate.series import StrategySeries
from kvviz.qt.evaluate.view import EvalView
from kvviz.qt.jobs import JobControl
from kvviz.qt.mode_api import FileEntry, Mode, ModeHost
from kvviz.qt.panels.document import DocumentPanel
from kvviz.qt.window_settings import stored_json

# a first evaluation that shows what the mode is for (StreamingLLM's comparison): options set away from defaults
FIRST_STRATEGIES = [
    ("dynamic", {}),
    ("sliding", {"window": 128}),
    ("sink", {"sink_tokens": 4, "window": 124}),
    ("quantized", {"backend": "hqq", "nbits": 2}),
]


def escape(text: str) -> str:
    """Text for the rich-text header (quotes stay as they are: they need no escaping there)."""
    return html_escape(text, quote=False)


class EvaluateMode(Mode):
    key = "evaluate"
    title = "Evaluate"
    short_title = "Evaluate"
    tip = "Strategies read a long document: perplexity and cache memory along it"
    hides_docks = True
    formats = (EvalRun,)
    help = HELP

    sigRequestEvaluate = Signal(int, object)  # to the evaluator: eval id, request
    sigDone = Signal(int)  # eval id: every strategy ended and the last records are drawn

    def __init__(self, host: ModeHost):
        super().__init__(host)
        self.evaluator = evaluator = Evaluator(host.model.worker)
        self.jobs = JobControl(evaluator)
        self.document_panel = DocumentPanel(DEFAULT_TOKENS)
        self.list_panel = StrategyListPanel()
        self.view = EvalView()
        self.evaluate_button = QPushButton("Evaluate")
        self.evaluate_button.setObjectName("runButton")
        self.evaluate_button.setToolTip("Evaluate every strategy in the list on the document, one after another, "
                                        "as kvviz eval does")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the evaluation: the strategies reading keep what they measured, "
                                    "the ones after them do not start")
        self.buttons = QWidget()
        row = QHBoxLayout(self.buttons)
        row.setContentsMargins(9, 0, 9, 0)
        row.addWidget(self.evaluate_button, 2)
        row.addWidget(self.stop_button, 1)
        self.controls = [host.panels.model_panel, self.document_panel, host.panels.strategy_panel, self.list_panel]
        self.file_entries = (FileEntry("evaluation", "Save e&valuation…", self._ask_save),
                             FileEntry("eval_csv", "Export evaluation summary as CS&V…", self._ask_csv))
        self.evaluate_button.clicked.connect(lambda *_: self.start())
        self.stop_button.clicked.connect(lambda *_: self.stop())
        self.list_panel.sigAddRequested.connect(self.add_chosen)
        self.list_panel.sigChanged.connect(host.update_controls)
        host.model.worker.sigReady.connect(self.set_strategies)
        self.document_panel.sigOpenRequested.connect(self._ask_document)
        self.sigRequestEvaluate.connect(evaluator.evaluate)
        # bound methods of this GUI-thread object: queued to the GUI thread
        evaluator.sigStarted.connect(self._on_started)
        evaluator.sigProgress.connect(self._on_progress)
        evaluator.sigNotice.connect(self._on_notice)
        evaluator.sigFinished.connect(self._on_finished)
        evaluator.sigFailed.connect(self._on_failed)
        evaluator.sigUnwritten.connect(self._on_unwritten)

        self.series: list[StrategySeries] = []
        self.active: list[int] = []  # the strategy whose records arrive (none between two)
        self.model: dict = {}  # the card of the model evaluated
        self.document: dict = {}  # the document's record, as the files keep it
        self.notice = ""  # why the document was cut
        self.pause = ""  # what a one-time pause before the first prediction is doing (quanto's kernels)
        self.opened = False  # the evaluation on screen came from files
        self.offer = None  # the question asked when a journal was opened
        self._defaults: dict[str, dict] | None = None
        self._restored_list = False  # the settings held a list (even an empty one): no first list then
        self._dirty = False

    # -- the controls --------------------------------------------------------------------------------

    def set_strategies(self, listing) -> None:
        """The engine's strategies (from the worker): their defaults name the list's entries shortly."""
        self._defaults = {s.name: {o.name: o.default for o in s.options} for s, _, _ in listing}
        self.list_panel.set_defaults(self._defaults)
        for s in self.series:
            s.defaults = self._defaults
        if not self.list_panel.entries() and not self._restored_list:
            available = {s.name for s, ok, _ in listing if ok}
            self.list_panel.set_entries([e for e in FIRST_STRATEGIES if e[0] in available])
        self._dirty = True
        self.sigChanged.emit()

    def add_chosen(self) -> None:
        picker = self.host.panels.strategy_panel
        if picker.current() is not None:
            self.list_panel.add(picker.current(), picker.values())

    def _ask_document(self) -> None:
        self.document_panel.ask(self.host.dialogs, "Open a document to evaluate on", self.host.show_error,
                                "Cannot evaluate on this document")

    def open_document(self, path: str | os.PathLike) -> bool:
        """A user's .txt or .md file as the document; False (and a message saying why) when it cannot be used."""
        return self.document_panel.open_path(path, self.host.show_error, "Cannot evaluate on this document")

    @property
    def busy(self) -> bool:
        return self.jobs.running is not None

    def can_start(self) -> bool:
        return self.evaluate_button.isEnabled()

    def update_controls(self, ready: bool) -> None:
        idle = self.jobs.running is None
        self.evaluate_button.setEnabled(ready and idle and bool(self.list_panel.entries()))
        self.stop_button.setEnabled(not idle)
        self.list_panel.set_enabled(idle)
        self.document_panel.setEnabled(idle)

    # -- evaluating ----------------------------------------------------------------------------------

    def start(self, extra_settings=None) -> int | None:
        """Evaluate the list's strategies on the document; the evaluation's id, or None if it cannot start."""
        if not self.evaluate_button.isEnabled():
            return None
        return self._begin({"document": self.document_panel.document(), "tokens": self.document_panel.token_count(),
                            "strategies": self.list_panel.entries()})

    def _begin(self, request: dict) -> int:
        entries, document = request["strategies"], request["document"]
        eval_id = self.jobs.begin()
        self.active, self.opened = [], False
        self.model = dict(self.host.model.card or {})
        self.document = document.describe()
        self.notice = self.pause = ""
        self.series = [StrategySeries(i, {"name": n, "options": o}) for i, (n, o) in enumerate(entries)]
        for s in self.series:
            s.defaults = self._defaults
        self.series[0].state = STARTING
        self.host.hide_error()
        self.sigRequestEvaluate.emit(eval_id, request)
        self.host.update_controls()
        self._changed()
        return eval_id

    def stop(self) -> None:
        if self.jobs.stop():
            self.host.hold("stopping the evaluation after this forward…")

    def _on_started(self, eval_id: int, start: dict) -> None:
        if not self.jobs.current(eval_id):
            return
        self.document = start["document"]
        self.notice = start["notice"] or ""
        if start["notice"]:
            self.host.note(start["notice"])
        for s, run, error in zip(self.series, start["runs"], start["errors"], strict=True):
            if run is not None:
                s.attach(run)
            if error is not None:
                s.finish(FAILED, error)
        self._changed()

    def _on_progress(self, eval_id: int, active: list[int]) -> None:
        if not self.jobs.current(eval_id):
            return
        for index in self.active:
            s = self.series[index]
            if index not in active and s.state not in FINAL_STATUSES:  # its reading has ended: drawn whole
                s.sync()
                s.finish(FAILED if s.run is not None and s.run.error else FINISHED)
        for index in active:
            if self.series[index].state not in FINAL_STATUSES and not self.series[index].n:
                self.series[index].state = STARTING
        self.active = list(active)
        self._changed()

    def _on_notice(self, eval_id: int, message: str) -> None:
        if self.jobs.current(eval_id):
            self.pause = message
            self._changed()

    def _on_finished(self, eval_id: int, states: list[str]) -> None:
        if not self.jobs.end(eval_id):
            return
        for s, state in zip(self.series, states, strict=True):
            s.sync()
            s.finish(state)
        self.pause = ""
        failed = [s for s in self.series if s.state == FAILED]
        if failed:
            self.host.show_error("; ".join(f"{s.short_label()} failed: {s.error}" for s in failed))
        self._ended(eval_id)

    def _on_failed(self, eval_id: int, message: str) -> None:
        if not self.jobs.end(eval_id):
            return
        for s in self.series:
            s.finish(NOT_RUN)
        self.host.show_error(f"Cannot evaluate: {message}")
        self._ended(eval_id)

    def _on_unwritten(self, eval_id: int, message: str) -> None:
        if self.jobs.current(eval_id):
            self.host.show_error(f"The continued evaluation is on screen, but {message}")

    def _ended(self, eval_id: int) -> None:
        self.host.update_controls()
        self._dirty = True
        self.host.redraw()
        self.sigDone.emit(eval_id)

    def _changed(self) -> None:
        self._dirty = True
        self.sigChanged.emit()

    # -- kept evaluations --------------------------------------------------------------------------

    def open(self, run: EvalRun) -> EvalRun | None:
        """Show a kept evaluation: beside the files opened before it when they read the same document with the
        same model (a saved folder opens file by file), else in place of what is on screen. None while an
        evaluation runs."""
        if self.busy:
            self.host.show_error("An evaluation is running: stop it before opening an evaluation file.")
            return None
        if not self.opened or not self._same_reading(run):
            self.series = []
        self.opened = True
        self.model, self.document = dict(run.model), dict(run.document)
        self.document_panel.show_record(run.document, "the opened evaluation")
        self.notice = run.document.get("cut") or ""
        # the same strategy opened again takes its own place
        same = next((s.index for s in self.series if s.strategy == run.strategy), len(self.series))
        series = StrategySeries.from_run(same, run)
        series.defaults = self._defaults
        self.series[same : same + 1] = [series]
        self._changed()
        return run

    def offer_to_continue(self, kept, journal: Path) -> None:
        """An evaluation's journal opened (`kvviz eval --out` killed or stopped, or a window that ended without
        closing): ask to continue it on the loaded model, as `kvviz eval --resume` would."""
        if not isinstance(kept, EvalRun) or kept.status != "cancelled" or self.busy:
            return
        planned = kept.document.get("tokens")
        of = f" of {planned - 1:,}" if isinstance(planned, int) else ""
        kept_as = ("File ▸ Save evaluation keeps it once it ends" if unsaved.holds(journal) else
                   "Its file is written beside the journal when it ends, and the folder's summary.csv again")
        self.offer = self.host.ask(
            "Continue this evaluation?",
            f"{journal.name} holds {kept.label()} on {kept.model.get('name', '?')}, stopped after "
            f"{len(kept.records):,}{of} tokens. Continue it with the model loaded here? A cache that keeps every "
            f"token continues after its last whole forward; one that evicts or quantizes starts again. {kept_as}.",
            "Continue", lambda: self.continue_evaluation(kept, journal))

    def continue_evaluation(self, kept: EvalRun, journal: Path) -> int | None:
        """Continue the evaluation `journal` holds (`kept`, opened: its text chosen in the Document box); its id, or
        None (and a message) while something runs or no model is loaded."""
        if self.busy or self.host.model.card is None:
            self.host.show_error("Cannot continue the evaluation: " + ("something is running" if self.busy else
                                                                        "load a model first"))
            return None
        return self._begin({"document": self.document_panel.document(), "tokens": kept.document.get("tokens"),
                            "strategies": [(kept.strategy["name"], dict(kept.strategy["options"]))],
                            "journal": journal})

    def _same_reading(self, run: EvalRun) -> bool:
        if not self.series:
            return False
        keys = ("name", "tokens", "first_token_id")
        return (run.model.get("name") == self.model.get("name")
                and all(run.document.get(k) == self.document.get(k) for k in keys))

    def runs(self) -> list[tuple[int, EvalRun]]:
        """(index, run) of every strategy that has a run to keep (refused ones have none)."""
        return [(s.index, s.run) for s in self.series if s.run is not None and s.state != NOT_RUN]

    def save(self, folder: str | os.PathLike) -> list[Path]:
        """File ▸ Save evaluation: one kvviz-eval file per strategy evaluated and summary.csv in `folder`, as
        `kvviz eval --out` writes them; [] (and a message saying why) when there is nothing to save or it cannot
        be written."""
        if self.busy or not self.runs():
            self.host.tell("Nothing to save", "Stop the evaluation first." if self.busy else
                           "Evaluate some strategies first (Controls ▸ Evaluate), or open an evaluation file.")
            return []
        folder = Path(folder)

        def write() -> list[Path]:
            folder.mkdir(parents=True, exist_ok=True)
            written, rows = [], []
            for index, run in self.runs():
                path = run.save(folder / evaluation_csv.file_name(index, run.strategy))
                written.append(path)
                rows.append(evaluation_csv.summary_row(run, str(path)))
            return [*written, evaluation_csv.write_summary_csv(rows, folder / "summary.csv")]

        return self.host.write("the evaluation", write, folder,
                               lambda written: f"{len(written) - 1} evaluation files and summary.csv") or []

    def export_csv(self, path: str | os.PathLike) -> Path | None:
        """File ▸ Export evaluation summary: one row per strategy (its file column empty: nothing was saved)."""
        runs = [run for _, run in self.runs()]
        if not runs:
            self.host.tell("Nothing to export", "Evaluate some strategies first, or open an evaluation file.")
            return None
        return self.host.write("the summary", lambda: evaluation_csv.write_summary_csv(
            [evaluation_csv.summary_row(run) for run in runs], path), path, lambda _: f"{len(runs)} strategies")

    def _ask_save(self) -> None:
        folder = self.host.dialogs.folder("evaluations", "Save evaluation into folder")
        if folder:
            self.save(folder)

    def _ask_csv(self) -> None:
        path = self.host.dialogs.save_file("tables", "Export evaluation summary", "summary.csv", "CSV (*.csv)")
        if path:
            self.export_csv(path)

    # -- drawing --------------------------------------------------------------------------------------

    def plots(self) -> list:
        return self.view.plots

    def redraw_parts(self) -> list:
        return [self._draw] if self._dirty or self.busy else []

    def _draw(self) -> None:
        live = self.busy
        self._dirty = False
        for index in self.active if live else ():
            self.series[index].sync()
        self.view.redraw(self.series, self.header(), live)

    def header(self) -> str:
        """The lines above the plots: model and document; what runs now or how it ended; why the document
        was cut (a line of its own from the start, so that the plots do not move while it runs)."""
        if not self.series:
            return self.view.summary.text()
        doc = self.document
        title = doc.get("title") or doc.get("name") or "?"
        by = f" by {doc['author']}" if doc.get("author") else ""
        tokens = f", {doc['tokens']:,} tokens ({doc['tokens'] - 1:,} predicted)" if doc.get("tokens") else ""
        lines = [f"<b>{escape(self.model.get('name') or '?')}</b> reading <b>{escape(title)}</b>{escape(by)}{tokens}"]
        if self.opened:
            lines.append("opened from files")
        elif self.busy:
            lines.append(escape(self.pause or self.progress()))
        else:
            states = [s.state for s in self.series]
            lines.append("cancelled" if CANCELLED in states or NOT_RUN in states else "done")
        if self.notice:
            lines.append(f"<i>{escape(self.notice)}</i>")
        return "<br>".join(lines)

    def progress(self) -> str:
        """"strategy 2 of 4, sliding (window=128): 312 of 599 tokens, 21.3 tokens/s, 0:14 left, about 1:02 in
        all"; times from each prediction's measured time (kvviz.files.evaluation.seconds_left), as `kvviz eval` says
        them."""
        active = [self.series[i] for i in self.active if self.series[i].total is not None]
        if not active:
            return "reading the document and building the caches…"
        first = active[0]
        text = f"strategy {first.index + 1} of {len(self.series)}, {first.short_label()}"
        text += f": {first.n:,} of {first.total:,} tokens"
        ms = evaluation.ms_per_prediction(first.run)
        if ms is None:
            return text
        left, _ = evaluation.seconds_left([(first.run, first.total)])
        text += f", {number(1000.0 / ms)} tokens/s, {clock(left)} left"
        later = [s for s in self.series if s.run is not None and s.state not in FINAL_STATUSES and s not in active]
        if later:
            runs = [(s.run, s.total if s.state not in FINAL_STATUSES else len(s.run.records))
                    for s in self.series if s.run is not None and s.total is not None]
            in_all, complete = evaluation.seconds_left(runs)
            text += f", about {clock(in_all)}{'' if complete else '+'} in all"
        return text

    def figures(self) -> tuple[float | None, None, int | None]:
        """For the status bar while an evaluation runs or shows: the strategy tokens read per second by the
        strategies reading now, and the bytes their caches hold together (None where not measured yet)."""
        active = [self.series[i] for i in self.active] if self.busy else []
        rates = [s.tokens_per_s() for s in active]
        caches = [s.cache_bytes() for s in active]
        rate = sum(rates) if rates and None not in rates else None
        cache = sum(caches) if caches and None not in caches else None
        return rate, None, cache

    def status(self) -> str:
        return f"evaluating: {self.progress()}" if self.busy else ""

    # -- the settings --------------------------------------------------------------------------------

    def enter(self) -> None:
        """On screen again: drawn whole at the next redraw."""
        self._dirty = True

    def save_settings(self, settings) -> None:
        settings.setValue("evaluate/document", json.dumps(self.document_panel.state()))
        settings.setValue("evaluate/strategies", json.dumps(self.list_panel.entries()))

    def restore_settings(self, settings) -> None:
        self.document_panel.set_state(stored_json(settings.value("evaluate/document"), {}))
        entries = stored_json(settings.value("evaluate/strategies"), None)
        if isinstance(entries, list):
            self._restored_list = True
            self.list_panel.set_entries([(str(e[0]), dict(e[1])) for e in entries
                                         if isinstance(e, list) and len(e) == 2 and isinstance(e[1], dict)])

    def restyle(self, palette) -> None:
        """Plots, table and list in the theme's colours."""
        self.view.apply_palette(palette)
        self.list_panel.restyle()
        self._dirty = True

    def shutdown(self) -> None:
        self.jobs.shutdown()
