"""What the window says never misleads: one-time pauses, switches, options checked as typed, a prompt a cache
cannot hold, the memory-bound floor, and the model remembered (issue 15 item 3, 6; issue 11 item 4)."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QObject, Slot

from kvviz.files.trace import Switch, Trace
from kvviz.present import percent, seconds, strategy_path
from kvviz.qt.series import FLOOR_MS, RunSeries
from tests.qt.test_series import make_step

# -- records only ---------------------------------------------------------------------------------------


def test_floor_and_share_follow_the_trace_step_by_step():
    trace = Trace(model={}, strategy={"name": "dynamic", "options": {}}, prompt_tokens=10,
                  weight_bytes=500_000, bandwidth_bytes_per_s=1e9)
    series = RunSeries(1, trace)
    for i in range(20):
        trace.steps.append(make_step(i))
        series.sync()
        assert series.share_of_memory_bound == pytest.approx(trace.summary()["share_of_memory_bound"])
    floors = series.column(FLOOR_MS)
    assert np.isnan(floors[0])  # the prefill has no floor: it computes more than it reads
    np.testing.assert_allclose(floors[1:], [trace.floor_ms(s.cache_bytes) for s in trace.steps[1:]])
    assert series.first_decode_x == 11


def test_unknown_bandwidth_leaves_floor_and_share_unknown():
    trace = Trace(model={}, strategy={"name": "dynamic", "options": {}}, prompt_tokens=3)  # an old file
    series = RunSeries(1, trace)
    trace.steps.extend(make_step(i) for i in range(4))
    series.sync()
    assert series.share_of_memory_bound is None and np.isnan(series.column(FLOOR_MS)).all()
    assert percent(series.share_of_memory_bound) == "–" and seconds(None) == "–" and seconds(4.0) == "0.004"


def test_switches_name_the_strategy_of_the_step_shown():
    trace = Trace(model={}, strategy={"name": "dynamic", "options": {}}, prompt_tokens=10)
    series = RunSeries(5, trace)
    trace.steps.extend(make_step(i) for i in range(4))
    series.sync()
    assert series.label_now() == "#5 dynamic"
    trace.switches.append(Switch(4, "dynamic", "sliding", {"window": 8}))  # the engine notes it before step 4
    assert strategy_path(trace) == "dynamic -> sliding (window=8) @4"
    assert strategy_path(trace, options=False) == "dynamic -> sliding @4"
    series.sync()
    assert series.switches == [] and series.label_now() == "#5 dynamic"  # step 4 is not drawn yet
    trace.steps.append(make_step(4))
    series.sync()
    assert series.switches == [(14, "sliding")]
    assert series.label_now() == "#5 sliding (window=8), from dynamic at step 4"
    assert series.label() == "#5 dynamic -> sliding (window=8) @4"
    assert series.short_label(24) == "#5 dynamic -> sliding @4"


# -- the window, on the tiny model --------------------------------------------------------------------


def test_floor_line_is_trace_floor_ms_and_a_window_keeps_it_flat(qtbot, drive, window):
    drive.load(window, "tiny")
    growing = drive.run(window, "dynamic", tokens=24, prompt="Tell me a long story about caches.")
    windowed = drive.run(window, "sink", {"sink_tokens": 2, "window": 6}, tokens=24,
                         prompt="Tell me a long story about caches.")
    window.runs_table.select_runs([growing, windowed])
    window.redraw()
    latency = window.modes["local"].view.latency_plot
    for run_id in (growing, windowed):
        trace = window.store.runs[run_id].trace
        decode = [s for s in trace.steps if s.phase == "decode"]
        x, floor = latency.floor_data(run_id)
        np.testing.assert_allclose(x, [trace.prompt_tokens + s.index for s in decode])
        np.testing.assert_allclose(floor, [trace.floor_ms(s.cache_bytes) for s in decode])
        share = trace.summary()["share_of_memory_bound"]
        assert window.runs_table.cell(run_id, "of mem. limit") == percent(share)
    growing_floor = latency.floor_data(growing)[1]
    windowed_floor = latency.floor_data(windowed)[1]
    assert (np.diff(growing_floor) > 0).all()  # every token adds KV bytes each step reads
    assert np.ptp(windowed_floor[-8:]) == 0  # the sink cache holds 8 tokens: the floor stops rising
    last = window.store.runs[growing].trace
    hover = latency.hover_text(last.prompt_tokens + last.steps[-1].index, 0).replace("&nbsp;", " ")
    assert f"floor {growing_floor[-1]:.1f} ms" in hover and "of the bytes read" in hover
    floor_entry = next(entry for entry in latency.legend_entries() if entry.text == "memory-bound floor")
    assert "a smaller cache is faster" in floor_entry.tooltip
    window.runs_table.select_runs([windowed])
    window.redraw()
    share = window.store.runs[windowed].share_of_memory_bound
    assert f"{percent(share)} of the memory-bound limit" in window.status_line.labels["rate"].text()


def test_invalid_option_disables_run_and_switch_with_the_message_beside_it(qtbot, drive, window):
    drive.load(window, "tiny")
    panel = window.controls.strategy_panel
    assert panel.set_current("quantized")
    panel.set_option("q_group_size", 32)
    assert window.modes["local"].run_button.isEnabled() and panel.problem() is None
    panel.set_option("nbits", 3)  # hqq takes 3 bits, quanto does not
    message = panel._messages["nbits"]
    assert panel.problem() == "option 'nbits' of backend 'quanto' must be one of 2, 4, not 3"
    assert message.isVisibleTo(window) and message.text() == panel.problem()
    assert not window.modes["local"].run_button.isEnabled() and not window.menus.run_action.isEnabled()
    runs = dict(window.store.runs)
    assert window.start_run() is None and dict(window.store.runs) == runs  # nothing was started
    panel.set_option("backend", "hqq")
    assert panel.problem() is None and not message.isVisibleTo(window)
    assert window.modes["local"].run_button.isEnabled()
    # while a run goes, an invalid choice keeps Switch disabled
    window.controls.settings_panel.max_new_tokens.setValue(400)
    with qtbot.waitSignal(window.sigRunDone, timeout=120000):
        run_id = window.start_run({"stop_at_eos": False})
        qtbot.waitUntil(lambda: len(window.store.runs[run_id].trace.steps) >= 2, timeout=60000)
        assert window.modes["local"].switch_button.isEnabled()
        panel.set_option("backend", "quanto")
        assert not window.modes["local"].switch_button.isEnabled() and window.switch_strategy() is False
        window.stop_run()
    assert window.store.runs[run_id].trace.switches == []


def test_what_needs_the_model_is_checked_by_the_worker_before_run(qtbot, drive, window):
    drive.load(window, "tiny")  # 2 KV heads of 32 values: a token has 64 key values per layer
    panel = window.controls.strategy_panel
    assert panel.set_current("quantized")
    panel.set_option("q_group_size", 128)
    qtbot.waitUntil(lambda: panel.problem() is not None, timeout=30000)
    assert panel.problem().startswith("cannot use q_group_size=128 with this model")
    assert panel._messages["q_group_size"].isVisibleTo(window) and not window.modes["local"].run_button.isEnabled()
    panel.set_option("q_group_size", 64)
    assert panel.problem() is None and window.modes["local"].run_button.isEnabled()  # the verdict was for 128
    # the prompt counts too: a static cache smaller than the prompt plus the new tokens
    assert panel.set_current("static")
    panel.set_option("max_cache_len", 8)
    qtbot.waitUntil(lambda: panel.problem() is not None, timeout=30000)
    assert "max_cache_len" in panel.problem() and panel._messages["max_cache_len"].isVisibleTo(window)
    assert window.status_line.labels["state"].text().startswith("Run is off: ")
    panel.set_option("max_cache_len", 0)
    assert panel.problem() is None


def test_a_window_smaller_than_the_prompt_warns_before_the_run(qtbot, drive, window):
    drive.load(window, "tiny")
    panel = window.controls.strategy_panel
    assert panel.set_current("sliding")
    panel.set_option("window", 8)
    window.controls.prompt_panel.set_text("A prompt of a good many words, surely more than eight tokens long.")
    qtbot.waitUntil(lambda: panel.warning() is not None, timeout=30000)
    count = window.modes["local"].runs.prompt_tokens
    assert count > 8 and f"The prompt is {count} tokens" in panel.warning_label.text()
    assert "then the cache keeps its last 7 tokens" in panel.warning()  # what this strategy keeps of it
    assert panel.warning_label.isVisibleTo(window)
    assert window.modes["local"].run_button.isEnabled()  # a warning, not a refusal
    assert panel.set_current("snapkv")
    panel.set_option("budget", 6)
    panel.set_option("window", 2)
    assert "its last 2 tokens and the 4 that those tokens' queries attend to most" in panel.warning()
    window.set_mode("evaluate")  # its strategies read a document: nothing to say about the prompt
    assert panel.warning() is None and not panel.warning_label.isVisibleTo(window)
    window.set_mode("local")
    assert panel.warning() is not None
    assert panel.set_current("sliding")
    panel.set_option("window", 4096)
    assert panel.warning() is None and not panel.warning_label.isVisibleTo(window)
    assert panel.set_current("sink")
    panel.set_option("sink_tokens", 2)
    panel.set_option("window", 4)
    assert panel.warning() is not None
    window.controls.prompt_panel.set_text("Hi")  # the chat template alone is more than 6 tokens
    window.controls.settings_panel.raw.setChecked(True)  # the prompt as typed: a token or two
    qtbot.waitUntil(lambda: panel.warning() is None, timeout=30000)
    assert window.modes["local"].runs.prompt_tokens < 6


def test_quanto_warm_up_is_announced_marked_and_kept_out_of_the_steps(qtbot, drive, window):
    drive.load(window, "tiny")
    notices = []
    window.model.worker.sigRunNotice.connect(lambda run_id, message: notices.append((run_id, message)))
    run_id = drive.run(window, "quantized", {"q_group_size": 32, "residual_length": 4}, tokens=6, timeout=600000)
    assert [m for _, m in notices][0].startswith("loading quanto's kernels") and notices[-1] == (run_id, "")
    trace = window.store.runs[run_id].trace
    assert trace.warm_up_ms is not None
    assert window.runs_table.cell(run_id, "one-time s") == f"warm-up {seconds(trace.warm_up_ms)}"
    decode = [s.wall_ms for s in trace.steps if s.phase == "decode"]
    assert window.runs_table.cell(run_id, "tokens/s") == f"{1000 * len(decode) / sum(decode):,.1f}"
    marks = window.modes["local"].view.latency_plot.pause_positions(run_id)
    assert marks == {"warm-up": trace.prompt_tokens}  # at the run's start, where the prefill is
    assert window.status_line.notice_text == "" and window.status_line.labels["state"].text() == "ready"


class StateAtNotice(QObject):
    """What the status line's state label reads when each pause notice reaches the window (queued after the
    status line's own slot): a fast compile's notice can come and go between two polls of the label."""

    def __init__(self, label):
        super().__init__()
        self.label = label
        self.shown: list[str] = []

    @Slot(int, str)
    def record(self, run_id: int, message: str) -> None:
        if message:
            self.shown.append(self.label.text())

    def compiling(self) -> bool:
        return any(text.startswith("compiling") for text in self.shown)


def test_compile_is_shown_stoppable_and_in_no_step(qtbot, drive, window):
    import torch

    from kvviz.engine.stopped_compiles import stopped_compiles

    drive.load(window, "tiny")
    window.controls.prompt_panel.set_text("Compile me")
    window.controls.settings_panel.max_new_tokens.setValue(6)
    panel = window.controls.strategy_panel
    assert panel.set_current("static")
    panel.set_option("compile", True)
    state = window.status_line.labels["state"]
    watcher = StateAtNotice(state)
    window.model.worker.sigRunNotice.connect(watcher.record)
    # the whole run: the compile is announced, timed apart, shown in the table and marked before the first decode
    with qtbot.waitSignal(window.sigRunDone, timeout=900000) as done:
        run_id = window.start_run({"stop_at_eos": False})
    assert watcher.compiling(), watcher.shown
    assert done.args == [run_id, "finished"]
    trace = window.store.runs[run_id].trace
    assert trace.compile_ms is not None and max(s.wall_ms for s in trace.steps) < trace.compile_ms
    assert window.runs_table.cell(run_id, "one-time s") == f"compile {seconds(trace.compile_ms)}"
    assert window.modes["local"].view.latency_plot.pause_positions(run_id) == {"compile": trace.prompt_tokens + 1}
    assert window.status_line.notice_text == "" and not state.text().startswith("compiling")
    # Stop during a compile: the run ends at once, cancelled, and the notice goes
    torch._dynamo.reset()  # else the second compile finds the first one's code and takes no time
    with qtbot.waitSignal(window.sigRunDone, timeout=120000) as stopped:
        watcher.shown.clear()
        second = window.start_run()
        qtbot.waitUntil(watcher.compiling, timeout=120000)
        window.menus.stop_action.trigger()
    assert stopped.args == [second, "cancelled"]
    assert len(window.store.runs[second].trace.steps) == 1  # the prefill; the compile was stopped
    assert window.runs_table.cell(second, "one-time s") == "–"
    window.redraw()
    assert window.status_line.notice_text == "" and not state.text().startswith("compiling")
    # the stopped compile finishes on its own thread; a process that exits under it aborts
    for thread in stopped_compiles():
        thread.join(600)


def test_only_a_loaded_model_is_remembered_and_a_start_falls_back(qtbot, drive, settings, tmp_path, monkeypatch):
    from kvviz.qt import app
    from kvviz.qt.main_window import MainWindow

    missing = str(tmp_path / "gone" / "model.gguf")
    first = MainWindow(settings=settings)
    qtbot.addWidget(first)
    drive.load(first, "tiny")
    with qtbot.waitSignal(first.sigModelReady, timeout=30000):
        first.load_model(missing)  # fails; tiny stays loaded
    first.close()
    assert settings.value("model/spec") == "tiny"

    second = MainWindow(settings=settings)
    qtbot.addWidget(second)
    monkeypatch.setattr(app, "FALLBACK_SPEC", "tiny")  # the default model works the same, only slower to load
    answers = []
    second.sigModelReady.connect(lambda spec, ok: answers.append((spec, ok)))
    try:
        app.load_at_start(second, missing, remembered=True)
        qtbot.waitUntil(lambda: len(answers) == 2, timeout=120000)
        assert answers == [(missing, False), ("tiny", True)]
        qtbot.waitUntil(lambda: second.error_bar.isVisibleTo(second), timeout=5000)
        message = second.error_bar.label.text()
        assert missing in message and "the tiny model is loaded instead" in message
    finally:
        second.close()


def test_demo_caption_has_a_band_of_its_own(window):
    from kvviz.qt.tools.demo import Caption

    caption = Caption(window)
    caption.show("1 / 6  A caption long enough to cross the whole window if it were drawn over the plots")
    window.resize(1280, 720)
    window.show()
    from PySide6.QtWidgets import QApplication

    QApplication.processEvents()
    band = caption.bar.geometry()
    for part in (window.centralWidget(), window.controls_dock, window.tokens_dock, window.runs_dock):
        assert not band.intersects(part.geometry()), part
    assert band.bottom() < window.centralWidget().geometry().top()
