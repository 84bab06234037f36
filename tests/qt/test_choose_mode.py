"""The window's Choose mode on the tiny model: a sweep of a few configurations over a short text, run by the
window's own runner on the worker's thread; the frontier, the table, the curves, Stop, kept sweep files."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from PySide6.QtCore import QPointF, Qt

from kvviz.files import frontier
from kvviz.files.sweep import read_journal
from kvviz.files.sweep_report import TIMED_COLUMNS, by_memory
from kvviz.qt import unsaved
from tests.qt.conftest import load, tab

TOKENS = 32  # a batched read costs about 0.3 s a forward here (the engine's), so the text is short
TRIED = {"dynamic", "sliding", "sink"}  # the configurations of the default grid a test keeps ticked


def ready(qtbot, window):
    """The tiny model loaded, the Choose mode on screen with its default grid for TOKENS tokens, ticked down to
    TRIED at the grid's smallest budget (three configurations)."""
    load(qtbot, window)
    window.set_mode("choose")
    mode = window.modes["choose"]
    mode.document_panel.tokens.setValue(TOKENS)
    with qtbot.waitSignal(mode.runner.sigGrid, timeout=30000):
        mode.request_grid()
    qtbot.waitUntil(lambda: mode.config_panel.list.count() > 0)
    seen: set[str] = set()
    items = mode.config_panel.list
    for i in range(items.count()):
        name, _ = items.item(i).data(Qt.ItemDataRole.UserRole)
        keep = name in TRIED and name not in seen
        seen.add(name)
        if name != "dynamic":
            items.item(i).setCheckState(Qt.CheckState.Checked if keep else Qt.CheckState.Unchecked)
    assert [n for n, _ in mode.config_panel.chosen()] == ["dynamic", "sliding", "sink"]
    return mode


def test_a_sweep_draws_its_frontier_live_and_keeps_its_files(window, qtbot, tmp_path):
    window.resize(1280, 720)  # the smallest size the window is laid out for: the axis labels are whole there
    mode = ready(qtbot, window)
    assert window.views.tabText(tab(window, "choose")) == "Choose" and mode.choose_button.isVisibleTo(window)

    # a budget that does not read: the accepted forms, nothing starts, nothing typed is lost
    mode.question_panel.budget.setText("four gigs")
    assert mode.start() is None and not mode.busy
    assert "4GiB" in window.last_error and "four gigs" in window.last_error
    assert mode.question_panel.budget.text() == "four gigs" and len(mode.config_panel.chosen()) == 3
    mode.question_panel.budget.setText("1GiB")

    points_seen = []  # (configurations ended, points drawn) each time one finishes

    def drawn():
        window.redraw()
        points_seen.append((len(mode.done), len(mode.view.frontier_plot._placed)))

    mode.sigChanged.connect(drawn)
    with qtbot.waitSignal(mode.sigDone, timeout=120000):
        assert mode.start() is not None
    mode.sigChanged.disconnect(drawn)
    sweep = mode.sweep
    assert [c.status for c in sweep.configurations] == ["finished"] * 3, window.last_error
    # the points appeared one by one, as configurations finished
    counts = sorted({points for done, points in points_seen if done})
    assert counts[0] < 3 and counts[-1] == 3

    window.redraw()
    plot = mode.view.frontier_plot
    line = frontier.frontier(sweep)
    xs, ys = plot.frontier_line.getData()
    assert list(xs) == [math.log10(frontier.memory(c)) for c in line]
    assert list(ys) == [100 * frontier.quality_loss(sweep, c) for c in line]
    assert plot.tolerance_line.value() == 5.0 and plot.budget_line.value() == math.log10(2**30)
    assert plot.axis_label("left") == "perplexity change (%)"
    assert any("decode speed" in t for t in plot.legend_bar.texts())
    answer = frontier.answer(sweep)
    shown = mode.view.answer.text()
    assert answer.sentences[0].split(":")[0] in shown.replace("&#x27;", "'").replace("&#39;", "'")

    # the table: sorted by memory at the target, every cell known
    table = mode.view.table
    assert table.rows == by_memory(sweep)
    memories = [frontier.memory(sweep.configurations[i]) for i in table.rows]
    assert memories == sorted(memories)
    assert all(table.row_text(r)[-1] == "finished" for r in range(3))

    # hover a point: its card; click it: its curves
    smallest = table.rows[0]
    x, y = next((px, py) for i, px, py in plot._placed if i == smallest)
    assert sweep.configurations[smallest].label in plot.hover_text(x, y)
    assert plot.nearest(x, y) == smallest
    scene = plot.plot.vb.mapViewToScene(QPointF(x, y))
    where = plot.widget.mapFromScene(scene)
    with qtbot.waitSignal(plot.sigPicked, timeout=5000) as picked:
        qtbot.mouseClick(plot.widget.viewport(), Qt.MouseButton.LeftButton, pos=where)
    assert picked.args == [smallest]
    window.redraw()
    assert mode.selected == smallest and mode.view.curves.isVisibleTo(window)
    for curves in mode.view.curve_plots:
        assert curves.has_data() and len(curves.curve.getData()[0]) > 0
    perplexity = mode.view.curve_plots[0].curve.yData  # the data drawn (on a log axis: getData gives its log10)
    assert math.isclose(perplexity[-1], sweep.configurations[smallest].summary()["perplexity"], rel_tol=1e-6)
    assert table.row_text(table.currentRow())[0] == sweep.configurations[smallest].run.strategy["name"]

    # File > Save sweep: the sweep file, the CSV and the picture; it opens again into the mode
    actions = window.file_actions
    written = mode.save(tmp_path / "kept")
    assert sorted(p.name for p in written) == ["frontier.png", "frontier.svg", "report.md", "sweep.csv", "sweep.json"]
    with open(tmp_path / "kept" / "sweep.csv", encoding="utf-8") as f:
        assert len(list(csv.DictReader(f))) == 3
    window.set_mode("local")
    assert actions.open_trace(tmp_path / "kept" / "sweep.json") is not None
    assert window.mode.key == "choose" and mode.opened
    window.redraw()
    assert table.rows == by_memory(mode.sweep) and len(plot._placed) == 3 and "opened from a file" in mode.header()
    # the Controls show what it asked: Choose asks it again
    assert [n for n, _ in mode.config_panel.chosen()] == ["dynamic", "sliding", "sink"]
    assert mode.question_panel.budget.text() == "1.00GiB" and not mode.asked_panel.isChecked()

    # a damaged sweep file: its field named, what is on screen stays
    data = json.loads((tmp_path / "kept" / "sweep.json").read_text(encoding="utf-8"))
    data["configurations"][1]["kl"] = data["configurations"][1]["kl"][:-1]
    bad = tmp_path / "damaged.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    on_screen = mode.sweep
    assert actions.open_trace(bad) is None
    assert "damaged.json" in actions.last_message and "kl" in actions.last_message
    assert "Error:" not in actions.last_message
    actions.message_box.close()
    assert mode.sweep is on_screen and len(plot._placed) == 3


