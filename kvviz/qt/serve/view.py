"""The "Serve" tab: the run's figures above (tokens per second, the percentiles of time to first token and per output
token, preemptions, blocks reused, the peak), the pool's block map beside the requests' timeline, and below them the
pool in use over time (the run before overlaid) and the batch of each step.

The view only draws: `redraw(run, previous, header)` takes the run on screen and the one before it (kept by
kvviz.qt.serve.mode) and the line saying what runs.
"""

from __future__ import annotations

from html import escape

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSplitter, QVBoxLayout, QWidget

from kvviz.files.serve_trace import ServeRun
from kvviz.present import UNKNOWN, size
from kvviz.qt import theme
from kvviz.qt.plots.titles import TitleLabel
from kvviz.qt.serve.block_map import BlockMap
from kvviz.qt.serve.plots import BatchPlot, PoolPlot, TimelinePlot

FIRST_WORDS = ("Load a model, set the requests and the pool under Controls ▸ Serve, then press Serve: the requests "
               "go through transformers' continuous batching, and its paged cache fills here, block by block.")
PERCENTILES = (50, 90, 99)


def percentiles(values: list[float]) -> str:
    """"p50 120 / p90 340 / p99 410 ms", or – where nothing was measured."""
    if not values:
        return UNKNOWN
    found = np.percentile(values, PERCENTILES)
    return " / ".join(f"p{p} {v:,.0f}" for p, v in zip(PERCENTILES, found, strict=True)) + " ms"


def figures_html(run: ServeRun, header: str) -> str:
    finished = sum(r.finished for r in run.requests)
    rate = run.tokens_per_s
    first = [r.ttft_ms for r in run.requests if r.ttft_ms is not None]
    per_token = [r.tpot_ms for r in run.requests if r.tpot_ms is not None]
    line = (f"{finished} of {len(run.requests)} requests answered, {run.output_tokens:,} tokens, "
            f"{UNKNOWN if rate is None else f'{rate:.1f}'} tokens/s; time to first token {percentiles(first)}; per "
            f"output token {percentiles(per_token)}; {run.preemptions} preemptions; {run.reused_blocks:,} blocks "
            f"reused by prefix; peak {run.peak_blocks:,} blocks, {size(run.peak_bytes)} "
            f"({size(run.bytes_per_block)} a block)")
    muted = theme.current().muted
    return (f"<p style='margin:0'>{escape(line)}</p>"
            f"<p style='margin:0; font-size:small; color:{muted}'>{header}</p>")


class ServeView(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.figures = QLabel(FIRST_WORDS)
        self.figures.setObjectName("serverSummary")
        self.figures.setWordWrap(True)
        self.figures.setTextFormat(Qt.TextFormat.RichText)
        self.figures.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.block_map = BlockMap()
        self.legend = QLabel()
        self.legend.setWordWrap(True)
        self.timeline = TimelinePlot()
        self.pool_plot = PoolPlot()
        self.batch_plot = BatchPlot()
        self.plots = [self.timeline, self.pool_plot, self.batch_plot]
        blocks = QWidget()
        column = QVBoxLayout(blocks)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addWidget(TitleLabel("The pool's blocks, at the last step"))
        column.addWidget(self.block_map, 1)
        column.addWidget(self.legend)
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(blocks)
        top.addWidget(self.timeline)
        top.setChildrenCollapsible(False)
        self.top = top
        bottom = QSplitter(Qt.Orientation.Horizontal)
        bottom.addWidget(self.pool_plot)
        bottom.addWidget(self.batch_plot)
        bottom.setChildrenCollapsible(False)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(top)
        self.splitter.addWidget(bottom)
        self.splitter.setChildrenCollapsible(False)
        self.reset_layout()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 4)
        layout.addWidget(self.figures)
        layout.addWidget(self.splitter, 1)
        self.apply_palette(theme.current())

    def redraw(self, run: ServeRun | None, previous: ServeRun | None, header: str) -> None:
        if run is None:
            self.figures.setText(FIRST_WORDS)
        else:
            self.figures.setText(figures_html(run, escape(header)))
        steps = list(run.steps) if run is not None else []
        colours = {r.id: theme.run_colour(i + 1) for i, r in enumerate(run.requests)} if run is not None else {}
        self.block_map.show_pool(run.groups if run is not None else [], steps[-1].pool if steps else None, colours)
        self.timeline.show_run(run)
        self.pool_plot.show_runs(run, previous)
        self.batch_plot.show_run(run)

    def apply_palette(self, palette: theme.Palette) -> None:
        for plot in self.plots:
            plot.apply_palette(palette)
        self.block_map.apply_palette(palette)
        box = "<span style='color:{}'>&#9632;</span>"
        self.legend.setText(
            f"<span style='font-size:small'>{box.format(theme.run_colour(1, palette))} held by a request (its "
            f"colour; a number: requests sharing the block) &nbsp; {box.format(palette.preallocated)} hatched: "
            f"cached, held by none, kept for a later prefix &nbsp; {box.format(palette.unseen)} free</span>")

    def reset_layout(self) -> None:
        """The block map as wide as the timeline; the pool and batch plots two fifths of the height (Qt scales
        these sizes to the room there is)."""
        self.top.setSizes([10_000, 10_000])
        self.splitter.setSizes([30_000, 20_000])
