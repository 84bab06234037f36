"""`kvviz bench --gui` drives the window as a user does: nothing loads or decodes on the GUI thread."""

from __future__ import annotations

import threading


def test_gui_bench_decodes_only_on_the_worker(qapp, monkeypatch, capsys):
    from kvviz.cli.bench import print_gui_bench
    from kvviz.engine import decode, models
    from kvviz.present import ms
    from kvviz.qt.tools.bench import run_gui_bench

    threads: set[int] = set()
    load, init = models.load_model, decode.Decoder.__init__

    def load_noting_the_thread(*args, **kwargs):
        threads.add(threading.get_ident())
        return load(*args, **kwargs)

    def init_noting_the_thread(self, *args, **kwargs):
        threads.add(threading.get_ident())
        init(self, *args, **kwargs)

    monkeypatch.setattr(models, "load_model", load_noting_the_thread)
    monkeypatch.setattr(decode.Decoder, "__init__", init_noting_the_thread)
    figures = run_gui_bench(model="tiny", new_tokens=8, repeats=1, long_tokens=48, short_tokens=24)
    assert threads and threading.get_ident() not in threads  # the window's worker did all of it
    assert len(threads) == 1
    # the reference and the headless figure come from processes of their own
    assert figures["tokens_per_s_generate"] > 0 and figures["tokens_per_s_headless"] > 0
    assert figures["tokens_per_s_window"] > 0 and len(figures["tokens_per_s_window_runs"]) == 1
    assert len(figures["worst_stall_ms_runs"]) == 1  # timed in a window run of its own
    # one repeat: the ratio is the window run's rate over the mean of the reference runs before and after it
    before, after = figures["tokens_per_s_generate_runs"]
    assert figures["window_over_generate"] == figures["tokens_per_s_window"] / ((before + after) / 2.0)
    assert figures["long_tokens"] == 48 and figures["redraw_ms_short"] > 0 and figures["worst_stall_ms"] >= 0

    print_gui_bench(figures)  # what `kvviz bench --gui` prints
    printed = capsys.readouterr().out
    assert f"{figures['tokens_per_s_generate']:.2f}" in printed and f"{figures['window_over_generate']:.4f}" in printed
    met = "met" if figures["window_over_generate"] >= 0.95 else "missed"
    assert f"{figures['window_over_generate']:.4f}   >= 0.95: {met}" in printed
    assert ms(figures["worst_stall_ms"]) in printed and "at 24 tokens" in printed
