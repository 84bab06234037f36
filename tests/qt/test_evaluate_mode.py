"""The window's Evaluate mode on the tiny model: its controls, live evaluations, Stop, failures kept apart,
kept evaluation files, and every engine call on the worker's thread."""

from __future__ import annotations

import csv
import json
import os
import threading
import time

import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from kvviz.files import evaluation
from kvviz.files.formats import read_kept
from kvviz.present import MIB, mib, number
from kvviz.qt import unsaved
from tests.qt.conftest import load, run, tab

TWO = [("dynamic", {}), ("tova", {"budget": 8})]


def evaluate(qtbot, win, entries, tokens: int, timeout: int = 120000) -> int:
    """Evaluate through the window's own controls and wait for the end; the evaluation's id."""
    win.set_mode("evaluate")
    mode = win.modes["evaluate"]
    mode.list_panel.set_entries(entries)
    mode.document_panel.tokens.setValue(tokens)
    assert mode.evaluate_button.isEnabled(), win.last_error
    with qtbot.waitSignal(mode.sigDone, timeout=timeout) as done:
        mode.evaluate_button.click()
    return done.args[0]


def _list_texts(mode) -> list[str]:
    items = mode.list_panel.list
    return [items.item(i).text() for i in range(items.count())]


def _table(mode) -> list[list[str]]:
    table = mode.view.table
    return [table.row_text(r) for r in range(table.rowCount())]


def test_the_mode_swaps_controls_view_and_docks_and_keeps_its_choices(window, qtbot, settings, tmp_path):
    from kvviz.qt.main_window import MainWindow

    c, mode = window.controls, window.modes["evaluate"]
    c.source_tabs.setCurrentIndex(tab(window, "evaluate"))  # as a user clicks the tab
    assert window.mode.key == "evaluate" and window.views.tabText(tab(window, "evaluate")) == "Evaluate"
    shown = (c.model_panel, mode.document_panel, c.strategy_panel, mode.list_panel, mode.evaluate_button)
    assert all(w.isVisibleTo(window) for w in shown)
    hidden = (c.prompt_panel, c.settings_panel, window.modes["local"].run_button, window.tokens_dock, window.runs_dock)
    assert not any(w.isVisibleTo(window) for w in hidden)
    assert not mode.evaluate_button.isEnabled()  # no model yet
    # the first list: StreamingLLM's comparison, each named by the options it sets away from their defaults
    assert _list_texts(mode) == ["dynamic", "sliding (window=128)", "sink (window=124)",
                                 "quantized (backend=hqq, nbits=2)"]
    assert mode.list_panel.list.item(2).toolTip() == "sink (sink_tokens=4, window=124)"

    # Add takes the picker's strategy and options; the same one again is not added twice; Remove
    assert c.strategy_panel.set_current("sliding")
    c.strategy_panel.set_option("window", 64)
    mode.list_panel.add_button.click()
    mode.list_panel.add_button.click()
    assert _list_texts(mode)[-1] == "sliding (window=64)" and len(_list_texts(mode)) == 5
    mode.list_panel.list.setCurrentRow(0)
    mode.list_panel.remove_button.click()
    assert _list_texts(mode)[0] == "sliding (window=128)" and len(_list_texts(mode)) == 4

    # the document: built in, or a file (a bad one is refused with a reason, the choice stays)
    panel = mode.document_panel
    assert panel.document().source == "builtin:alice" and "Lewis Carroll" in panel.about.text()
    panel.tokens.setValue(0)
    assert panel.tokens.text() == "whole document" and panel.token_count() is None
    story = tmp_path / "story.md"
    story.write_text("Once upon a time there was a cache.", encoding="utf-8")
    assert mode.open_document(story) and panel.document().source == str(story)
    assert panel.combo.currentText() == "story.md"
    assert not mode.open_document(tmp_path / "story.pdf")
    assert "story.pdf" in window.last_error and ".txt and .md" in window.last_error
    assert panel.document().source == str(story)
    panel.tokens.setValue(300)

    # kept between sessions, with the docks as the local mode has them
    window.save_settings()
    assert not window.tokens_dock.isVisibleTo(window)  # still aside while the mode is on screen
    again = MainWindow(settings=settings)
    qtbot.addWidget(again)
    again.show()
    try:
        qtbot.waitUntil(lambda: bool(again.controls.strategy_panel.names()), timeout=30000)
        assert _list_texts(again.modes["evaluate"]) == _list_texts(mode)
        assert again.modes["evaluate"].document_panel.state() == {"source": str(story), "tokens": 300}
        assert again.tokens_dock.isVisibleTo(again) and again.runs_dock.isVisibleTo(again)
    finally:
        again.close()

    c.source_tabs.setCurrentIndex(tab(window, "local"))
    assert window.tokens_dock.isVisibleTo(window) and window.runs_dock.isVisibleTo(window)
    assert c.prompt_panel.isVisibleTo(window) and not mode.document_panel.isVisibleTo(window)


