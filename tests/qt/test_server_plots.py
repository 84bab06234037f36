"""The vLLM server plots and their ServerSeries, fed Points derived from /metrics recorded from a real vLLM server."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PySide6.QtWidgets import QGridLayout, QWidget

from kvviz.attach.metrics import Deriver, Point, parse
from kvviz.present import MIB
from kvviz.qt import theme
from kvviz.qt.server.plots import PrefixHitPlot, RequestsPlot, ServerLatencyPlot, ThroughputPlot, UsagePlot
from kvviz.qt.server.series import COLUMNS, ServerSeries
from tests.attach.conftest import recorded

# A session: idle, under load, done, then the server restarted (its counters fell) and served again.
SESSION = ("idle", "load", "after", "restarted", "restarted_after")
PLOTS = (UsagePlot, RequestsPlot, ThroughputPlot, PrefixHitPlot, ServerLatencyPlot)


@pytest.fixture(scope="module")
def snapshots():
    return [parse(recorded(f"metrics_{name}.txt"), t=100.0 + 2.0 * i) for i, name in enumerate(SESSION)]


@pytest.fixture
def points(snapshots) -> list[Point]:
    deriver = Deriver()
    return [deriver.add(snap) for snap in snapshots]


@pytest.fixture
def series(points) -> ServerSeries:
    s = ServerSeries(capacity=1)  # grows while filling
    s.extend(points)
    return s


def make(qtbot, cls):
    plot = cls()
    qtbot.addWidget(plot)
    plot.apply_palette(theme.PALETTES["dark"])
    plot.resize(500, 300)
    return plot


def nan_equal(a, b) -> bool:
    return np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), equal_nan=True)


def f(value) -> float:
    return math.nan if value is None else value


def test_recorded_session_has_what_the_plots_need(points):
    assert [p.restart for p in points] == [False, False, False, True, False]
    assert any(p.usage for p in points) and any(p.tokens_per_s for p in points)
    assert any(p.prefix_hit_rate is not None for p in points) and points[-1].ttft.get("p50")


def test_series_columns_match_the_points(series, points):
    assert series.n == len(points) and series.latest is points[-1]
    assert nan_equal(series.column("elapsed"), [p.elapsed for p in points])
    assert nan_equal(series.column("usage"), [100 * p.usage for p in points])
    assert nan_equal(series.column("usage_tokens"), [p.usage_tokens for p in points])
    assert nan_equal(series.column("usage_mib"), [p.usage_bytes / MIB for p in points])
    assert nan_equal(series.column("running"), [p.running for p in points])
    assert nan_equal(series.column("waiting"), [p.waiting for p in points])
    assert nan_equal(series.column("hit_rate"), [100 * f(p.prefix_hit_rate) for p in points])
    assert nan_equal(series.column("hit_rate_total"), [100 * f(p.prefix_hit_rate_total) for p in points])
    assert nan_equal(series.column("tokens_per_s"), [f(p.tokens_per_s) for p in points])
    for which in ("ttft", "itl"):
        for key in ("p50", "p90", "p99"):
            expected = [1000 * f(getattr(p, which).get(key)) for p in points]
            assert nan_equal(series.column(f"{which}_{key}"), expected), (which, key)
    assert series.restarts == [points[3].elapsed]
    # the usage during load, read back in every unit
    load = points[1]
    assert 0 < series.column("usage")[1] < 100
    assert series.column("usage_mib")[1] == pytest.approx(load.usage * (1 << 30) / MIB)
    assert series.column("ttft_p50")[-1] == pytest.approx(points[-1].ttft["p50"] * 1000)


def test_series_nones_clear_and_unknown_columns():
    s = ServerSeries()
    s.add(Point(t=0.0, elapsed=0.0))  # a scrape with nothing derived
    assert s.n == 1 and all(np.isnan(s.column(name)[0]) for name in COLUMNS if name != "elapsed")
    generation = s.generation
    s.clear()
    assert s.n == 0 and s.latest is None and s.restarts == [] and s.generation != generation
    with pytest.raises(KeyError, match="usage_mib"):
        s.column("usage_bytes")


def test_unit_switch_changes_the_plotted_y(qtbot, series, snapshots):
    plot = make(qtbot, UsagePlot)
    plot.redraw_server(series)
    assert plot.unit == "% of cache" and plot.plot.getAxis("left").labelText == "usage (%)"
    x, percent = plot.curve_data("usage")
    assert nan_equal(x, series.column("elapsed")) and nan_equal(percent, series.column("usage"))
    plot.set_unit("tokens")
    assert plot.unit_box.currentText() == "tokens" and plot.plot.getAxis("left").labelText == "tokens held"
    _, tokens = plot.curve_data("usage_tokens")
    size = snapshots[1].cache["kv_cache_size_tokens"]
    assert size == 46592
    assert nan_equal(tokens, series.column("usage") / 100 * size)
    assert tokens[1] > 0 and not nan_equal(tokens, percent)
    plot.set_unit("MiB")
    _, mib = plot.curve_data("usage_mib")
    assert plot.plot.getAxis("left").labelText == "KV memory (MiB)"
    assert nan_equal(mib, series.column("usage_mib"))
    with pytest.raises(ValueError):
        plot.set_unit("furlongs")
    assert plot.hover_text(series.column("elapsed")[1], 0).count("MiB") == 1


@pytest.mark.parametrize("cls", PLOTS)
def test_restart_marker_once_and_no_redraw_when_nothing_new(qtbot, series, points, cls):
    plot = make(qtbot, cls)
    assert plot.redraw_server(series) is True
    assert plot.restart_positions() == [points[3].elapsed]
    assert plot.restart_lines[0].label.toPlainText() == "restart"
    assert plot.plot.getAxis("bottom").labelText == "seconds since attach"
    assert plot.plot.getAxis("left").labelText
    items = list(plot.plot.items)
    assert plot.redraw_server(series) is False  # nothing new: nothing touched
    assert plot.restart_positions() == [points[3].elapsed] and list(plot.plot.items) == items
    series.add(Point(t=200.0, elapsed=100.0))  # one more, all None
    assert plot.redraw_server(series) is True
    assert plot.restart_positions() == [points[3].elapsed]  # still once
    assert plot.hover_text(series.column("elapsed")[2], 1.0).startswith("4 s")
    series.clear()
    plot.redraw_server(series)
    assert plot.restart_positions() == [] and plot.hover_text(0, 0) == ""
    series.extend(points)  # same n as before the extra point: must redraw all the same
    assert plot.redraw_server(series) is True and len(plot.restart_lines) == 1


@pytest.mark.parametrize("cls", PLOTS)
def test_plots_survive_none_fields(qtbot, cls):
    plot = make(qtbot, cls)
    s = ServerSeries()
    plot.redraw_server(s)  # empty
    assert plot.hover_text(0.0, 0.0) == ""
    s.extend([Point(t=0.0, elapsed=0.0), Point(t=1.0, elapsed=1.0, ttft={"p50": 0.0, "p90": None}, restart=True)])
    s.add(Point(t=2.0, elapsed=2.0, usage=0.25, running=1, ttft={"p50": 0.02, "p90": 0.05, "p99": 0.09}))
    plot.redraw_server(s)
    plot.grab()  # paints without raising
    assert "2 s" in plot.hover_text(2.0, 0.0)
    plot.apply_palette(theme.PALETTES["light"])
    assert plot.restart_positions() == [1.0]


def test_latency_plot_is_log_and_drops_nonpositive(qtbot, series):
    plot = make(qtbot, ServerLatencyPlot)
    plot.redraw_server(series)
    assert plot.plot.getAxis("left").logMode
    for column in ("ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "itl_p90", "itl_p99"):
        _, y = plot.curve_data(column)
        assert not (y <= 0).any()  # NaN where the server had no observations yet
        assert np.isfinite(y[-1])


def test_five_plots_render_in_a_grid(qtbot, series):
    widget = QWidget()
    qtbot.addWidget(widget)
    grid = QGridLayout(widget)
    plots = [cls() for cls in PLOTS]
    for i, plot in enumerate(plots):
        plot.apply_palette(theme.PALETTES["dark"])
        plot.redraw_server(series)
        grid.addWidget(plot, i // 2, i % 2)
    widget.setStyleSheet(theme.stylesheet("dark"))
    widget.resize(1000, 700)
    widget.show()
    qtbot.waitExposed(widget)
    image = widget.grab().toImage()
    assert image.width() == 1000 and image.height() == 700
