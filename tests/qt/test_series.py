"""RunSeries buffers and the plots' hover readouts, on hand-made records (no engine needed)."""

from __future__ import annotations

import numpy as np

from kvviz.files.trace import LayerRecord, SlotState, StepRecord, Trace
from kvviz.present import MIB
from kvviz.qt.series import CACHE_MIB, WALL_MS, RunSeries, X


def make_step(i: int, layers: int = 3, sink: int = 2, window: int = 4, prompt: int = 10) -> StepRecord:
    held = prompt + i
    evicted = max(held - sink - window, 0)
    full = held - sink - evicted
    spans = [[int(SlotState.SINK), sink], [int(SlotState.EVICTED), evicted], [int(SlotState.FULL), full]]
    return StepRecord(
        index=i, phase="prefill" if i == 0 else "decode", token_id=i, token=f"t{i}", wall_ms=5.0 + i,
        cache_bytes=1000 * (i + 1), predicted_cache_bytes=1000 * (i + 1), rss_bytes=10, strategy="sink",
        layers=[LayerRecord(keys_bytes=100 + j, values_bytes=200 + j, seq_len=held, capacity=held,
                            layer_ms=1.0 + j, spans=spans) for j in range(layers)],
    )


def test_buffers_double_and_keep_every_step():
    series = RunSeries(1, Trace(model={}, strategy={"name": "sink", "options": {}}, prompt_tokens=10), capacity=16)
    for i in range(100):
        series.trace.steps.append(make_step(i))  # the producer appends; the series draws what is new
        assert series.sync()
    assert not series.sync()
    assert series.n == 100 and len(series.trace.steps) == 100
    assert len(series._data) == 128  # 16 -> 32 -> 64 -> 128
    np.testing.assert_allclose(series.column(X), 10 + np.arange(100))
    np.testing.assert_allclose(series.column(CACHE_MIB), 1000 * (np.arange(100) + 1) / MIB)
    np.testing.assert_allclose(series.column(WALL_MS), 5.0 + np.arange(100))
    assert series.prefill_ms == 5.0 and series.decode_start == 1
    np.testing.assert_allclose(series.layer_ms_mean(), [1.0, 2.0, 3.0])
    assert series.tokens_per_s == 1000.0 * 99 / sum(5.0 + i for i in range(1, 100))


def test_cache_map_follows_the_spans():
    series = RunSeries(1, Trace(model={}, strategy={"name": "sink", "options": {}}, prompt_tokens=10))
    series.trace.steps.extend(make_step(i) for i in range(5))
    series.sync()
    image = series.cache_map()
    assert image.shape == (3, 14)
    assert (image[:, :2] == SlotState.SINK).all()
    assert (image[:, 2:10] == SlotState.EVICTED).all()
    assert (image[:, 10:] == SlotState.FULL).all()


def test_from_trace_and_hover_readouts(qtbot):
    from kvviz.qt.plots import CacheMapPlot, MemoryPlot

    trace = Trace(model={}, strategy={"name": "sink", "options": {"window": 4}}, prompt_tokens=10,
                  steps=[make_step(i) for i in range(6)])
    series = RunSeries.from_trace(3, trace)
    assert series.finished and series.n == 6 and series.label() == "#3 sink (window=4)"
    cache_map = CacheMapPlot()
    qtbot.addWidget(cache_map)
    cache_map.redraw([series], series)
    assert cache_map.hover_text(0.5, 0.0) == "layer 0, position 0: attention sink"
    assert cache_map.hover_text(5.5, 2.2) == "layer 2, position 5: evicted"
    assert cache_map.hover_text(99, 0) == ""
    memory = MemoryPlot()
    qtbot.addWidget(memory)
    memory.redraw([series], series)
    assert "12 tokens" in memory.hover_text(12.2, 0) and "MiB" in memory.hover_text(12.2, 0)


def test_token_view_keeps_paragraphs_short_with_or_without_spaces(qtbot):
    from kvviz.qt.panels.tokens import HARD_PARAGRAPH, MAX_PARAGRAPH, TokenView

    view = TokenView()
    qtbot.addWidget(view)
    for token, longest in ((" word", MAX_PARAGRAPH + 5), ("!!", HARD_PARAGRAPH + 2)):
        steps = [make_step(i) for i in range(4000)]
        for step in steps:
            step.token = token
        series = RunSeries.from_trace(1, Trace(model={}, strategy={"name": "sink", "options": {}}, prompt="",
                                               steps=steps[:2000]))
        view.show_run(series)
        series.trace.steps.extend(steps[2000:])  # and the rest as a live run's records arrive
        series.sync()
        view.update_tokens()
        paragraphs = view.toPlainText().split("\n")
        assert len(paragraphs) > 1 and max(len(p) for p in paragraphs) <= longest
        # a break at a word boundary takes the place of its space; elsewhere it only adds a line end
        assert (" " if token[0] == " " else "").join(paragraphs) == token * 4000


def test_token_view_shades_and_finds_the_step_under_the_mouse(qtbot):
    from kvviz.qt.panels.tokens import TokenView, step_tooltip

    trace = Trace(model={}, strategy={"name": "sink", "options": {}}, prompt="Prompt: ", prompt_tokens=10,
                  steps=[make_step(i) for i in range(6)])
    view = TokenView()
    qtbot.addWidget(view)
    view.resize(400, 200)
    view.show()
    view.show_run(RunSeries.from_trace(1, trace))
    assert view.toPlainText() == "Prompt: t0t1t2t3t4t5"
    cursor = view.textCursor()
    cursor.setPosition(len("Prompt: t0t1t2") + 1)  # inside "t3"
    rect = view.cursorRect(cursor)
    assert view.step_at(rect.center()) == 3
    assert "step 3 (decode)" in step_tooltip(trace.steps[3])