def test_two_strategies_end_to_end_rows_and_curves(window, qtbot, monkeypatch):
    summaries = []
    original = evaluation.EvalRun.summary
    monkeypatch.setattr(evaluation.EvalRun, "summary", lambda self: summaries.append(1) or original(self))
    load(qtbot, window, "tiny")
    evaluate(qtbot, window, TWO, 40)
    assert not summaries  # the live view never recomputes a run's summary (linear in its length)
    mode = window.modes["evaluate"]
    assert [s.state for s in mode.series] == ["finished", "finished"]
    assert "tiny-random-llama" in mode.view.summary.text() and "40 tokens" in mode.view.summary.text()
    rows = _table(mode)
    for series, row in zip(mode.series, rows, strict=True):
        records = series.run.records
        assert len(records) == 39 and [r.position for r in records] == list(range(39))
        s = original(series.run)
        assert row[1:8] == ["39", number(s["perplexity"], 2), number(s["second_half_perplexity"], 2),
                            f"{s['final_cache_bytes'] / MIB:,.2f}", number(s["tokens_per_s"], 1),
                            "–" if s["first_eviction"] is None else f"{s['first_eviction']:,}", "finished"]
        (x, y), = mode.view.perplexity_plot.curve_data(series.run_id)[:1]
        nll = np.array([r.nll for r in records])
        np.testing.assert_array_equal(x, np.arange(39))
        assert y[-1] == pytest.approx(nll.mean(), rel=1e-9)  # under 64 predictions: the mean of all of them
        measured = mode.view.memory_plot.curve_data(series.run_id)[0]
        assert measured[1][-1] == pytest.approx(s["final_cache_bytes"] / MIB)
    dynamic, tova = mode.series
    assert dynamic.run.method["mode"] == "chunked" and rows[0][0] == "dynamic" and rows[0][6] == "–"
    assert tova.run.method["mode"] == "chunked" and rows[1][0] == "tova (budget=8)"
    # measured once per forward: the 8 tokens its budget holds whole, then the rest, stepped through
    assert len(mode.view.memory_plot.curve_data(tova.run_id)[0][0]) == 2
    assert tova.first_eviction == 9 and rows[1][6] == "9"
    np.testing.assert_allclose([r.nll for r in dynamic.run.records[:9]], [r.nll for r in tova.run.records[:9]],
                               atol=1e-3)  # the same cache until the budget is full
    legend = mode.view.perplexity_plot.legend_bar.texts()
    assert legend[:2] == ["dynamic", "tova (budget=8)"] and "first eviction" in legend
    # each strategy kept on disk as it was measured, until the window closes: what a crash would leave
    kept = sorted(unsaved.folder().glob(f"eval-{os.getpid()}-*.json.journal"))[-2:]
    assert [read_kept(path).records for path in kept] == [s.run.records for s in mode.series]


def test_a_document_longer_than_the_context_is_cut_with_a_notice(window, qtbot, short_context_model):
    load(qtbot, window, str(short_context_model))
    evaluate(qtbot, window, [("dynamic", {})], 0)  # the whole of Alice: far more than its 256 positions
    mode = window.modes["evaluate"]
    assert mode.series[0].run.document["tokens"] == 256 and mode.series[0].n == 255
    assert "longer than the model's context of 256 tokens" in mode.view.summary.text()


