"""The per-layer time plot on hand-made records: it says why it is empty, and "not measured" only where a run's
decode steps really carry no layer times (not while a warm-up or the prefill runs)."""

from __future__ import annotations

import html

import pytest

from kvviz.files.trace import LayerRecord, StepRecord, Trace
from kvviz.qt.cache_cells import quoted
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


def test_an_encoder_decoders_cross_attention_is_drawn_as_its_fixed_part(qtbot, tiny_model):
    from kvviz.engine import decode, strategies
    from kvviz.qt.plots import CacheMapPlot, LayerBytesPlot, MemoryPlot
    from kvviz.qt.series import FIXED_CROSS, FIXED_MIB
    from tests.engine.families import tiny_encoder_decoder

    loaded = tiny_encoder_decoder("t5", tiny_model.tokenizer)
    settings = decode.GenerationSettings(max_new_tokens=3, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(loaded, strategies.choose("dynamic"), settings, "The cache of a model")
    for _ in decoder:
        pass
    series = RunSeries.from_trace(1, decoder.trace)
    cross = sum(layer.cross_bytes for layer in decoder.trace.steps[-1].layers)
    assert series.fixed_kind == FIXED_CROSS and cross > 0
    assert series.column(FIXED_MIB)[-1] * 2**20 == pytest.approx(cross)  # the memory plot's dotted part
    bars, memory, cache_map = LayerBytesPlot(), MemoryPlot(), CacheMapPlot()
    for plot in (bars, memory, cache_map):
        qtbot.addWidget(plot)
        plot.redraw([series], series)
    assert "cross-attention keys + values" in bars.legend_bar.texts()
    assert "cross-attention" in bars.hover_text(0, 0)
    assert "of it cross-attention" in memory.legend_bar.texts()
    assert memory.y_bounds()[0] == 0  # from 0: the dotted fixed part stays off the axis
    prompt = decoder.prompt_tokens
    # the map's positions are the decoder's: its start token, then the tokens generated; the prompt went to the encoder
    first = quoted(decoder.trace.steps[0].token)
    assert html.unescape(cache_map.hover_text(1.5, 0)).startswith(f"layer 0, position 1 {first}: full precision; ")
    assert f"cross-attention keys and values of the {prompt} prompt tokens" in cache_map.hover_text(1.5, 0)


def test_latent_attention_is_named_in_the_per_layer_plot(qtbot):
    from kvviz.qt.plots import LayerBytesPlot

    latent = {"kv_lora_rank": 16, "qk_rope_head_dim": 8, "stored_bytes": 96, "expanded_bytes": 512, "factor": 5.33}
    trace = Trace(model={"latent_attention": latent}, strategy={"name": "dynamic", "options": {}}, prompt_tokens=4,
                  steps=[step(0, 1.0)])
    series = RunSeries.from_trace(1, trace)
    plot = LayerBytesPlot()
    qtbot.addWidget(plot)
    plot.redraw([series], series)
    assert plot.legend_bar.texts()[1:3] == ["latent", "rotary key part"]  # after the run's name
    assert plot.hover_text(1, 0).startswith("layer 1: latent 0.1 KiB, rotary key part 0.1 KiB")
