"""`kvviz bench --gui`: what the window costs the generation, and how redraw cost grows.

Three figures (issue 3):
- tokens/s in the window divided by tokens/s headless with the same settings (target >= 0.90);
- the event loop's worst stall while the window generates (target < 50 ms);
- redraw time at `long_tokens` generated tokens divided by redraw time at 128 (target <= 2).

Print-free: returns a dict of the figures and the numbers behind them.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from kvviz.qt import worker  # noqa: F401 - sets OMP_WAIT_POLICY before torch is imported

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _app():
    if not os.environ.get("QT_QPA_PLATFORM") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        if sys.platform.startswith("linux"):
            os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from PySide6.QtWidgets import QApplication

    return QApplication.instance() or QApplication(["kvviz-bench"])


def _headless(loaded, strategy: str, options: dict, settings: dict, prompt: str) -> dict[str, Any]:
    """The same decode without the window, on a plain thread (as the window's worker runs it)."""
    import threading

    from kvviz.engine import decode, strategies

    decoder = decode.Decoder(loaded, strategies.choose(strategy, dict(options)), decode.GenerationSettings(**settings),
                             prompt)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in decoder:
                pass
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            errors.append(exc)

    thread = threading.Thread(target=work, name="kvviz-bench-headless")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return decoder.trace.summary()


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


def _wait(app, predicate: Callable[[], bool], timeout_s: float) -> bool:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    poll = QTimer()
    poll.setInterval(20)
    poll.timeout.connect(lambda: predicate() and loop.quit())
    poll.start()
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    if not predicate():
        loop.exec()
    poll.stop()
    return predicate()


def _window_run(app, window, tokens: int, timeout_s: float) -> tuple[dict[str, Any], float]:
    window.settings_panel.max_new_tokens.setValue(tokens)
    meter = _StallMeter()
    meter.start()
    run_id = window.start_run(extra_settings={"stop_at_eos": False})
    if run_id is None:
        raise RuntimeError(f"the window did not start a run: {window.last_error}")
    # the stall that matters is while tokens stream; the prefill step is on the worker thread too
    _wait(app, lambda: window.active_run is None, timeout_s)
    meter.stop()
    if window.status_of.get(run_id) != "finished":
        raise RuntimeError(f"window run ended as {window.status_of.get(run_id)}: {window.last_error}")
    return window.runs[run_id].trace.summary(), meter.worst_ms


def _redraw_ms(app, window, trace, n: int, samples: int = 12) -> float:
    """Median time of a live redraw (buffers + setData + paint) when the run holds about n steps."""
    from kvviz.qt.series import RunSeries
    from kvviz.trace import Trace

    steps = trace.steps[:n]
    header = Trace(model=trace.model, strategy=trace.strategy, prompt=trace.prompt,
                   prompt_tokens=trace.prompt_tokens, settings=trace.settings)
    run_id = window._next_run
    window._next_run += 1
    series = RunSeries(run_id, header)
    window.runs[run_id] = series
    window.status_of[run_id] = "running"
    window.active_run = run_id
    window.runs_table.add_run(series, "running", select=True)
    series.extend(steps[: max(n - samples, 1)])
    window.redraw()
    window.repaint()
    app.processEvents()
    times = []
    for step in steps[max(n - samples, 1):]:
        started = time.perf_counter()
        window._on_step(run_id, step)
        window.redraw()
        window.repaint()
        times.append((time.perf_counter() - started) * 1000.0)
    window.active_run = None
    series.finished = True
    window.status_of[run_id] = "finished"
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

    The redraw figures come from real engine records of a `long_tokens` run of `long_model`
    (headless, so that it does not take minutes on the default model), fed into the window as a
    live run would be.
    """
    say = progress or (lambda message: None)
    torch_was_imported = "torch" in sys.modules  # then OMP_WAIT_POLICY came too late to matter
    app = _app()
    from PySide6.QtCore import QSettings

    from kvviz.engine import decode, models, strategies
    from kvviz.qt.main_window import MainWindow

    options = dict(options or {})
    strategies.choose(strategy, dict(options))  # fail early, with the engine's message
    say(f"loading {model}")
    loaded = models.load_model(model)
    tokens = new_tokens
    settings = {"max_new_tokens": tokens, "stop_at_eos": False}

    ini = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"kvviz-bench-{os.getpid()}.ini")
    window = MainWindow(settings=QSettings(ini, QSettings.Format.IniFormat))
    window.resize(1600, 1000)
    window.show()
    try:
        _wait(app, lambda: bool(window.strategy_panel.names()), 60)
        window.adopt_model(loaded)
        _wait(app, lambda: window.card is not None, 60)
        window.prompt_panel.set_text(prompt)
        window.strategy_panel.set_current(strategy)
        for name, value in options.items():
            window.strategy_panel.set_option(name, value)
        window.settings_panel.mode.setCurrentText("greedy")
        window.settings_panel.raw.setChecked(False)

        say("warming up")
        _headless(loaded, strategy, options, {"max_new_tokens": 8, "stop_at_eos": False}, prompt)
        headless_rates, window_rates, stalls = [], [], []
        for i in range(repeats):
            say(f"headless run {i + 1}/{repeats}")
            headless_rates.append(_headless(loaded, strategy, options, settings, prompt)["decode_tokens_per_s"])
            say(f"window run {i + 1}/{repeats}")
            summary, stall = _window_run(app, window, tokens, timeout_s=600)
            window_rates.append(summary["decode_tokens_per_s"])
            stalls.append(stall)

        say(f"generating {long_tokens} tokens with {long_model} for the redraw figures")
        long_loaded = loaded if long_model == model else models.load_model(long_model)
        long = decode.Decoder(
            long_loaded, strategies.choose(strategy, dict(options)),
            decode.GenerationSettings(max_new_tokens=long_tokens, stop_at_eos=False), "Hi",
        )
        for _ in long:
            pass
        trace = long.trace
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
        "model": loaded.card.get("name", model),
        "strategy": strategy,
        "options": options,
        "new_tokens": tokens,
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