def test_stop_stops_every_strategy_and_frees_the_worker(window, qtbot, monkeypatch):
    from kvviz.engine.cache_run import CacheRun

    forward = CacheRun.forward

    def slowed(self, *args, **kwargs):  # a chunk of the tiny model takes milliseconds: Stop must find tova reading
        time.sleep(0.05)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(CacheRun, "forward", slowed)
    load(qtbot, window, "tiny")
    window.set_mode("evaluate")
    mode = window.modes["evaluate"]
    # each reads the document alone, in chunks (the two that evict stepping through them), one after another
    mode.list_panel.set_entries([("tova", {"budget": 16}), ("h2o", {"budget": 12}), ("dynamic", {})])
    mode.document_panel.tokens.setValue(4000)
    mode.evaluate_button.click()
    # a chunk's records come at once, before the window hears that tova reads
    qtbot.waitUntil(lambda: mode.series[0].run is not None and len(mode.series[0].run.records) > 5
                    and mode.active == [0], timeout=60000)
    assert not window.controls.model_panel.load_button.isEnabled() and mode.stop_button.isEnabled()
    assert mode.progress().startswith("strategy 1 of 3, tova (budget=16): ")
    window.redraw()  # the status bar speaks of the evaluation, not of the last local run
    rate, _, cache = mode.figures()
    assert rate == pytest.approx(mode.series[0].tokens_per_s())
    assert cache == mode.series[0].cache_bytes()
    assert window.status_line.labels["cache"].text() == f"cache {mib(cache)}"
    with qtbot.waitSignal(mode.sigDone, timeout=60000):
        window.menus.stop_action.trigger()  # Esc
    assert [s.state for s in mode.series] == ["cancelled", "not run", "not run"]
    assert 5 < mode.series[0].n < 3999 and mode.series[0].run.cancelled
    assert [row[-1] for row in _table(mode)] == ["cancelled", "not run", "not run"]
    assert "cancelled" in mode.view.summary.text()
    assert [index for index, _ in mode.runs()] == [0]  # what was measured is kept; nothing of the rest
    window.set_mode("local")
    assert window.modes["local"].run_button.isEnabled()
    run(qtbot, window, tokens=4)  # the worker serves a local run again