def test_stop_keeps_the_finished_configurations(window, qtbot):
    mode = ready(qtbot, window)

    def stop_after_first():
        if mode.done and mode.busy:
            mode.stop()

    mode.sigChanged.connect(stop_after_first)
    with qtbot.waitSignal(mode.sigDone, timeout=120000) as done:
        assert mode.start() is not None
    mode.sigChanged.disconnect(stop_after_first)
    window.redraw()
    sweep = mode.sweep
    assert sweep.cancelled and sweep.configurations[0].finished
    finished = [i for i, c in enumerate(sweep.configurations) if c.finished and c.target is not None]
    assert len(finished) < 3
    # its journal, in the folder of unsaved work until the window closes, holds the configurations that finished
    journal = read_journal(unsaved.folder() / f"sweep-{os.getpid()}-{done.args[0]}.json.journal")
    assert journal.finished == finished and journal.sweep.cancelled
    assert [table(journal.sweep)[i] for i in finished] == [table(sweep)[i] for i in finished]
    assert sorted(i for i, _, _ in mode.view.frontier_plot._placed) == finished
    states = mode.states()
    assert all(states[i] in ("not run", "cancelled") for i in range(3) if i not in finished)
    assert "stopped" in mode.header() and "stopped before its end" in mode.view.answer.text()
    assert mode.choose_button.isEnabled() and not mode.stop_button.isEnabled()
    # a point clicked that never finished opens nothing
    unfinished = next(i for i in range(3) if i not in finished)
    mode.pick(unfinished)
    assert mode.selected is None


