"""The real window driving the real engine on the tiny model (a random 4-layer Llama)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kvviz.files.trace import SlotState
from kvviz.present import MIB
from kvviz.qt import theme


def assert_plots_match(win, run_id):
    series = win.store.runs[run_id]
    steps = series.trace.steps
    base = series.trace.prompt_tokens
    x = np.array([base + s.index for s in steps], dtype=float)
    (mx, my), (px, py), (ax, ay) = win.modes["local"].view.memory_plot.curve_data(run_id)
    np.testing.assert_allclose(mx, x)
    np.testing.assert_allclose(my, [s.cache_bytes / MIB for s in steps])
    np.testing.assert_allclose(px, x)
    np.testing.assert_allclose(py, [s.predicted_cache_bytes / MIB for s in steps])
    # the prefill's allocations, from its start at 0 to its end at the prompt, at their peak once
    assert ax[0] == 0 and ax[-1] <= base and max(ay) == steps[0].peak_allocated_bytes / MIB
    (lx, ly) = win.modes["local"].view.latency_plot.curve_data(run_id)[0]
    decode = [s for s in steps if s.phase == "decode"]
    np.testing.assert_allclose(lx, [base + s.index for s in decode])
    np.testing.assert_allclose(ly, [s.wall_ms for s in decode])
    assert series.prefill_ms == steps[0].wall_ms and steps[0].phase == "prefill"


def test_tiny_run_draws_exactly_its_records(qtbot, drive, window):
    drive.load(window, "tiny")
    assert "tiny" in window.controls.model_panel.card.text()
    run_id = drive.run(window, "dynamic", tokens=12)
    series = window.store.runs[run_id]
    trace = series.trace
    assert window.store.status(run_id) == "finished"
    assert len(trace.steps) == 12 and trace.prompt_tokens > 0
    assert_plots_match(window, run_id)

    summary = trace.summary()
    table = window.runs_table
    assert table.cell(run_id, "run") == f"#{run_id}" and table.cell(run_id, "strategy") == "dynamic"
    assert table.cell(run_id, "tokens") == "12"
    assert table.cell(run_id, "tokens/s") == f"{summary['decode_tokens_per_s']:,.1f}"
    assert table.cell(run_id, "peak cache MiB") == f"{summary['peak_cache_bytes'] / MIB:,.3f}"
    assert table.cell(run_id, "status") == "finished"

    last = trace.steps[-1]
    keys, values, fixed = window.modes["local"].view.layer_bytes_plot._data
    assert list(keys) == [layer.keys_bytes for layer in last.layers]
    assert list(values) == [layer.values_bytes for layer in last.layers]
    assert not fixed.any()  # a plain model: no state, no cross-attention
    image = window.modes["local"].view.cache_map._image
    assert image.shape == (len(last.layers), last.layers[0].seq_len)
    assert (image == SlotState.FULL).all()
    assert window.token_view.toPlainText().startswith(trace.prompt)
    assert window.token_view._shown == 12
    assert "tokens/s" in window.status_line.labels["rate"].text()
    assert window.redraws.count < 12 + 10  # records are batched, not one redraw per record


def test_stop_keeps_what_was_generated(qtbot, drive, window):
    drive.load(window, "tiny")
    window.controls.prompt_panel.editor.setPlainText("Count to one hundred.")
    window.controls.settings_panel.max_new_tokens.setValue(400)
    window.controls.strategy_panel.set_current("dynamic")
    with qtbot.waitSignal(window.sigRunDone, timeout=60000) as blocker:
        run_id = window.start_run()
        qtbot.waitUntil(lambda: len(window.store.runs[run_id].trace.steps) >= 3)
        window.menus.stop_action.trigger()  # Esc
    assert blocker.args == [run_id, "cancelled"]
    trace = window.store.runs[run_id].trace
    assert trace.cancelled and 3 <= len(trace.steps) < 400
    assert window.runs_table.cell(run_id, "status") == "cancelled"
    assert_plots_match(window, run_id)
    assert window.modes["local"].run_button.isEnabled() and not window.modes["local"].stop_button.isEnabled()


def test_failing_model_path_shows_error_and_window_still_works(qtbot, drive, window, tmp_path):
    missing = str(tmp_path / "nowhere" / "model.gguf")
    with qtbot.waitSignal(window.sigModelReady, timeout=30000) as blocker:
        window.load_model(missing)
    assert blocker.args == [missing, False]
    assert window.error_bar.isVisible() and "does not exist" in window.error_bar.label.text()
    assert not window.modes["local"].run_button.isEnabled()
    drive.load(window, "tiny")
    assert not window.error_bar.isVisible()
    run_id = drive.run(window, tokens=4)
    assert window.store.status(run_id) == "finished"


def test_refused_run_leaves_no_run_behind_and_says_why(qtbot, drive, window):
    """A run the engine refuses before it starts (more tokens than the model's context) is withdrawn: no failed
    row, the run shown before is shown again under its own title."""
    drive.load(window, "tiny")
    first = drive.run(window, "dynamic", tokens=4)
    window.controls.settings_panel.max_new_tokens.setValue(5000)  # the tiny model's context is 4,096 tokens
    with qtbot.waitSignal(window.sigRunDone, timeout=60000) as blocker:
        refused = window.start_run()
    assert blocker.args == [refused, "failed"]
    message = window.error_bar.label.text()
    assert window.error_bar.isVisible() and message.startswith("Cannot run:") and "context of 4096" in message
    assert refused not in window.store.runs and window.runs_table.run_ids() == [first]
    assert window.store.shown == [first] and window.runs_table.selected_runs() == [first]
    window.redraw()
    assert f"#{first} dynamic" in window.modes["local"].view.cache_map.title_label.text()
    assert window.modes["local"].run_button.isEnabled()
    next_id = drive.run(window, "dynamic", tokens=4)
    assert next_id == refused  # the refused run's number was never used
    assert window.store.status(next_id) == "finished"


def test_two_runs_overlay_with_their_own_colours(qtbot, drive, window):
    drive.load(window, "tiny")
    first = drive.run(window, "dynamic", tokens=6)
    second = drive.run(window, "static", tokens=6)
    assert window.runs_table.selected_runs() == [second]
    window.runs_table.select_runs([first, second])
    window.redraw()
    assert window.store.shown == [first, second]
    for run_id in (first, second):
        measured = window.modes["local"].view.memory_plot._curves[run_id].items[0]
        assert measured.opts["pen"].color().name() == theme.run_colour(run_id)
        assert_plots_match(window, run_id)
    assert theme.run_colour(first) != theme.run_colour(second)
    # a static cache allocates its whole capacity: the map shows the unwritten tail
    image = window.modes["local"].view.cache_map._image
    assert (image == SlotState.PREALLOCATED).any()
    window.runs_table.select_runs([first])
    window.redraw()
    assert list(window.modes["local"].view.memory_plot._curves) == [first]


def test_strategy_panel_shows_options_and_unavailable_reasons(qtbot, drive, window):
    panel = window.controls.strategy_panel
    combo = panel.combo
    model = combo.model()
    for i in range(combo.count()):
        name = combo.itemData(i)
        item = model.item(i)
        ok, reason = panel._available[name]
        assert item.isEnabled() == ok
        if not ok:
            assert reason and reason in item.toolTip()
    assert panel.set_current("quantized")
    nbits = panel._widgets["nbits"]
    assert (nbits.minimum(), nbits.maximum()) == (1, 8)
    assert panel._widgets["backend"].count() >= 1
    panel.set_option("nbits", 2)
    assert panel.values()["nbits"] == 2


def test_settings_and_theme_persist(qtbot, drive, settings):
    from kvviz.qt.main_window import MainWindow

    first = MainWindow(settings=settings)
    qtbot.addWidget(first)
    qtbot.waitUntil(lambda: bool(first.controls.strategy_panel.names()), timeout=30000)
    first.set_theme("light")
    first.controls.prompt_panel.set_text("remember me")
    first.controls.settings_panel.max_new_tokens.setValue(77)
    assert first.controls.strategy_panel.set_current("sliding")
    first.controls.strategy_panel.set_option("window", 64)
    first.controls.model_panel.set_spec("tiny")
    first.close()
    assert not first.model.thread.isRunning()

    second = MainWindow(settings=settings)
    qtbot.addWidget(second)
    qtbot.waitUntil(lambda: bool(second.controls.strategy_panel.names()), timeout=30000)
    try:
        assert second.theme_name == "light"
        assert second.controls.prompt_panel.text() == "remember me"
        assert second.controls.settings_panel.max_new_tokens.value() == 77
        assert second.controls.strategy_panel.current() == "sliding"
        assert second.controls.strategy_panel.values()["window"] == 64
        assert second.controls.model_panel.current_spec() == "default"  # "tiny" was typed, never loaded
    finally:
        second.close()


def test_close_mid_run_ends_the_thread_quickly(qtbot, drive, settings):
    import time

    from kvviz.qt.main_window import MainWindow

    win = MainWindow(settings=settings)
    qtbot.addWidget(win)
    drive.load(win, "tiny")
    win.controls.settings_panel.max_new_tokens.setValue(2000)
    run_id = win.start_run()
    qtbot.waitUntil(lambda: len(win.store.runs[run_id].trace.steps) >= 2, timeout=30000)
    started = time.perf_counter()
    win.close()
    assert time.perf_counter() - started < 2.0
    assert not win.model.thread.isRunning()


def test_themes_style_the_window(window):
    """Each theme's stylesheet parses and is applied: the status bar is painted in the colour its stylesheet
    gives it, and the plots in their palette's background."""
    painted = {}
    for name in theme.THEMES:
        sheet = theme.stylesheet(name)
        declared = re.search(r"^QStatusBar \{ background-color: (#[0-9a-f]{6});", sheet, re.MULTILINE)
        assert declared, f"{name}.qss gives the status bar no background"
        window.set_theme(name)
        assert window.menus.theme_actions[name].isChecked()
        bar = window.statusBar().grab().toImage()
        # the colour most of its middle row has (its labels have no background; their text covers little of it)
        row = [bar.pixelColor(x, bar.height() // 2).name() for x in range(0, bar.width(), 3)]
        painted[name] = max(set(row), key=row.count)
        assert painted[name] == declared.group(1), (name, painted[name])
        plot = window.modes["local"].view.memory_plot.widget
        assert plot.backgroundBrush().color().name() == theme.PALETTES[name].background
    assert len(set(painted.values())) == len(theme.THEMES)


def test_zooming_one_plot_over_tokens_zooms_the_others_and_a_double_click_fits_them_all(qtbot, window):
    from tests.qt.test_cache_cells import trace_of

    window.show_kept(trace_of(40))
    window.redraw()
    view = window.modes["local"].view
    memory, latency = view.memory_plot, view.latency_plot
    fitted = latency.plot.vb.viewRange()[0]
    memory.plot.vb.setXRange(20.0, 30.0, padding=0)  # as a drag or the wheel does, then says so
    memory.plot.vb.sigRangeChangedManually.emit([True, False])
    assert latency.plot.vb.viewRange()[0] == pytest.approx([20.0, 30.0])
    assert view.fidelity_plot.plot.vb.viewRange()[0] == pytest.approx([20.0, 30.0])
    assert latency._follow_y and not memory._follow_y  # only the plot zoomed by hand stops fitting its y
    window.redraw()  # a zoomed plot stays where the user put it
    assert latency.plot.vb.viewRange()[0] == pytest.approx([20.0, 30.0])
    latency.reset_view()
    assert memory.plot.vb.viewRange()[0] == pytest.approx(fitted)
    assert latency.plot.vb.viewRange()[0] == pytest.approx(fitted)


def test_what_outlives_a_load_or_a_run_is_left_out_of_full_collections(qtbot, drive, window):
    """Python's full collections walk every object not frozen, with the GIL held: the model's and every kept
    trace's (350 ms every 8th run or so with the default model, the window frozen meanwhile)."""
    import gc

    drive.load(window, "tiny")
    after_load = gc.get_freeze_count()
    assert after_load > 100_000  # torch, transformers and the model
    run_id = drive.run(window, tokens=12)
    last = window.store.runs[run_id].trace.steps[-1]
    qtbot.waitUntil(lambda: gc.get_freeze_count() > after_load)  # the worker froze the run's trace
    assert gc.is_tracked(last) and not any(obj is last for obj in gc.get_objects())
