"""The attention view in the window: it draws exactly the step's attention, the engine computes it only while
the view shows, and a run opened from a file shows its sink lines and says why it has no matrix."""

from __future__ import annotations

import html
import re

import numpy as np

from kvviz.files import trace as trace_format
from kvviz.files.trace import ATTENTION_SINK_POSITIONS
from kvviz.present import RUN_TABLE, UNKNOWN
from kvviz.qt.cache_cells import quoted, token_at
from kvviz.qt.plots.attention_plots import log_image
from tests.qt.test_cache_cells import trace_of


def plain(readout: str) -> str:
    """A readout's text as shown (readouts are rich text)."""
    return html.unescape(re.sub(r"<[^>]+>", "", readout)).replace("\xa0", " ")


PROMPT = "The quick brown fox jumps over the lazy dog because it was bored of sitting still."


def test_drawn_matrix_is_the_steps_attention(qtbot, drive, window, tmp_path):
    drive.load(window)
    view = window.modes["local"].view
    view.show_attention(True)
    assert view.attention.shown
    run_id = drive.run(window, "h2o", {"budget": 12, "recent": 4}, tokens=6, prompt=PROMPT)
    series = window.store.runs[run_id]
    step = series.latest
    plot = view.attention_map
    assert step.attention is not None and plot.matrix() is step.attention
    assert step.attention.shape == (4, series.trace.prompt_tokens + step.index)
    np.testing.assert_array_equal(plot.image.image, log_image(step.attention))
    np.testing.assert_allclose(step.attention.sum(axis=1), 1.0, rtol=1e-5)  # each layer's row is a distribution
    # every step recorded its sink shares; only the latest keeps its matrix (a long run would hold gigabytes)
    x, shares = view.sink_plot.curve_data()
    np.testing.assert_array_equal(x, series.trace.prompt_tokens + np.arange(6))
    np.testing.assert_allclose(shares, [s.attention_sink for s in series.trace.steps])
    np.testing.assert_allclose(shares[-1], step.attention[:, :ATTENTION_SINK_POSITIONS].sum(axis=1), rtol=1e-5)
    assert all(s.attention is None for s in series.trace.steps[:-1])
    # the hover names the position's token and its share of the layer's attention
    text = plain(plot.hover_text(2.2, 1))
    share = step.attention[1, 2] * 100
    token = quoted(series.trace.prompt_pieces[2])
    assert text == f"layer 1, position 2 {token}: {share:.3g}% of the layer's attention"
    evicted = np.argwhere(step.attention == 0)
    assert len(evicted)  # h2o at budget 12 dropped positions in every layer
    layer, position = evicted[0]
    assert plot.hover_text(position + 0.5, layer).endswith("no attention (the layer does not hold it)")
    assert plot.title_label.detail.startswith(f"#{run_id} h2o")
    # the sink line under the mouse is named (and drawn on top)
    top = int(np.argmax(shares[-1]))
    readout = plain(view.sink_plot.hover_text(x[-1], shares[-1, top]))
    assert readout == f"{x[-1]:.0f} tokens: ■ layer {top} {shares[-1, top]:.3f}   ■ mean {shares[-1].mean():.3f}"
    # exported with every other plot, the cache map in the tab behind included, drawn with this run
    names = {path.name for path in window.file_actions.export_plots(tmp_path, formats=("png",), width=640)}
    assert {"attention_map_plot.png", "attention_sink_plot.png", "cache_map_plot.png"} <= names
    assert view.cache_map.title_label.detail.startswith(f"#{run_id} h2o") and view.cache_map.has_data()
    assert "left out: Fidelity" in window.statusBar().currentMessage()  # no reference ran
    # scoring time is its own column, known for a policy that scores and unknown for one that does not
    column = [title for title, _, _ in RUN_TABLE].index("scoring ms")
    assert window.runs_table.item(0, column).text() != UNKNOWN


def test_attention_is_computed_only_while_the_view_shows(qtbot, drive, window):
    drive.load(window)
    hidden = window.store.runs[drive.run(window, "dynamic", tokens=4, prompt=PROMPT)]
    assert all(s.attention is None and s.attention_sink is None for s in hidden.trace.steps)
    column = [title for title, _, _ in RUN_TABLE].index("scoring ms")
    assert window.runs_table.item(0, column).text() == UNKNOWN  # dynamic chooses nothing

    # shown while a run generates: the steps after it carry the attention, those before do not
    view = window.modes["local"].view
    window.controls.prompt_panel.editor.setPlainText(PROMPT)
    window.controls.settings_panel.max_new_tokens.setValue(200)
    with qtbot.waitSignal(window.sigRunDone, timeout=120000):
        run_id = window.start_run({"stop_at_eos": False})
        # the producer's trace grows with every step; the store's series only at the next frame
        qtbot.waitUntil(lambda: len(window.store.runs[run_id].trace.steps) >= 3, timeout=60000)
        view.show_attention(True)
        qtbot.waitUntil(lambda: any(s.attention_sink for s in window.store.runs[run_id].trace.steps), timeout=60000)
        view.show_attention(False)
    steps = window.store.runs[run_id].trace.steps
    watched = [s.attention_sink is not None for s in steps]
    first, last = watched.index(True), len(watched) - 1 - watched[::-1].index(True)
    assert first >= 3 and all(watched[first : last + 1]) and last < len(steps) - 1, watched