def test_a_failing_strategy_keeps_its_error_and_the_others_their_results(window, qtbot, monkeypatch, tmp_path):
    from kvviz.engine.cache_run import CacheRun

    forward = CacheRun.forward

    def failing_after_ten(self, input_ids, *args, **kwargs):
        if self.choice.name == "h2o" and self.seen >= 10:
            raise RuntimeError("the cache ran out of memory (a failure this test injects)")
        return forward(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(CacheRun, "forward", failing_after_ten)
    load(qtbot, window, "tiny")
    # static with too few slots is refused before any work; h2o fails after ten predictions; dynamic is fine
    from kvviz.engine.evaluate import Evaluation

    span = Evaluation.span  # chunks of 10 tokens for h2o: it fails in its second
    monkeypatch.setattr(Evaluation, "span", lambda self, fed: 10 if self.stepped else span(self, fed))
    evaluate(qtbot, window, [("static", {"max_cache_len": 16}), ("h2o", {"budget": 8}), ("dynamic", {})], 40)
    mode = window.modes["evaluate"]
    assert [s.state for s in mode.series] == ["failed", "failed", "finished"]
    static, h2o, dynamic = _table(mode)
    assert static[1:7] == ["–"] * 6 and static[7].startswith("failed: option 'max_cache_len'")
    assert h2o[1] == "10 of 39" and "ran out of memory" in h2o[7] and h2o[2] != "–"
    assert dynamic[1] == "39" and dynamic[7] == "finished"
    assert len(mode.view.perplexity_plot.curve_data(mode.series[1].run_id)[0][0]) == 10  # what it measured
    assert "static (max_cache_len=16) failed" in window.last_error and "h2o (budget=8) failed" in window.last_error

    written = window.modes["evaluate"].save(tmp_path / "kept")
    assert sorted(p.name for p in written) == ["eval-2-h2o.json", "eval-3-dynamic.json", "summary.csv"]
    with (tmp_path / "kept" / "summary.csv").open(encoding="utf-8") as f:
        assert [(r["strategy"], r["status"], r["tokens"]) for r in csv.DictReader(f)] == [
            ("h2o", "error", "10"), ("dynamic", "finished", "39")]


def test_save_and_open_evaluation_files(window, qtbot, tmp_path):
    from kvviz.qt.app import open_kept_files

    load(qtbot, window, "tiny")
    evaluate(qtbot, window, TWO, 40)
    mode, actions = window.modes["evaluate"], window.file_actions
    live_rows = _table(mode)
    written = mode.save(tmp_path / "out")
    assert [p.name for p in written] == ["eval-1-dynamic.json", "eval-2-tova.json", "summary.csv"]
    assert str((tmp_path / "out").resolve()) in window.statusBar().currentMessage()
    with (tmp_path / "out" / "summary.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["strategy"] for r in rows] == ["dynamic", "tova"] and rows[1]["options"].startswith("budget=8 ")
    assert float(rows[0]["perplexity"]) == pytest.approx(mode.series[0].perplexity(), rel=1e-5)
    exported = mode.export_csv(tmp_path / "summary-only.csv")
    with exported.open(encoding="utf-8") as f:
        assert [r["perplexity"] for r in csv.DictReader(f)] == [r["perplexity"] for r in rows]
    # the tab's plots export like the others': each with its title, axes and a legend naming the strategies
    plots = actions.export_plots(tmp_path / "plots", width=640)
    assert sorted(p.name for p in plots) == ["eval_memory_plot.png", "eval_memory_plot.svg", "perplexity_plot.png",
                                             "perplexity_plot.svg"]
    svg = (tmp_path / "plots" / "eval_memory_plot.svg").read_text(encoding="utf-8")
    assert "tova (budget=8)" in svg and "cache memory (MiB)" in svg

    # File > Open the first file, drop the second: the two side by side again, with the same numbers
    window.set_mode("local")
    opened = actions.open_trace(written[0])
    assert isinstance(opened, evaluation.EvalRun) and window.mode.key == "evaluate"
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(written[1]))])
    drop = QDropEvent(QPointF(20, 20), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    assert actions.eventFilter(window, drop) is True
    window.redraw()
    assert _table(mode) == live_rows
    assert "opened from files" in mode.view.summary.text()
    assert len(mode.view.perplexity_plot.curve_data(2)[0][0]) == 39

    # --open: a file shown already takes its own place; another document's evaluation replaces what is shown
    assert open_kept_files(window, [str(written[1])]) == []
    window.redraw()
    assert _table(mode) == live_rows
    other = json.loads(written[1].read_text(encoding="utf-8"))
    other["document"].update(name="another.txt", source="/somewhere/another.txt", title=None, author=None)
    (tmp_path / "other.json").write_text(json.dumps(other), encoding="utf-8")
    assert open_kept_files(window, [str(tmp_path / "other.json")]) == []
    window.redraw()
    assert _table(mode) == [live_rows[1]] and "another.txt" in mode.view.summary.text()
    assert mode.view.perplexity_plot.curve_data(2) == []  # the curves of the strategies no longer shown are gone

    # a damaged file is refused with its field named, nothing changes
    damaged = json.loads(written[0].read_text(encoding="utf-8"))
    damaged["records"]["nll"][3] = -1.0
    bad = tmp_path / "damaged.json"
    bad.write_text(json.dumps(damaged), encoding="utf-8")
    assert actions.open_trace(bad) is None
    assert "damaged.json" in actions.last_message and "nll" in actions.last_message
    actions.message_box.close()
    assert len(_table(mode)) == 1


def test_no_engine_call_on_the_gui_thread(window, qtbot, monkeypatch):
    from kvviz.engine import evaluate as engine
    from kvviz.engine import evaluate_many
    from kvviz.engine.cache_run import CacheRun

    threads: set[int] = set()

    def noting(function):
        def call(*args, **kwargs):
            threads.add(threading.get_ident())
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(engine, "prepare", noting(engine.prepare))
    monkeypatch.setattr(engine.Evaluation, "__init__", noting(engine.Evaluation.__init__))
    monkeypatch.setattr(evaluate_many, "evaluate_all", noting(evaluate_many.evaluate_all))
    monkeypatch.setattr(CacheRun, "forward", noting(CacheRun.forward))
    monkeypatch.setattr(CacheRun, "measure", noting(CacheRun.measure))
    load(qtbot, window, "tiny")
    evaluate(qtbot, window, [("sink", {"window": 8}), ("quantized", {"backend": "hqq", "nbits": 2})], 24)
    assert [s.state for s in window.modes["evaluate"].series] == ["finished", "finished"], window.last_error
    assert threads and threading.get_ident() not in threads  # the worker did all of it
    assert len(threads) == 1


def test_a_longer_axis_label_is_centred_again_when_the_plot_grows(qtbot):
    from kvviz.qt.evaluate.plots import PerplexityPlot

    plot = PerplexityPlot()
    qtbot.addWidget(plot)
    plot.resize(900, 200)
    plot.show()
    qtbot.waitUntil(lambda: plot.axis_label("left") == "nats")
    plot.resize(900, 260)
    qtbot.waitUntil(lambda: plot.axis_label("left") == "nats, 64-token mean")
    axis = plot.plot.getAxis("left")
    top = axis.label.pos().y() - axis.label.boundingRect().width()  # the label is turned: its width runs upward
    assert 0 <= top and axis.label.pos().y() <= axis.size().height()


def test_an_evaluation_journal_opened_offers_to_continue_and_ends_as_kvviz_eval_does(window, qtbot, tmp_path,
                                                                                     monkeypatch):
    """An evaluation `kvviz eval --out` stopped after its first chunk: File ▸ Open of its journal shows it and asks to
    continue; continued here (the engine's resume, as --resume runs it), its file holds the predictions of an
    evaluation that was never stopped."""
    from kvviz.files import evaluation
    from tests.commands import kvviz

    args = ["eval", "--model", "tiny", "--builtin", "alice", "--tokens", "200", "--strategies", "dynamic"]
    assert kvviz(*args, "--out", tmp_path / "whole").returncode == 0
    update = evaluation.EvalJournal.update

    def ctrl_c_after_a_chunk(journal, end=False):  # as a terminal's Ctrl-C, between two chunks
        if len(journal.run.records) == 128 and not end:
            raise KeyboardInterrupt
        update(journal, end)

    monkeypatch.setattr(evaluation.EvalJournal, "update", ctrl_c_after_a_chunk)
    assert kvviz(*args, "--out", tmp_path / "stopped").returncode == 130
    monkeypatch.undo()
    journal = tmp_path / "stopped" / "eval-1-dynamic.json.journal"

    load(qtbot, window, "tiny")
    assert window.file_actions.open_trace(journal) is not None
    mode = window.modes["evaluate"]
    assert window.mode is mode and "stopped after 128 of 199 tokens" in mode.offer.text()
    (go,) = [b for b in mode.offer.buttons() if b.text() == "Continue"]
    with qtbot.waitSignal(mode.sigDone, timeout=60000):
        go.click()
    assert not journal.exists(), window.last_error
    assert "continues after token 128 of 199" in mode.notice
    ours = evaluation.load(tmp_path / "stopped" / "eval-1-dynamic.json")
    theirs = evaluation.load(tmp_path / "whole" / "eval-1-dynamic.json")
    assert ours.status == "finished" and len(ours.records) == 199
    assert [r.nll for r in ours.records] == pytest.approx([r.nll for r in theirs.records], abs=1e-6)


def test_a_strategy_continued_in_an_eval_folder_writes_its_summary_again(window, qtbot, tmp_path, monkeypatch):
    """`kvviz eval --out` stopped in its second strategy: continued here, that strategy's file is written and the
    folder's summary.csv again, as `kvviz eval --out` writes it for the whole evaluation (timings aside)."""
    from tests.commands import kvviz

    args = ["eval", "--model", "tiny", "--builtin", "alice", "--tokens", "300", "--strategies",
            "dynamic,tova:budget=8"]  # tova stepped through chunks of 128: stopped after its first
    assert kvviz(*args, "--out", tmp_path / "whole").returncode == 0
    update = evaluation.EvalJournal.update

    def ctrl_c_in_the_second(journal, end=False):  # as a terminal's Ctrl-C, while tova reads
        if journal.run.strategy["name"] == "tova" and len(journal.run.records) >= 40 and not end:
            raise KeyboardInterrupt
        update(journal, end)

    monkeypatch.setattr(evaluation.EvalJournal, "update", ctrl_c_in_the_second)
    assert kvviz(*args, "--out", tmp_path / "stopped").returncode == 130
    monkeypatch.undo()
    stopped = tmp_path / "stopped"

    def summary(folder):
        with (folder / "summary.csv").open(encoding="utf-8") as f:
            return list(csv.DictReader(f))

    def figures(rows):
        return [{k: v for k, v in row.items() if k not in ("tokens_per_s", "wall_s", "file")} for row in rows]

    assert [row["status"] for row in summary(stopped)] == ["finished", "cancelled"]

    load(qtbot, window, "tiny")
    journal = stopped / "eval-2-tova.json.journal"
    assert window.file_actions.open_trace(journal) is not None
    mode = window.modes["evaluate"]
    assert "summary.csv" in mode.offer.text()
    (go,) = [b for b in mode.offer.buttons() if b.text() == "Continue"]
    with qtbot.waitSignal(mode.sigDone, timeout=60000):
        go.click()
    assert not journal.exists(), window.last_error
    rows = summary(stopped)
    assert figures(rows) == figures(summary(tmp_path / "whole"))
    assert [row["status"] for row in rows] == ["finished", "finished"]
    assert [row["file"] for row in rows] == [str(stopped / "eval-1-dynamic.json"), str(stopped / "eval-2-tova.json")]
