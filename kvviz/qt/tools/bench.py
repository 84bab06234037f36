"""`kvviz bench --gui`: the window's decode speed against the user's own code, its stalls, its redraw cost.

The figures:
- decode tokens/s in the window and in kvviz headless, each divided by plain `model.generate` in a fresh
  process with the user's environment (kvviz.engine.bench: the reference; targets >= 0.95 and >= 0.97);
- the event loop's worst stall while the window generates (target < 33 ms: two frames at 60 Hz);
- redraw time at `long_tokens` generated tokens divided by redraw time at 128 (target <= 2).

Every rate is taken the same way: tokens between the first and the last new token, as they leave the
decode loop (the window's are timestamped on its worker thread as each step is handed over), from the
same prompt tokens (the window's chat template is off). Runs are interleaved (reference, headless, window,
then a window run whose event loop is timed: the stall meter wakes the GUI thread 200 times a second, so
it never runs while a rate is taken), and a last reference run closes the series. A ratio is the median over
the repeats of each run's rate over the mean of the reference runs just before and just after it: this
machine's speed drifts by 5-7 % within minutes (plain `generate` in five fresh processes ran from 16.4 to
17.6 tokens/s within four minutes, the machine idle), which a ratio of medians taken minutes apart carries,
and a reference on one side only carries by as much as it drifted in between.

The window is driven as a user drives it: the model loads through its worker, runs start with Run and end
on their own. Print-free: returns a dict of the figures.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from kvviz.engine.bench import PROMPT, bracketed_ratio, timed_run
from kvviz.engine.timed_run import decode_rate
from kvviz.present import FINISHED, RUNNING
from kvviz.qt.tools import drive


class StallMeter:
    """A 5 ms timer; the longest gap between its ticks beyond 5 ms is the worst event-loop stall."""

    def __init__(self, interval_ms: int = 5):
        from PySide6.QtCore import QTimer

        self.interval_ms = interval_ms
        self.worst_ms = 0.0
        self._last = None
        self.timer = QTimer()
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._tick)

    def start(self) -> None:
        self._last = time.perf_counter()
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def _tick(self) -> None:
        now = time.perf_counter()
        gap = (now - self._last) * 1000.0 - self.interval_ms
        self.worst_ms = max(self.worst_ms, gap)
        self._last = now


def _window_rate(window, tokens: int, timeout_s: float) -> tuple[int, float]:
    """One run through the window's Run: its id and its decode tokens/s."""
    handed_over: list[float] = []

    def stamp(run_id, step) -> None:  # a plain function: Qt calls it on the worker's thread, as the step leaves
        handed_over.append(time.perf_counter())

    worker = window.model.worker
    worker.sigStep.connect(stamp)
    try:
        run_id = drive.run(window, tokens, timeout_s, extra_settings={"stop_at_eos": False})
    finally:
        worker.sigStep.disconnect(stamp)
    if run_id is None:
        raise RuntimeError(f"the window did not start a run: {window.last_error}")
    status = window.store.status(run_id)
    if status != FINISHED:
        raise RuntimeError(f"window run ended as {status}: {window.last_error}")
    return run_id, decode_rate(handed_over[1:])


def _window_stall(window, tokens: int, timeout_s: float) -> float:
    """The worst event-loop stall during one run through the window's Run. A run of its own: the meter's
    200 wake-ups a second cost the decode about 2 % on 2 cores, which no user's window pays."""
    meter = StallMeter()
    meter.start()
    try:  # the stall that matters is while tokens stream; the prefill step is on the worker thread too
        _window_rate(window, tokens, timeout_s)
    finally:
        meter.stop()
    return meter.worst_ms


def _redraw_ms(app, window, trace, n: int, samples: int = 12) -> float:
    """Median time of a live redraw (buffers + setData + paint) when the run holds about n steps: the run's
    records replayed into the store, as a producer adds them."""
    from kvviz.files.trace import Trace

    steps = trace.steps[:n]
    live = Trace(model=trace.model, strategy=trace.strategy, prompt=trace.prompt,
                 prompt_tokens=trace.prompt_tokens, settings=trace.settings)
    store = window.store
    run_id = store.add(live, RUNNING, generating=True)
    live.steps.extend(steps[: max(n - samples, 1)])
    store.records_arrived(run_id)
    window.redraw()
    window.repaint()
    app.processEvents()
    times = []
    for step in steps[max(n - samples, 1):]:
        started = time.perf_counter()
        live.steps.append(step)
        store.records_arrived(run_id)
        window.redraw()
        window.repaint()
        times.append((time.perf_counter() - started) * 1000.0)
    store.end(run_id, FINISHED)
    return statistics.median(times)