def test_a_sweep_journal_opened_offers_to_continue_and_ends_as_kvviz_choose_does(window, qtbot, tmp_path, monkeypatch):
    """A sweep `kvviz choose --out` stopped after its exact cache: File ▸ Open of its journal shows it and asks
    to continue; continued here (the engine's resume, as --resume runs it), its files are those of a sweep that was
    never stopped."""
    from kvviz.files.sweep import SweepJournal
    from tests.commands import kvviz

    args = ["choose", "--model", "tiny", "--tokens", TOKENS, "--context", "512", "--budget", "1GiB", "--rows", "2",
            "--configs", "sliding:window=8,sink:sink_tokens=2:window=6"]
    assert kvviz(*args, "--out", tmp_path / "whole").returncode == 0
    finished = SweepJournal.finished

    def ctrl_c_after_one(journal, index, elapsed_s):  # as a terminal's Ctrl-C, between two configurations
        if index == 1:
            raise KeyboardInterrupt
        finished(journal, index, elapsed_s)

    monkeypatch.setattr(SweepJournal, "finished", ctrl_c_after_one)
    assert kvviz(*args, "--out", tmp_path / "stopped").returncode == 130
    monkeypatch.undo()
    journal = tmp_path / "stopped" / "sweep.json.journal"
    assert journal.exists()

    load(qtbot, window)
    assert window.file_actions.open_trace(journal) is not None
    mode = window.modes["choose"]
    assert window.mode is mode and mode.offer is not None
    assert "stopped after 1 of 3 configurations" in mode.offer.text()
    (go,) = [b for b in mode.offer.buttons() if b.text() == "Continue"]
    with qtbot.waitSignal(mode.sigDone, timeout=120000):
        go.click()
    assert not journal.exists(), window.last_error
    assert [c.status for c in mode.sweep.configurations] == ["finished"] * 3

    def rows(folder):
        with (folder / "sweep.csv").open() as f:
            return [{k: v for k, v in row.items() if k not in TIMED_COLUMNS} for row in csv.DictReader(f)]

    assert rows(tmp_path / "stopped") == rows(tmp_path / "whole")
    assert (tmp_path / "stopped" / "frontier.png").exists()



def test_a_window_sweep_is_journaled_and_a_killed_one_continues_to_the_whole_table(window, qtbot):
    """Every sweep of the window is journaled in the folder of unsaved work as configurations finish. A window killed
    after any of them leaves that journal: opened, it offers to continue, and the continued sweep's table is that of
    the sweep never stopped (its decode speed aside); the journal, written on, then holds it all."""
    mode = ready(qtbot, window)
    mode.question_panel.budget.setText("1GiB")  # the free memory changes between sweeps, and with it what fits
    with qtbot.waitSignal(mode.sigDone, timeout=120000) as done:
        assert mode.start() is not None
    whole = mode.sweep
    assert [c.status for c in whole.configurations] == ["finished"] * 3, window.last_error
    own = unsaved.folder() / f"sweep-{os.getpid()}-{done.args[0]}.json.journal"
    assert read_journal(own).finished == [0, 1, 2] and table(read_journal(own).sweep) == table(whole)

    # what a kill -9 after each configuration's line leaves (the header comes with the first): those lines, in a dead
    # window's name
    lines = own.read_bytes().splitlines(keepends=True)
    for finished in range(1, len(lines) - 1):
        left = dead_journal(b"".join(lines[: finished + 1]))
        try:
            kept = read_journal(left)
            assert kept.finished == list(range(finished)) and kept.sweep.cancelled
            assert left in window.say_left_behind()

            assert window.file_actions.open_trace(left) is not None
            assert mode.opened and mode.offer is not None
            text = mode.offer.text()
            assert f"stopped after {finished} of 3 configurations" in text and "File ▸ Save sweep" in text
            (go,) = [b for b in mode.offer.buttons() if b.text() == "Continue"]
            with qtbot.waitSignal(mode.sigDone, timeout=120000):
                go.click()
            assert [c.status for c in mode.sweep.configurations] == ["finished"] * 3, window.last_error
            assert table(mode.sweep) == table(whole), finished
            # in the folder of unsaved work the journal stays (File ▸ Save sweep keeps the sweep), holding it whole
            assert read_journal(left).finished == [0, 1, 2] and not read_journal(left).sweep.cancelled
            assert not (unsaved.folder() / "sweep.json").exists()
        finally:
            left.unlink(missing_ok=True)


def dead_journal(content: bytes) -> Path:
    """A sweep journal holding `content` in the folder of unsaved work, as a window that was killed left it."""
    from kvviz.files.jsonfile import process_alive

    dead = next(pid for pid in range(2**22 - 1, 2**21, -1) if not process_alive(pid))
    left = unsaved.folder() / f"sweep-{dead}-1.json.journal"
    left.write_bytes(content)
    return left


def table(sweep) -> list[dict[str, str]]:
    """The sweep's table as the window and the command line write it, but for its timings (decode speed, time to first
    token)."""
    from kvviz.files.sweep_report import cells

    return [{k: v for k, v in cells(sweep, c).items() if k not in ("decode", "ttft")} for c in sweep.configurations]
