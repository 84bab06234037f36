"""Many runs in one window: memory and threads stay flat (the window is meant to stay open all day)."""

from __future__ import annotations

import threading

import numpy as np
import psutil

from tests.qt.conftest import load, run

# every strategy that runs here, with options that fit the tiny model and a 12-token run
STRATEGIES = [
    ("dynamic", {}),
    ("static", {}),
    ("quantized", {"backend": "hqq", "residual_length": 4}),
    ("sliding", {"window": 8}),
    ("sink", {"sink_tokens": 2, "window": 6}),
    ("none", {}),
    ("h2o", {"budget": 8}),
    ("tova", {"budget": 8}),
    ("snapkv", {"budget": 8, "window": 4}),
    ("knorm", {"budget": 8}),
]
RUNS = 20
WARM_UP_RUNS = 5  # allocators and caches settle during the first runs


def test_twenty_runs_leak_neither_memory_nor_threads(qtbot, window):
    load(qtbot, window, "tiny")
    process = psutil.Process()
    rss, python_threads, os_threads = [], [], []
    for i in range(RUNS):
        strategy, options = STRATEGIES[i % len(STRATEGIES)]
        try:
            run_id = run(qtbot, window, strategy, options, tokens=12, prompt=f"Run number {i}: tell me a story.")
        except AssertionError:
            raise AssertionError((i, strategy, window.last_error, window.controls.strategy_panel.problem(),
                                  window.status_line.labels["state"].text())) from None
        assert window.store.status(run_id) == "finished", (strategy, window.last_error)
        qtbot.wait(50)  # the final redraw and queued signals
        rss.append(process.memory_info().rss / 2**20)
        python_threads.append(threading.active_count())
        os_threads.append(process.num_threads())
    settled = slice(WARM_UP_RUNS, None)
    slope = np.polyfit(np.arange(RUNS)[settled], np.array(rss)[settled], 1)[0]
    assert slope < 1.0, f"RSS grows {slope:.2f} MiB per run: {[round(r) for r in rss]}"
    assert python_threads[-1] <= python_threads[WARM_UP_RUNS], python_threads
    assert os_threads[-1] <= os_threads[WARM_UP_RUNS], os_threads
