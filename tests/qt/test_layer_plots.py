"""The per-layer time plot on hand-made records: it says why it is empty, and "not measured" only where a run's
decode steps really carry no layer times (not while a warm-up or the prefill runs)."""

from __future__ import annotations

from kvviz.files.trace import LayerRecord, StepRecord, Trace
from kvviz.qt.series import RunSeries


def step(index: int, layer_ms: float | None) -> StepRecord:
    layers = [LayerRecord(100, 100, 4 + index, 4 + index, layer_ms=layer_ms) for _ in range(2)]
    return StepRecord(index=index, phase="prefill" if index == 0 else "decode", token_id=7, token=" w",
                      wall_ms=3.0, cache_bytes=400, predicted_cache_bytes=400, rss_bytes=1, strategy="quantized",
                      layers=layers)


def test_layer_time_says_not_yet_until_the_first_decode_step(qtbot):
    from kvviz.qt.plots import LayerTimePlot

    plot = LayerTimePlot()
    qtbot.addWidget(plot)
    trace = Trace(model={}, strategy={"name": "quantized", "options": {}}, prompt_tokens=4)
    live = RunSeries(1, trace)  # a warm-up (quanto's kernels) or the prefill: no decode step yet
    plot.redraw([live], live)
    waiting = plot.note_text()
    assert waiting and "not measured" not in waiting
    trace.steps.append(step(0, 2.0))
    live.sync()
    plot.redraw([live], live)
    assert plot.note_text() == waiting
    trace.steps.append(step(1, 1.5))
    live.sync()
    plot.redraw([live], live)
    assert plot.note_text() == "" and plot.has_data()

    # decode steps without layer times (a compiled run): that is "not measured"
    compiled = RunSeries.from_trace(2, Trace(model={}, strategy={"name": "static", "options": {}}, prompt_tokens=4,
                                              steps=[step(0, None), step(1, None)]))
    plot.redraw([compiled], compiled)
    assert plot.note_text() == "per-layer time is not measured for this run"
    # a finished run of one token has no decode step to time
    single = RunSeries.from_trace(3, Trace(model={}, strategy={"name": "dynamic", "options": {}}, prompt_tokens=4,
                                            steps=[step(0, 2.0)]))
    plot.redraw([single], single)
    assert "no decode step" in plot.note_text()
    plot.redraw([], None)
    assert plot.note_text() == ""