def run_gui_bench(
    model: str = "default",
    strategy: str = "dynamic",
    options: dict[str, Any] | None = None,
    new_tokens: int = 128,
    prompt: str = PROMPT,
    repeats: int = 5,
    long_model: str = "tiny",
    long_tokens: int = 4000,  # the tiny model's context is 4,096 positions, the prompt's included
    short_tokens: int = 128,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure the window and kvviz headless against model.generate; see the module docstring for the figures.

    The redraw figures come from the records of a `long_tokens` run of `long_model` in the window (the
    tiny model, so that it does not take minutes), replayed into the window as a live run's arrive.
    """
    say = progress or (lambda message: None)
    options = dict(options or {})
    say(f"loading {model}")
    with drive.scratch_window("kvviz-bench", (1600, 1000), model) as (app, window):
        model_name = window.model.card.get("name", model)
        window.controls.prompt_panel.set_text(prompt)
        if not drive.choose(window, strategy, options):
            raise RuntimeError(f"strategy {strategy!r} is not available here")
        window.controls.settings_panel.mode.setCurrentText("greedy")
        window.controls.settings_panel.raw.setChecked(True)  # the reference's tokens: the prompt as typed

        say("warming up")
        _window_rate(window, 8, timeout_s=600)
        reference, headless, in_window, stalls = [], [], [], []
        for i in range(repeats):
            say(f"model.generate {i + 1}/{repeats} (own process)")
            reference.append(timed_run("generate", model, strategy, options, new_tokens, prompt=prompt)["tokens_per_s"])
            say(f"kvviz headless {i + 1}/{repeats} (own process)")
            headless.append(timed_run("kvviz", model, strategy, options, new_tokens, prompt=prompt)["tokens_per_s"])
            say(f"window run {i + 1}/{repeats}")
            in_window.append(_window_rate(window, new_tokens, timeout_s=600)[1])
            say(f"window run {i + 1}/{repeats}, its event loop timed")
            stalls.append(_window_stall(window, new_tokens, timeout_s=600))
        say("model.generate, closing the series (own process)")
        reference.append(timed_run("generate", model, strategy, options, new_tokens, prompt=prompt)["tokens_per_s"])

        say(f"generating {long_tokens} tokens with {long_model} in the window for the redraw figures")
        if long_model != model and not drive.load(window, long_model):
            raise RuntimeError(f"the window could not load {long_model!r}: {window.last_error}")
        window.controls.prompt_panel.set_text("Hi")
        long_id, _ = _window_rate(window, long_tokens, timeout_s=1800)
        trace = window.store.runs[long_id].trace
        say("timing redraws")
        redraw_short = _redraw_ms(app, window, trace, short_tokens)
        redraw_long = _redraw_ms(app, window, trace, len(trace.steps))

    generate, ours, shown = (statistics.median(rates) for rates in (reference, headless, in_window))
    return {
        "model": model_name,
        "strategy": strategy,
        "options": options,
        "new_tokens": new_tokens,
        "reference": "model.generate in a fresh process with the user's environment",
        "tokens_per_s_generate": generate,
        "tokens_per_s_headless": ours,
        "tokens_per_s_window": shown,
        "headless_over_generate": bracketed_ratio(headless, reference),
        "window_over_generate": bracketed_ratio(in_window, reference),
        "tokens_per_s_generate_runs": reference,
        "tokens_per_s_headless_runs": headless,
        "tokens_per_s_window_runs": in_window,
        "worst_stall_ms": max(stalls) if stalls else None,
        "worst_stall_ms_runs": stalls,
        "long_model": long_model,
        "long_tokens": len(trace.steps),
        "short_tokens": short_tokens,
        "redraw_ms_short": redraw_short,
        "redraw_ms_long": redraw_long,
        "redraw_long_over_short": redraw_long / redraw_short if redraw_short else None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "targets": {"headless_over_generate": ">= 0.97", "window_over_generate": ">= 0.95", "worst_stall_ms": "< 33",
                    "redraw_long_over_short": "<= 2"},
    }
