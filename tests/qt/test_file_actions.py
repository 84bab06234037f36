"""File menu: open and save traces, drag and drop, CSV, plot and window exports (real files, no dialogs)."""

from __future__ import annotations

import csv

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QMessageBox

from kvviz.files.trace import load


def _rows(win):
    table = win.runs_table
    return [[table.item(r, c).text() for c in range(table.columnCount())] for r in range(table.rowCount())]


def test_menu_entries(window):
    texts = [a.text().replace("&", "") for a in window.menuBar().actions()[0].menu().actions() if a.text()]
    for wanted in ("Open trace or session…", "Save selected run as trace…", "Export runs table as CSV…",
                   "Export plots as PNG/SVG…", "Save window as PNG…", "Quit"):
        assert wanted in texts
    assert sum(t.startswith("Save selected run") for t in texts) == 1
    assert window.acceptDrops()


def test_save_open_drop_and_exports(window, drive, qtbot, tmp_path):
    actions = window.file_actions
    drive.load(window, "tiny")
    run_id = drive.run(window, "dynamic", tokens=10)
    saved = actions.save_selected_trace(tmp_path / "run.json")
    assert saved is not None and saved.stat().st_size > 0
    original = load(saved)
    assert len(original.steps) == len(window.store.runs[run_id].trace.steps)

    opened = actions.open_trace(saved)
    assert opened is not None and opened in window.store.runs
    assert len(window.store.runs[opened].trace.steps) == len(original.steps)
    assert window.runs_table.rowCount() == 2
    assert window.runs_table.row_text(opened)[1:] == window.runs_table.row_text(run_id)[1:]  # all but the run

    # a malformed file and a foreign JSON file: a message, nothing in the window changes
    before = _rows(window)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"hello": 1}', encoding="utf-8")
    for path in (bad, foreign, tmp_path / "missing.json"):
        assert actions.open_trace(path) is None
        assert path.name in actions.last_message
        box = actions.message_box
        assert isinstance(box, QMessageBox) and box.isVisible() and path.name in box.text()
        box.close()
        assert _rows(window) == before

    assert actions.open_trace(saved) is not None and actions.open_trace(bad) is None
    assert window.runs_table.rowCount() == 3
    # drag and drop of a trace file onto the window
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(saved))])
    drop = QDropEvent(QPointF(20, 20), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    # (Qt delivers only real, spontaneous drag events through notify; call the window's filter as Qt would)
    assert actions.eventFilter(window, drop) is True
    assert window.runs_table.rowCount() == 4

    # the CSV has the table's runs, in order, with the same numbers
    csv_path = actions.export_runs_csv(tmp_path / "runs.csv")
    with csv_path.open(encoding="utf-8") as f:
        lines = list(csv.DictReader(f))
    table = window.runs_table
    for line, run in zip(lines, table.run_ids(), strict=True):
        assert line["run"] == table.cell(run, "run") and line["new tokens"] == table.cell(run, "tokens")
        assert line["model"] == table.cell(run, "model") and line["status"] == table.cell(run, "status")

    files = actions.export_plots(tmp_path / "plots")
    # no reference: no fidelity plot; the run generated while the attention view was hidden: none of its plots
    plotted = {"memory_plot", "latency_plot", "cache_map_plot", "layer_bytes_plot", "layer_time_plot"}
    assert {path.name for path in files} == {f"{name}.{kind}" for name in plotted for kind in ("png", "svg")}
    assert window.statusBar().currentMessage().endswith(
        "nothing to draw, left out: Fidelity, Attention of the current token, Attention sink)")
    for path in files:
        assert path.exists() and path.stat().st_size > 200, path
    assert (tmp_path / "plots" / "memory_plot.svg").read_text(encoding="utf-8").lstrip().startswith("<?xml")

    png = actions.save_window_png(tmp_path / "window.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class FakeDialogs:
    """QFileDialog's static functions as kvviz.qt.file_dialogs calls them: each call is noted with the folder it
    starts in, and answers the next path queued (a user choosing it; "" cancels)."""

    def __init__(self):
        self.asked: list[tuple[str, str]] = []  # (caption, where the dialog starts)
        self.answers: list[str] = []

    def _answer(self, caption: str, start: str) -> str:
        self.asked.append((caption, start))
        return self.answers.pop(0) if self.answers else ""

    def getOpenFileName(self, parent, caption, start, filters):  # noqa: N802 - Qt's name
        return self._answer(caption, start), filters

    def getSaveFileName(self, parent, caption, start, filters):  # noqa: N802
        return self._answer(caption, start), filters

    def getExistingDirectory(self, parent, caption, start):  # noqa: N802
        return self._answer(caption, start)


def test_dialogs_start_in_the_last_folder_of_their_kind_also_in_the_next_session(window, settings, tmp_path,
                                                                                  monkeypatch):
    from PySide6.QtCore import QSettings

    from kvviz.files.trace import Trace
    from kvviz.qt import file_dialogs
    from kvviz.qt.recorder import have_ffmpeg
    from tests.qt.test_layer_plots import step

    fake = FakeDialogs()
    monkeypatch.setattr(file_dialogs, "QFileDialog", fake)
    traces, prompts, models = tmp_path / "traces", tmp_path / "prompts", tmp_path / "models"
    for folder in (traces, prompts, models):
        folder.mkdir()
    trace = Trace(model={"name": "m"}, strategy={"name": "dynamic", "options": {}}, prompt="p", prompt_tokens=4,
                  steps=[step(0, 1.0), step(1, 1.0)]).save(traces / "run.json")
    (prompts / "story.txt").write_text("Once upon a time.", encoding="utf-8")
    actions = window.file_actions.actions

    fake.answers = [str(trace)]
    actions["open"].trigger()
    fake.answers = [str(prompts / "story.txt")]
    actions["prompt"].trigger()
    assert window.controls.prompt_panel.text() == "Once upon a time." and window.runs_table.rowCount() == 1
    actions["open"].trigger()  # cancelled
    actions["save"].trigger()
    actions["prompt"].trigger()
    actions["csv"].trigger()
    assert [start for _, start in fake.asked] == [
        "",  # nothing of this kind chosen yet: where Qt starts
        "",  # a prompt is another kind of file
        str(traces),
        str(traces / "run-1.kvviz.json"),  # a save starts there with its name
        str(prompts),
        "runs.csv",
    ]
    # the model chooser's dialogs keep the folder beside the last model chosen
    fake.asked.clear()
    window.controls.model_panel.file_button.click()
    window.settings.setValue("folders/models", str(models))
    window.controls.model_panel.folder_button.click()
    window.modes["server"].panel.sigFolderRequested.emit()
    window.recorder.action.trigger()  # cancelled: nothing is recorded
    recording = f"kvviz.{'mp4' if have_ffmpeg() else 'gif'}"
    assert fake.asked == [("GGUF model file", ""), ("Model folder", str(models)),
                          ("The served model's folder", str(models)), ("Record window to", recording)]
    assert not window.recorder.action.isChecked()

    # the next session starts where this one left off; a folder since removed is forgotten
    settings.sync()
    later = file_dialogs.FileDialogs(QSettings(settings.fileName(), QSettings.Format.IniFormat), window)
    assert later.start("kept") == str(traces) and later.start("prompts") == str(prompts)
    (prompts / "story.txt").unlink()
    prompts.rmdir()
    assert later.start("prompts") == ""


def test_a_journal_a_killed_run_left_opens_as_a_partial_run(window, tmp_path):
    from kvviz.files import evaluation
    from kvviz.files.trace import TraceJournal
    from kvviz.qt.evaluate.view import cells
    from tests.files.test_journal import make_eval, make_trace

    journaled = TraceJournal(tmp_path / "run.json", make_trace(5))
    journaled.update()
    journaled.journal.close()  # as a killed process leaves it
    run_id = window.file_actions.open_trace(journaled.journal.path)
    assert run_id in window.store.runs and len(window.store.runs[run_id].trace.steps) == 5
    assert window.statusBar().currentMessage() == "stopped after 5 of 1,499 tokens; the process ended without saving"
    window.redraw()
    table = window.runs_table
    row = table.row_text(run_id)
    assert "cancelled" in row and "failed" not in row  # stopped, as a run stopped with Stop or Ctrl-C; not failed
    status = table.item(table.run_ids().index(run_id), row.index("cancelled"))
    assert status.toolTip() == "stopped after 5 of 1,499 tokens; the process ended without saving"

    run = make_eval(0)
    kept = evaluation.EvalJournal(tmp_path / "eval-1-dynamic.json", run, {})
    run.records = make_eval(412).records
    kept.update()
    kept.journal.close()
    opened = window.file_actions.open_trace(kept.journal.path)
    assert opened is not None and len(opened.records) == 412 and opened.error.startswith("stopped after 412 of 1,499")
    shown = window.modes["evaluate"].series[-1]
    assert shown.state == "cancelled" and cells(shown)[-1] == f"cancelled: {opened.error}"


def test_the_window_journals_its_runs_until_it_closes(window, drive, tmp_path):
    import os
    import shutil

    from kvviz.files.jsonfile import process_alive
    from kvviz.qt import unsaved

    drive.load(window, "tiny")
    run_id = drive.run(window, "dynamic", tokens=6)
    journal = unsaved.folder() / f"run-{os.getpid()}-{run_id}.json.journal"
    partial = window.file_actions.open_trace(journal)  # what a crash now would leave
    steps = window.store.runs[run_id].trace.steps
    assert [s.token_id for s in window.store.runs[partial].trace.steps] == [s.token_id for s in steps]
    dead = next(pid for pid in range(2**22 - 1, 2**21, -1) if not process_alive(pid))
    left = shutil.copy(journal, unsaved.folder() / f"run-{dead}-1.json.journal")  # a window killed before this one
    assert window.say_left_behind() == [left] and str(unsaved.folder()) in window.statusBar().currentMessage()
    window.close()
    assert not journal.exists() and left.exists()  # closed normally: its own go, the other window's stay
    left.unlink()
