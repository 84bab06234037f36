"""Switching strategy in the window while tokens stream, and the fidelity plot."""

from __future__ import annotations

import threading

import numpy as np
import pytest


def test_switch_mid_run_converts_and_marks_the_plots(qtbot, drive, window, monkeypatch):
    from kvviz.engine import strategies as engine_strategies

    # the engine's part of a switch (reading the options, checking the cache) must not run on the GUI thread
    threads = []
    choose = engine_strategies.choose

    def choose_noting_the_thread(*args, **kwargs):
        threads.append(threading.get_ident())
        return choose(*args, **kwargs)

    monkeypatch.setattr(engine_strategies, "choose", choose_noting_the_thread)
    drive.load(window, "tiny")
    window.controls.prompt_panel.editor.setPlainText("Switch me while I generate")
    window.controls.settings_panel.max_new_tokens.setValue(400)
    assert window.controls.strategy_panel.set_current("dynamic")
    with qtbot.waitSignal(window.sigRunDone, timeout=180000):
        run_id = window.start_run(extra_settings={"stop_at_eos": False})
        qtbot.waitUntil(lambda: len(window.store.runs[run_id].trace.steps) >= 5, timeout=60000)
        assert window.controls.strategy_panel.set_current("sink")
        window.controls.strategy_panel.set_option("window", 8)
        threads.clear()
        with qtbot.waitSignal(window.model.worker.sigSwitchAccepted, timeout=60000) as accepted:
            assert window.switch_strategy(), window.last_error
        assert accepted.args == ["sink"]
        assert threads and threading.get_ident() not in threads
        qtbot.waitUntil(lambda: bool(window.store.runs[run_id].switches), timeout=60000)
        window.stop_run()
    trace = window.store.runs[run_id].trace
    assert len(trace.switches) == 1
    switch = trace.switches[0]
    assert (switch.from_strategy, switch.to_strategy, switch.options["window"]) == ("dynamic", "sink", 8)
    strategies = [s.strategy for s in trace.steps]
    assert strategies[: switch.step] == ["dynamic"] * switch.step
    assert set(strategies[switch.step :]) == {"sink"}
    x = trace.prompt_tokens + switch.step
    assert window.modes["local"].view.memory_plot.switch_positions(run_id) == [x]
    assert window.modes["local"].view.latency_plot.switch_positions(run_id) == [x]
    # the sink cache holds 4 + 8 tokens after the switch, far less than the dynamic one before it
    assert trace.steps[switch.step].layers[0].seq_len == 12
    # the table and the cache map's title name the switch, not only the strategy the run began with
    window.redraw()
    assert window.runs_table.cell(run_id, "strategy") == f"dynamic -> sink (sink_tokens=4, window=8) @{switch.step}"
    title = window.modes["local"].view.cache_map.title_label.detail  # shown whole where it fits, else shortened
    assert f"#{run_id} sink (sink_tokens=4, window=8), from dynamic at step {switch.step}" in title


def test_refused_switch_shows_the_reason_and_the_run_goes_on(qtbot, drive, window):
    drive.load(window, "tiny")
    window.controls.prompt_panel.editor.setPlainText("Refuse me")
    window.controls.settings_panel.max_new_tokens.setValue(400)
    assert window.controls.strategy_panel.set_current("sliding")
    window.controls.strategy_panel.set_option("window", 4)
    with qtbot.waitSignal(window.sigRunDone, timeout=180000):
        run_id = window.start_run(extra_settings={"stop_at_eos": False})
        qtbot.waitUntil(lambda: len(window.store.runs[run_id].trace.steps) >= 8, timeout=60000)
        assert window.controls.strategy_panel.set_current("static")
        # the worker checks the request on its own thread and answers with a signal
        with qtbot.waitSignal(window.model.worker.sigSwitchRefused, timeout=60000) as refused:
            assert window.switch_strategy()
        assert refused.args[0] == "static" and "has already evicted tokens" in refused.args[1]
        # the window's own slot runs on the GUI thread, once the queued signal is delivered
        qtbot.waitUntil(lambda: "has already evicted tokens" in window.last_error, timeout=5000)
        window.stop_run()
    assert window.store.runs[run_id].trace.switches == []


def test_reference_run_plots_kl(qtbot, drive, window):
    drive.load(window, "tiny")
    window.modes["local"].reference_box.setChecked(True)
    run_id = drive.run(window, "sliding", {"window": 4}, tokens=16)
    steps = window.store.runs[run_id].trace.steps
    assert all(s.kl is not None for s in steps)
    assert window.modes["local"].view.fidelity_plot.isVisible()
    x, kl = window.modes["local"].view.fidelity_plot.curve_data(run_id)[0]
    np.testing.assert_allclose(kl, [s.kl for s in steps])
    assert max(kl) > 0  # a 4-token window on a 16-token run does lose information
    summary = window.store.runs[run_id].trace.summary()
    cells = [window.runs_table.cell(run_id, column) for column in ("top-1 agree", "mean KL", "first diverge")]
    assert cells == [f"{summary['top1_agreement']:,.3f}", f"{summary['mean_kl']:,.4f}",
                     "none" if summary["first_divergence"] is None else f"step {summary['first_divergence']}"]


@pytest.mark.parametrize(("start", "to", "why"), [
    (("dynamic", {}), ("kvzip", {"budget": 8}), "kvzip scores a prompt by having the model read it again"),
    (("snapkv", {"budget": 8, "window": 4, "adaptive": True}), ("sliding", {"window": 8}),
     "'snapkv' with adaptive=true keeps a different number of tokens in each KV head"),
])
def test_a_switch_the_engine_refuses_is_said_by_name_and_the_run_goes_on(qtbot, drive, window, start, to, why):
    """KVzip needs the prompt read again (no switch gives it), AdaKV's KV heads hold different tokens (no other cache
    takes them over): the engine's refusal, as one sentence above the views, and the run decodes on."""
    drive.load(window, "tiny")
    window.controls.prompt_panel.editor.setPlainText("Refuse me, please, with a reason I can read")
    window.controls.settings_panel.max_new_tokens.setValue(400)
    pick(window, *start)
    with qtbot.waitSignal(window.sigRunDone, timeout=180000):
        run_id = window.start_run(extra_settings={"stop_at_eos": False})
        assert run_id is not None, window.last_error

        def steps() -> int:  # the producer's trace replaces the request's once the run starts: read it each time
            return len(window.store.runs[run_id].trace.steps)

        qtbot.waitUntil(lambda: steps() >= 4, timeout=60000)
        pick(window, *to)
        with qtbot.waitSignal(window.model.worker.sigSwitchRefused, timeout=60000):
            assert window.switch_strategy()
        qtbot.waitUntil(lambda: why in window.last_error, timeout=5000)
        refused_at = steps()
        qtbot.waitUntil(lambda: steps() >= refused_at + 3, timeout=60000)  # it decodes on
        window.stop_run()
    assert window.last_error.startswith(f"Cannot switch from {start[0]!r} to {to[0]!r}: "), window.last_error
    assert "Error" not in window.last_error and "Traceback" not in window.last_error
    assert window.store.runs[run_id].trace.switches == []
    assert {s.strategy for s in window.store.runs[run_id].trace.steps} == {start[0]}


def pick(window, strategy: str, options: dict) -> None:
    picker = window.controls.strategy_panel
    assert picker.set_current(strategy)
    for name, value in options.items():
        picker.set_option(name, value)
