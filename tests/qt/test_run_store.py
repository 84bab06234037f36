"""The run store on hand-made records: one place for ids, statuses and the selection; records drawn from the trace."""

from __future__ import annotations

from kvviz.files.trace import Trace
from kvviz.present import CANCELLED, FAILED, FINISHED, RUNNING, STARTING, STREAMING
from kvviz.qt.run_store import RunStore
from tests.qt.test_series import make_step


def _trace(steps: int = 0, **fields) -> Trace:
    return Trace(model={"name": "m"}, strategy={"name": "sink", "options": {}}, prompt_tokens=10,
                 steps=[make_step(i) for i in range(steps)], **fields)


def test_ids_statuses_and_the_producers_trace(qtbot):
    store = RunStore()
    added, ended = [], []
    store.sigRunAdded.connect(added.append)
    store.sigRunEnded.connect(lambda run_id, status: ended.append((run_id, status)))
    opened = store.add(_trace(3, cancelled=True), CANCELLED)
    header = _trace()
    live = store.add(header, STARTING, generating=True)
    served = store.add(_trace(), STREAMING, overlay=True)
    assert (opened, live, served) == (1, 2, 3) and added == [1, 2, 3]
    assert store.runs[opened].finished and store.runs[opened].n == 3  # a file is drawn whole at once
    assert store.generating == live and store.shown == [live, served]
    assert store.primary() is store.runs[live]  # the run generating leads the single-run views

    # the engine's own trace replaces the request's header; its records are the ones drawn
    worker_trace = _trace()
    store.attach(live, worker_trace)
    store.set_status(live, RUNNING)
    worker_trace.steps.extend(make_step(i) for i in range(4))
    store.records_arrived(live)
    assert store.runs[live].n == 0  # drawn at the next redraw, not per record
    store.sync()
    assert store.runs[live].trace is worker_trace and store.runs[live].n == 4 and header.steps == []
    assert store.take_changed() == {live} and store.take_changed() == set()

    worker_trace.steps.append(make_step(4))
    store.end(live, FINISHED)  # the last record is drawn before the run ends
    assert store.runs[live].n == 5 and store.runs[live].finished and store.generating is None
    assert store.status(live) == FINISHED and ended == [(live, FINISHED)]
    worker_trace.steps.append(make_step(5))
    store.records_arrived(live)  # a stale signal after the end changes nothing
    store.sync()
    assert store.runs[live].n == 5

    store.end(served, FAILED, error="the server went away")
    assert store.runs[served].trace.error == "the server went away" and store.status(served) == FAILED


def test_selection_is_the_stores_and_the_table_follows(qtbot):
    from kvviz.qt.panels.runs import RunsTable

    store = RunStore()
    table = RunsTable(store)
    qtbot.addWidget(table)
    shown = []
    store.sigShownChanged.connect(shown.append)
    first = store.add(_trace(2), FINISHED)
    second = store.add(_trace(2), FINISHED)
    assert table.selected_runs() == [second] and store.shown == [second]
    table.select_runs([first, second])  # as a user's Ctrl+click
    assert store.shown == [first, second] and shown[-1] == [first, second]
    store.show([first, 99])  # unknown ids are dropped
    assert table.selected_runs() == [first] and store.shown == [first]
    assert table.row_text(first)[0] == "#1" and table.cell(first, "status") == FINISHED


def test_a_live_rows_new_figures_are_shown_and_their_columns_fit_them(qtbot):
    """The table writes a row's cells with the model's signals held and announces the row once: the cells and the
    columns' widths must still follow."""
    from kvviz.qt.panels.runs import COLUMNS, RunsTable

    store = RunStore()
    table = RunsTable(store)
    qtbot.addWidget(table)
    table.show()
    trace = _trace(2)
    live = store.add(trace, RUNNING, generating=True)
    header = table.horizontalHeader()
    index = COLUMNS.index("peak cache MiB")
    narrow = header.sectionSize(index)
    trace.steps.append(make_step(2))
    trace.steps[-1].cache_bytes = 10**18  # a figure far wider than the column's title
    store.records_arrived(live)
    store.sync()
    table.refresh(live=False)
    wide = table.cell(live, "peak cache MiB")
    assert table.cell(live, "tokens") == "3"
    assert header.sectionSize(index) > narrow
    assert header.sectionSize(index) >= table.fontMetrics().horizontalAdvance(wide)
