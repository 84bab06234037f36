"""The window's Serve mode on the default model: requests served through transformers' continuous batching by the
window's own runner on the worker's thread, the pool's blocks drawn live, a second run overlaid, Stop, kept serving
runs saved and opened."""

from __future__ import annotations

import os

from kvviz.files.formats import read_kept
from kvviz.files.serve_trace import ServeRun
from kvviz.qt import unsaved
from tests.qt.conftest import load, tab

PROMPTS = "What is the capital of France?\nName three colours.\nCount to five.\nSay hello in Spanish."
SHOTS = os.environ.get("KVVIZ_SHOTS")  # a folder: the tab is saved there as PNGs, to look at


def ready(qtbot, window, blocks: int):
    load(qtbot, window, "default")
    window.set_mode("serve")
    mode = window.modes["serve"]
    mode.panel.load.prompts.setPlainText(PROMPTS)
    mode.panel.load.new_tokens.setValue(12)
    mode.panel.pool.blocks.setValue(blocks)
    return mode


def serve(qtbot, window, mode) -> ServeRun:
    drawn = []
    mode.sigChanged.connect(lambda: drawn.append(len(mode.run.steps) if mode.run else 0))
    with qtbot.waitSignal(mode.sigDone, timeout=180000):
        assert mode.start() is not None
    assert mode.run is not None and all(r.finished for r in mode.run.requests), window.last_error
    assert len(set(drawn)) > 2  # drawn again while it served
    window.redraw()
    return mode.run


def test_a_run_fills_the_block_map_live_and_a_second_overlays_it(window, qtbot, tmp_path):
    window.resize(1280, 720)
    mode = ready(qtbot, window, blocks=6)
    assert window.views.tabText(tab(window, "serve")) == "Serve" and mode.serve_button.isVisibleTo(window)
    small = serve(qtbot, window, mode)
    assert small.preemptions > 0 and small.blocks == 6
    assert mode.view.block_map.groups == small.groups
    assert "4 of 4 requests answered" in mode.view.figures.text()
    timeline = mode.view.timeline
    assert sum(len(b.opts["x0"]) for b in timeline.bars.values()) >= len(small.requests)
    assert len(timeline.bars["preempted"].opts["x0"]) > 0

    mode.panel.pool.blocks.setValue(64)
    large = serve(qtbot, window, mode)
    assert mode.previous is small and mode.run is large and large.preemptions == 0
    xs, _ = mode.view.pool_plot.before.getData()
    assert xs is not None and len(xs) == len(small.steps) + 1  # the run before, overlaid
    assert [r.tokens for r in large.requests] == [r.tokens for r in small.requests]
    # each run journaled in the folder of unsaved work, as it served
    journals = sorted(unsaved.folder().glob(f"serve-{os.getpid()}-*.json.journal"))
    assert len(journals) >= 2 and len(read_kept(journals[-1]).steps) == len(large.steps)
    if SHOTS:
        for size in ((1280, 720), (1920, 1080)):
            for theme_name in ("dark", "light"):
                window.set_theme(theme_name)
                window.resize(*size)
                qtbot.wait(200)
                window.redraw()
                window.grab().save(os.path.join(SHOTS, f"serve-{size[0]}x{size[1]}-{theme_name}.png"))

    path = tmp_path / "serve.json"
    assert mode.save(path) == path
    kept = read_kept(path)
    assert isinstance(kept, ServeRun) and [r.tokens for r in kept.requests] == [r.tokens for r in large.requests]
    assert mode.open(kept) is kept and mode.previous is large and "opened from a file" in mode.header()