def test_run_from_a_file_shows_sink_lines_and_says_why_the_map_is_empty(qtbot, drive, window, tmp_path):
    drive.load(window)
    window.modes["local"].view.show_attention(True)
    run_id = drive.run(window, "tova", {"budget": 10}, tokens=4, prompt=PROMPT)
    path = window.store.runs[run_id].trace.save(tmp_path / "tova.json")
    opened = window.show_kept(trace_format.load(path))
    window.redraw()
    view = window.modes["local"].view
    assert window.store.primary().run_id == opened
    assert view.attention_map.matrix() is None and view.attention_map.image.image is None
    assert "trace files keep each layer's attention-sink share" in view.attention_map.note_text()
    x, shares = view.sink_plot.curve_data()
    assert len(x) == 4 and not np.isnan(shares).any()
    assert view.sink_plot.note_text() == ""
    # the cache map names the prompt's tokens from the file too
    prompt_pieces = window.store.runs[opened].trace.prompt_pieces
    view.show_attention(False)
    assert prompt_pieces and quoted(prompt_pieces[3]) in plain(view.cache_map.hover_text(3.5, 0))


def test_the_map_says_why_a_run_has_no_matrix(qtbot, window):
    view = window.modes["local"].view
    view.show_attention(True)
    run_id = window.show_kept(trace_of(3))  # recorded with the view hidden: no shares, no matrix
    window.redraw()
    assert view.attention_map.note_text().startswith("not recorded: this view was hidden while the run generated")
    assert view.sink_plot.note_text().startswith("no attention-sink shares")
    view.attention_refused(run_id, "runs under torch.compile cannot show their attention")
    assert view.attention_map.note_text() == (
        "no attention for this run: runs under torch.compile cannot show their attention"
    )


def test_shown_for_the_last_steps_the_map_has_the_last_matrix(qtbot, drive, window, tmp_path):
    """Issue 24: after a run the view was on screen for some 30 steps of, the map said "not recorded: this view was
    hidden while the run generated", for the live run and for its trace opened again, when the view was hidden
    for the run's last few steps (the map drew the latest step's matrix only, and the file's latest step had no
    shares)."""
    drive.load(window, "tiny")
    view, plot = window.modes["local"].view, window.modes["local"].view.attention_map
    window.controls.prompt_panel.editor.setPlainText(PROMPT)
    window.controls.settings_panel.max_new_tokens.setValue(40)

    def generate(show_at: int, hide_at: int | None = None) -> int:
        with qtbot.waitSignal(window.sigRunDone, timeout=120000):
            run_id = window.start_run({"stop_at_eos": False})
            # the producer's trace replaces the request's when the run starts, and grows with every step
            qtbot.waitUntil(lambda: len(window.store.runs[run_id].trace.steps) >= show_at, timeout=60000)
            view.show_attention(True)
            if hide_at is not None:
                qtbot.waitUntil(lambda: len(window.store.runs[run_id].trace.steps) >= hide_at, timeout=60000)
                view.show_attention(False)
        return run_id

    # on screen for the last steps: the last step's matrix
    run_id = generate(show_at=10)
    series = window.store.runs[run_id]
    assert series.trace.steps[-1].attention_sink is not None
    assert plot.matrix() is series.latest.attention and plot.note_text() == ""
    last = series.trace.prompt_tokens + series.latest.index - 1  # the position of the token fed last
    assert plot.title_label.detail.endswith(f"token at position {last} {quoted(token_at(series.trace, last))}")
    view.show_attention(False)
    view.show_attention(True)  # back from the cache map: the same matrix
    assert plot.matrix() is series.latest.attention
    # the same run opened from its file: files keep the sink shares, not the matrix, and the map says so
    opened = window.file_actions.open_trace(series.trace.save(tmp_path / "run.json"))
    window.redraw()
    assert window.store.primary().run_id == opened and plot.matrix() is None
    assert plot.note_text().startswith("trace files keep each layer's attention-sink share") and \
        "hidden" not in plot.note_text()
    assert view.sink_plot.has_data()

    # hidden again before the run ended: the last matrix it computed, named as such; never "hidden while it ran"
    view.show_attention(False)
    run_id = generate(show_at=10, hide_at=25)
    view.show_attention(True)
    window.redraw()
    assert plot.has_data() and plot.note_text() == "", plot.note_text()
    series = window.store.runs[run_id]
    kept = series.attention_step
    assert kept is not None and kept is not series.latest and series.latest.attention_sink is None
    assert plot.matrix() is kept.attention and plot.note_text() == ""
    assert plot.title_label.detail.endswith("the last computed while this view showed")
    assert sum(step.attention is not None for step in series.trace.steps) == 1  # one matrix kept, not one a step
    # its file: the shares of the steps the view showed, and the same words as any file
    window.file_actions.open_trace(series.trace.save(tmp_path / "hidden-at-the-end.json"))
    window.redraw()
    assert plot.note_text().startswith("trace files keep each layer's attention-sink share")
