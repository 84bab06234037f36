"""`kvviz bench --gui`: what the window costs the generation, and how redraw cost grows.

Three figures (issue 3):
- tokens/s in the window divided by tokens/s headless with the same settings (target >= 0.90);
- the event loop's worst stall while the window generates (target < 50 ms);
- redraw time at `long_tokens` generated tokens divided by redraw time at 128 (target <= 2).

The window is driven as a user drives it: the model loads through its worker, runs start with Run
and end on their own. The headless figure comes from `kvviz run --json` in a separate process with
the same model, prompt, strategy and settings, so that nothing decodes on this process's GUI thread
or on a thread of the bench's own. Print-free: returns a dict of the figures and the numbers behind them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from kvviz.present import FINISHED, RUNNING
from kvviz.qt import (
    drive,
    worker,  # noqa: F401 - sets OMP_WAIT_POLICY before torch is imported
)

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _headless(model: str, strategy: str, options: dict, tokens: int, prompt: str) -> float:
    """Decode tokens/s of `kvviz run` in its own process: greedy, chat template, end-of-text ignored (as the
    window's runs here)."""
    command = [
        sys.executable, "-m", "kvviz", "run", "--json", "--no-trace", "--quiet", "--ignore-eos",
        "--model", model, "--strategy", strategy, "--prompt", prompt, "--max-new-tokens", str(tokens),
    ]
    for name, value in options.items():
        command += ["--set", f"{name}={value}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise RuntimeError(f"the headless run failed: {lines[-1] if lines else f'exit status {done.returncode}'}")
    return json.loads(done.stdout)["decode_tokens_per_s"]


class _StallMeter:
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


def _window_run(window, tokens: int, timeout_s: float) -> tuple[int, float]:
    """One run through the window's Run; its id and the worst event-loop stall while it generated."""
    meter = _StallMeter()
    meter.start()
    # the stall that matters is while tokens stream; the prefill step is on the worker thread too
    run_id = drive.run(window, tokens, timeout_s, extra_settings={"stop_at_eos": False})
    meter.stop()
    if run_id is None:
        raise RuntimeError(f"the window did not start a run: {window.last_error}")
    status = window.store.status(run_id)
    if status != FINISHED:
        raise RuntimeError(f"window run ended as {status}: {window.last_error}")
    return run_id, meter.worst_ms


def _redraw_ms(app, window, trace, n: int, samples: int = 12) -> float:
    """Median time of a live redraw (buffers + setData + paint) when the run holds about n steps: the run's
    records replayed into the store, as a producer adds them."""
    from kvviz.trace import Trace

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
    prompt: str = DEFAULT_PROMPT,
    repeats: int = 2,
    long_model: str = "tiny",
    long_tokens: int = 4096,
    short_tokens: int = 128,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure the window against the headless engine; see the module docstring for the figures.

    The redraw figures come from the records of a `long_tokens` run of `long_model` in the window (the
    tiny model, so that it does not take minutes), replayed into the window as a live run's arrive.
    """
    say = progress or (lambda message: None)
    torch_was_imported = "torch" in sys.modules  # then OMP_WAIT_POLICY came too late to matter
    app = drive.application("kvviz-bench")
    from PySide6.QtCore import QSettings

    from kvviz.qt.main_window import MainWindow

    options = dict(options or {})
    ini = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"kvviz-bench-{os.getpid()}.ini")
    window = MainWindow(settings=QSettings(ini, QSettings.Format.IniFormat))
    window.resize(1600, 1000)
    window.show()
    try:
        drive.wait(lambda: bool(window.controls.strategy_panel.names()), 60)
        say(f"loading {model}")
        if not drive.load(window, model):
            raise RuntimeError(f"the window could not load {model!r}: {window.last_error}")
        model_name = window.engine.card.get("name", model)
        window.controls.prompt_panel.set_text(prompt)
        if not drive.choose(window, strategy, options):
            raise RuntimeError(f"strategy {strategy!r} is not available here")
        window.controls.settings_panel.mode.setCurrentText("greedy")
        window.controls.settings_panel.raw.setChecked(False)

        say("warming up")
        _window_run(window, 8, timeout_s=600)
        headless_rates, window_rates, stalls = [], [], []
        for i in range(repeats):
            say(f"headless run {i + 1}/{repeats} (own process)")
            headless_rates.append(_headless(model, strategy, options, new_tokens, prompt))
            say(f"window run {i + 1}/{repeats}")
            run_id, stall = _window_run(window, new_tokens, timeout_s=600)
            window_rates.append(window.store.runs[run_id].trace.summary()["decode_tokens_per_s"])
            stalls.append(stall)

        say(f"generating {long_tokens} tokens with {long_model} in the window for the redraw figures")
        if long_model != model and not drive.load(window, long_model):
            raise RuntimeError(f"the window could not load {long_model!r}: {window.last_error}")
        window.controls.prompt_panel.set_text("Hi")
        long_id, _ = _window_run(window, long_tokens, timeout_s=1800)
        trace = window.store.runs[long_id].trace
        say("timing redraws")
        redraw_short = _redraw_ms(app, window, trace, short_tokens)
        redraw_long = _redraw_ms(app, window, trace, len(trace.steps))
    finally:
        window.close()
        try:
            os.remove(ini)
        except OSError:
            pass

    headless = statistics.median(headless_rates)
    in_window = statistics.median(window_rates)
    return {
        "model": model_name,
        "strategy": strategy,
        "options": options,
        "new_tokens": new_tokens,
        "tokens_per_s_headless": headless,
        "tokens_per_s_window": in_window,
        "window_over_headless": in_window / headless if headless else None,
        "tokens_per_s_headless_runs": headless_rates,
        "tokens_per_s_window_runs": window_rates,
        "worst_stall_ms": max(stalls) if stalls else None,
        "worst_stall_ms_runs": stalls,
        "long_model": long_model,
        "long_tokens": len(trace.steps),
        "redraw_ms_short": redraw_short,
        "redraw_ms_long": redraw_long,
        "redraw_long_over_short": redraw_long / redraw_short if redraw_short else None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "torch_imported_before_bench": torch_was_imported,
        "targets": {"window_over_headless": ">= 0.90", "worst_stall_ms": "< 50", "redraw_long_over_short": "<= 2"},
    }
