"""The Choose mode asks questions too (Controls ▸ Ask questions too, as `kvviz choose --task/--qa`): a real sweep of the
tiny model with niah_single_1 items; the accuracy plot draws each configuration's share right per regime against its
memory, and the Answers tab lists every question asked, right or wrong, with the model's answer, all as the sweep
recorded them. A bad question file gets the command's message and loses nothing chosen before."""

from __future__ import annotations

import math
import os

from PySide6.QtCore import Qt

from kvviz.files import frontier
from kvviz.qt.choose.answers import held_text, result_text
from tests.qt.test_choose_mode import ready


def test_a_sweep_with_task_items_shows_accuracy_and_each_answer(window, qtbot, tmp_path):
    mode = ready(qtbot, window)
    panel = mode.asked_panel
    assert not panel.isChecked() and mode.view.below.tabBar().isHidden()

    # a bad question file: the command's own message (line and field), the tasks still asked
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "a", "question": "b"}\n', encoding="utf-8")
    assert not mode.open_questions(bad)
    assert "line 1" in window.last_error and "answers" in window.last_error and panel.questions is None

    panel.setChecked(True)
    panel.items.setValue(1)
    panel.length.setValue(160)
    panel.raw.setChecked(True)
    panel.regimes["query-aware"].setChecked(True)
    assert panel.task_names() == ["niah_single_1"]
    with qtbot.waitSignal(mode.runner.sigGrid, timeout=30000):  # the grid's budgets follow the items' length
        mode.request_grid()
    qtbot.waitUntil(lambda: mode.config_panel.list.count() > 0)
    kept = False
    for i in range(mode.config_panel.list.count()):
        item = mode.config_panel.list.item(i)
        name, _ = item.data(Qt.ItemDataRole.UserRole)
        if name != "dynamic":
            item.setCheckState(Qt.CheckState.Checked if name == "sink" and not kept else Qt.CheckState.Unchecked)
            kept = kept or name == "sink"
    assert [n for n, _ in mode.config_panel.chosen()] == ["dynamic", "sink"]
    mode.question_panel.budget.setText("1GiB")  # the free memory changes between sweeps, and with it what fits
    with qtbot.waitSignal(mode.sigDone, timeout=180000) as done:
        assert mode.start() is not None
    sweep = mode.sweep
    assert sweep.asked is not None and sweep.asked.regimes == ["query-agnostic", "query-aware"], window.last_error
    window.redraw()

    plot = mode.view.accuracy_plot
    assert plot.isVisibleTo(window) and plot.axis_label("left") == "answers right (%)"
    for regime in sweep.asked.regimes:
        xs, ys = plot.series[regime].getData()
        want = sorted((math.log10(frontier.memory(c)), 100 * c.accuracy(regime)) for c in frontier.placed(sweep))
        assert sorted(zip(xs, ys, strict=True)) == want
    assert not plot.series["decode-time"].getData()[0].size
    assert plot.names and all(label.toPlainText() for label, _, _ in plot.names)  # the best points carry names
    titles = [mode.view.table.horizontalHeaderItem(c).text() for c in range(mode.view.table.columnCount())]
    assert titles[titles.index("top-1") + 1:][:2] == ["query-agnostic answers", "query-aware answers"]
    assert all(" of 1 needles" in mode.view.table.row_text(r)[titles.index("query-aware answers")]
               for r in range(mode.view.table.rowCount()))  # "1 of 1 needles", as the command line's table writes it

    rows = mode.view.answers.rows()
    records = [(i, a) for i, c in enumerate(sweep.configurations) for a in c.answers]
    assert len(rows) == len(records) == 2 * 2  # two configurations, one question, two regimes
    for index, record in records:
        row = next(r for r in rows if r[0] == index and r[2] == record.regime)
        assert row[1] == "niah_single_1 #1"
        assert row[3] == result_text(record) and row[3] in ("right", "wrong")
        assert row[4] == " ".join(record.answer.split())[:59] or row[4].endswith("…")
        assert row[6] == held_text(record)
    assert not mode.view.below.tabBar().isHidden()

    # opened again, the Controls show what it asked
    panel.setChecked(False)
    panel.regimes["query-aware"].setChecked(False)
    assert mode.open(sweep) is sweep
    assert panel.isChecked() and panel.task_names() == ["niah_single_1"] and panel.raw.isChecked()
    assert [name for name, box in panel.regimes.items() if box.isChecked()] == ["query-agnostic", "query-aware"]
    assert (panel.items.value(), panel.length.value()) == (1, 160)

    # its journal (the folder of unsaved work) as a kill -9 after the answers and the exact cache's line leaves it:
    # continued with its own questions, its answers and its table are the whole sweep's
    from kvviz.files.sweep import read_journal
    from kvviz.qt import unsaved
    from tests.qt.test_choose_mode import dead_journal, table

    own = unsaved.folder() / f"sweep-{os.getpid()}-{done.args[0]}.json.journal"
    lines = own.read_bytes().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith(b'{"configuration":0,'))
    left = dead_journal(b"".join(lines[: first + 1]))
    try:
        assert read_journal(left).finished == [0] and len(read_journal(left).answered) == 2
        assert window.file_actions.open_trace(left) is not None and mode.offer is not None
        mode.offer.close()
        with qtbot.waitSignal(mode.sigDone, timeout=180000):
            assert mode.continue_sweep(left) is not None
        assert [c.status for c in mode.sweep.configurations] == ["finished"] * 2, window.last_error
        assert table(mode.sweep) == table(sweep)
        assert [[a.to_dict() for a in c.answers] for c in mode.sweep.configurations] == \
            [[a.to_dict() for a in c.answers] for c in sweep.configurations]
    finally:
        left.unlink(missing_ok=True)
