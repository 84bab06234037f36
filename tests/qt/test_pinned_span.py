"""A pinned span in a Local run on the tiny model: words of the prompt pinned (as the Pin button and the Tokens
panel's menu do) or a task item's needle; the cache map outlines the span per layer in the colour of what its KV
heads hold, and the Runs table says in how many layer-heads it is held: both read from the run's own trace."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from kvviz.files.trace import heads_holding
from kvviz.qt.panels.tokens import PIN_ALPHA
from kvviz.qt.plots.pin_outline import Held, layer_states
from tests.qt.conftest import load, run

PROMPT = ("The sky was grey over the harbour and the boats lay still. The secret word is persimmon, remember it. "
          "Then the wind rose, the gulls cried over the water, the nets were hauled in and the town went to sleep.")
NEEDLE = "The secret word is persimmon"


def drawn_states(plot) -> dict[Held, int]:
    """How many layers of each state the cache map outlines (two lines each: the span's left and right edge)."""
    out = {}
    for state, curve in plot.pin_curves.items():
        xs, _ = curve.getData()
        out[state] = 0 if xs is None else int(np.isnan(xs).sum()) // 2
    return out


def test_a_pinned_span_is_outlined_and_counted_as_the_trace_says(window, qtbot):
    load(qtbot, window)
    window.set_mode("local")
    local = window.modes["local"]
    pins = window.panels.pin_panel
    editor = window.controls.prompt_panel.editor
    editor.setPlainText(PROMPT)
    local.pin_selection()  # nothing selected: nothing pinned, and the panel says what to do
    assert pins.texts == [] and "select" in pins.listing.text()
    cursor = editor.textCursor()
    cursor.setPosition(PROMPT.index(NEEDLE))
    cursor.setPosition(PROMPT.index(NEEDLE) + len(NEEDLE), QTextCursor.MoveMode.KeepAnchor)
    editor.setTextCursor(cursor)
    pins.pin_button.click()
    assert pins.texts == [NEEDLE]

    # a sink cache of a few tokens: the needle, early in the prompt, is evicted from every layer by the end
    run_id = run(qtbot, window, "sink", {"sink_tokens": 2, "window": 8}, tokens=4, prompt=PROMPT)
    window.redraw()
    trace = window.store.runs[run_id].trace
    assert [p.label for p in trace.pins] == [NEEDLE]
    pin, last = trace.pins[0], trace.steps[-1]
    held = last.pins_held[0]
    states = layer_states(held, pin.size)
    assert set(states) == {Held.NONE}
    plot = local.view.cache_map
    assert drawn_states(plot) == {Held.ALL: 0, Held.SOME: 0, Held.NONE: len(states)}
    xs, ys = plot.pin_curves[Held.NONE].getData()
    assert np.nanmin(xs) == pin.start and np.nanmax(xs) == pin.end
    holding = heads_holding(held, pin.size)
    assert holding.held == 0
    assert window.runs_table.cell(run_id, "needle held") == f"0 of {holding.layers} x {holding.heads}"
    assert plot.title_label.detail.startswith(f"needle {holding.text()}; #{run_id} sink")

    # the same span under the exact cache: held by every layer-head
    run_id = run(qtbot, window, "dynamic", tokens=4, prompt=PROMPT)
    window.redraw()
    trace = window.store.runs[run_id].trace
    holding = heads_holding(trace.steps[-1].pins_held[0], trace.pins[0].size)
    assert holding.held == holding.layer_heads > 0
    assert drawn_states(plot)[Held.ALL] == holding.layers
    held = f"{holding.layer_heads} of {holding.layers} x {holding.heads}"
    assert window.runs_table.cell(run_id, "needle held") == held

    # words of the prompt selected in the Tokens panel pin there (its menu's action); generated text does not
    view = window.token_view
    shaded = QTextCursor(view.document())  # the pinned words shaded in the prompt shown, and only they
    shaded.setPosition(PROMPT.index(NEEDLE) + 1)
    assert shaded.charFormat().background().color().alpha() == PIN_ALPHA
    shaded.setPosition(PROMPT.index(NEEDLE) - 2)
    assert shaded.charFormat().background().style() == Qt.BrushStyle.NoBrush
    cursor = view.textCursor()
    cursor.setPosition(PROMPT.index(NEEDLE))
    cursor.setPosition(PROMPT.index(NEEDLE) + len(NEEDLE), QTextCursor.MoveMode.KeepAnchor)
    view.setTextCursor(cursor)
    assert view.pinnable() == NEEDLE
    pins.clear_button.click()
    view.sigPin.emit(view.pinnable())
    assert pins.texts == [NEEDLE]
    cursor.setPosition(len(PROMPT) + 1, QTextCursor.MoveMode.KeepAnchor)
    view.setTextCursor(cursor)
    assert view.pinnable() == ""

    # a run with nothing pinned says "-"
    pins.clear_button.click()
    run_id = run(qtbot, window, "dynamic", tokens=2, prompt=PROMPT)
    window.redraw()
    assert window.runs_table.cell(run_id, "needle held") == "–" and drawn_states(plot) == dict.fromkeys(Held, 0)


def test_a_task_item_is_written_into_the_prompt_with_its_needle_pinned(window, qtbot):
    load(qtbot, window)
    window.set_mode("local")
    local, pins = window.modes["local"], window.panels.pin_panel
    with qtbot.waitSignal(local.sigItemDone, timeout=30000):
        local.write_item("niah_single_1", 300)
    prompt = window.controls.prompt_panel.text()
    assert len(pins.texts) == 1 and pins.texts[0] in prompt and "magic number" in prompt
    # an item that cannot be written that short: the engine's words, the prompt and the pins kept
    with qtbot.waitSignal(local.sigItemDone, timeout=30000):
        local.write_item("niah_multikey_1", 64)
    assert "at least" in window.last_error and window.controls.prompt_panel.text() == prompt
    assert len(pins.texts) == 1


def test_a_pinned_span_is_held_until_a_live_switch_evicts_it(window, qtbot):
    load(qtbot, window)
    window.set_mode("local")
    window.panels.pin_panel.set_texts([NEEDLE])
    window.controls.prompt_panel.editor.setPlainText(PROMPT)
    window.controls.settings_panel.max_new_tokens.setValue(400)
    assert window.controls.strategy_panel.set_current("dynamic")
    with qtbot.waitSignal(window.sigRunDone, timeout=180000):
        run_id = window.start_run(extra_settings={"stop_at_eos": False})
        qtbot.waitUntil(lambda: len(window.store.runs[run_id].trace.steps) >= 3, timeout=60000)
        assert window.controls.strategy_panel.set_current("sink")
        window.controls.strategy_panel.set_option("window", 8)
        with qtbot.waitSignal(window.model.worker.sigSwitchAccepted, timeout=60000):
            assert window.switch_strategy(), window.last_error
        qtbot.waitUntil(lambda: len(window.store.runs[run_id].switches) == 1, timeout=60000)
        window.stop_run()
    window.redraw()
    trace = window.store.runs[run_id].trace
    pin, at = trace.pins[0], trace.switches[0].step
    before = {s for step in trace.steps[:at] for s in layer_states(step.pins_held[0], pin.size)}
    after = {s for step in trace.steps[at:] for s in layer_states(step.pins_held[0], pin.size)}
    assert before == {Held.ALL} and after == {Held.NONE}
    layers = len(trace.steps[-1].pins_held[0])
    assert drawn_states(window.modes["local"].view.cache_map) == {Held.ALL: 0, Held.SOME: 0, Held.NONE: layers}
    holding = heads_holding(trace.steps[-1].pins_held[0], pin.size)
    assert window.runs_table.cell(run_id, "needle held") == f"0 of {holding.layers} x {holding.heads}"
