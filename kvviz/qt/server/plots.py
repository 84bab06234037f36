"""Plots of a vLLM server over time, from a `ServerSeries` (one point per /metrics scrape).

Each plot is a `PlotPanel` whose `redraw_server(series)` sets the data of items made once; it does
nothing when the series has not changed since the last call. Every plot marks a server restart with
a dotted vertical line and reads out the values at the point nearest the mouse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox

from kvviz.present import number
from kvviz.qt import theme
from kvviz.qt.plots.base import PlotPanel, marker_line
from kvviz.qt.plots.legend import Entry
from kvviz.qt.server.series import ServerSeries
from kvviz.qt.theme import BLUE, GREEN, ORANGE, PURPLE, YELLOW

X_LABEL = "seconds since attach"


def _number(value: float, digits: int = 0) -> str:
    """A scraped value (NaN where the server did not expose it) as text."""
    return number(float(value) if np.isfinite(value) else None, digits)


@dataclass
class _Curve:
    """One plotted column: its item, and how the readout names and formats its value."""

    column: str
    item: pg.PlotDataItem
    label: str
    colour: str  # as chosen; drawn as theme.readable(colour) on the current background
    text: Callable[[float], str]
    style: Qt.PenStyle = Qt.PenStyle.SolidLine
    scatter: bool = False  # dots at finite values only, no line
    legend: bool = True  # named in the legend row


class _ServerPlot(PlotPanel):
    crosshair_line = True
    y_label = ""
    zero_based = True  # the y range starts at 0 while it follows the data
    y_min_top = 1.0  # the smallest top of that range (an idle server draws a line at 0, not a blank)
    y_max_top: float | None = None  # the largest (100 for a percentage)
    headroom = 1.08  # top of the range over the largest value

    def __init__(self, parent=None):
        super().__init__(parent)
        self.set_labels(self.y_label, X_LABEL)
        self.curves: list[_Curve] = []
        self.restart_lines: list[pg.InfiniteLine] = []
        self._series: ServerSeries | None = None
        self._drawn: tuple | None = None  # (series id, generation, n, state) of the last redraw
        self._follow_y = True
        self.plot.vb.sigRangeChangedManually.connect(self._manual)
        self.make_curves()

    # -- building -----------------------------------------------------------------------------------

    def make_curves(self) -> None:
        raise NotImplementedError

    def add_curve(
        self,
        column: str,
        label: str,
        colour: str,
        text: Callable[[float], str],
        style: Qt.PenStyle = Qt.PenStyle.SolidLine,
        scatter: bool = False,
        legend: bool = True,
    ) -> _Curve:
        item = pg.PlotDataItem(connect="finite")
        self.plot.addItem(item)
        curve = _Curve(column, item, label, colour, text, style, scatter, legend)
        self._pen(curve)
        self.curves.append(curve)
        return curve

    def _pen(self, curve: _Curve) -> None:
        colour = theme.readable(curve.colour, self.palette_)
        if curve.scatter:
            curve.item.setPen(None)
            curve.item.setSymbol("o")
            curve.item.setSymbolSize(5)
            curve.item.setSymbolPen(None)
            curve.item.setSymbolBrush(pg.mkBrush(colour))
        else:
            curve.item.setPen(pg.mkPen(colour, width=1.5, style=curve.style))

    def legend_entries(self) -> list[Entry]:
        return [
            Entry(
                c.label,
                theme.readable(c.colour, self.palette_),
                kind="marker" if c.scatter else "line",
                style=c.style,
                width=1.5,
            )
            for c in self.curves
            if c.legend
        ]

    # -- drawing ------------------------------------------------------------------------------------

    def state(self) -> tuple:
        """What besides the data decides the drawing (the unit of UsagePlot)."""
        return ()

    def redraw_server(self, series: ServerSeries) -> bool:
        """Draw what is new in `series`; False (and nothing touched) when nothing is."""
        key = (id(series), series.generation, series.n, self.state())
        if key == self._drawn:
            return False
        self._drawn = key
        self._series = series
        x = series.column("elapsed")
        for curve in self.curves:
            y = self.values(series, curve.column)
            if curve.scatter:
                keep = np.isfinite(y)
                curve.item.setData(x[keep], y[keep])
            else:
                curve.item.setData(x, y)
        self._mark_restarts(series.restarts)
        self._fit_y()
        self.update_legend()
        return True

    def has_data(self) -> bool:
        return self._series is not None and self._series.n > 0

    def values(self, series: ServerSeries, column: str) -> np.ndarray:
        return series.column(column)

    def _mark_restarts(self, restarts: list[float]) -> None:
        """One dotted line labelled "restart" at each restart; a cleared series removes them."""
        positions = [line.value() for line in self.restart_lines]
        if positions != restarts[: len(positions)]:
            for line in self.restart_lines:
                self.plot.removeItem(line)
            self.restart_lines = []
        for x in restarts[len(self.restart_lines) :]:
            colour = self.palette_.muted
            line = marker_line(colour, Qt.PenStyle.DotLine, "restart", 0.7, x)
            self.plot.addItem(line, ignoreBounds=True)
            self.restart_lines.append(line)

    def restart_positions(self) -> list[float]:
        return [line.value() for line in self.restart_lines]

    def _fit_y(self) -> None:
        if not self.zero_based or not self._follow_y or self._series is None:
            return
        tops = [
            np.nanmax(y) for y in (self.values(self._series, c.column) for c in self.curves) if np.isfinite(y).any()
        ]
        top = max([self.y_min_top, *tops])
        if self.y_max_top is not None:
            top = min(top, self.y_max_top)
        self.plot.setYRange(0.0, top * self.headroom, padding=0.02)

    def _manual(self, *_) -> None:
        self._follow_y = False

    def reset_view(self) -> None:
        super().reset_view()
        self._follow_y = True
        self._fit_y()

    def curve_data(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) as plotted for a column (tests)."""
        for curve in self.curves:
            if curve.column == column:
                return curve.item.getOriginalDataset()
        raise KeyError(column)

    # -- palette and readout --------------------------------------------------------------------------

    def apply_palette(self, palette: theme.Palette) -> None:
        super().apply_palette(palette)
        for curve in self.curves:
            self._pen(curve)
        self.update_legend()
        for line in self.restart_lines:
            line.setPen(pg.mkPen(palette.muted, width=1, style=Qt.PenStyle.DotLine))
            line.label.setColor(palette.muted)

    def hover_text(self, x: float, y: float) -> str:
        series = self._series
        i = series.nearest(x) if series is not None else None
        if i is None:
            return ""
        parts = [f"{series.column('elapsed')[i]:.0f} s"]
        for curve in self.curves:
            colour = theme.readable(curve.colour, self.palette_)
            parts.append(self.swatch(colour, curve.text(self.values(series, curve.column)[i])))
        return " &nbsp; ".join(parts)

    def fill_export_copy(self, copy: PlotPanel) -> None:
        if self._series is not None:
            copy.redraw_server(self._series)


class UsagePlot(_ServerPlot):
    title = "KV-cache usage"
    # unit -> (column, y label, readout format)
    UNITS = {
        "% of cache": ("usage", "usage (%)", lambda v: f"{_number(v, 1)} %"),
        "tokens": ("usage_tokens", "tokens held", lambda v: f"{_number(v)} tokens"),
        "MiB": ("usage_mib", "KV memory (MiB)", lambda v: f"{_number(v, 1)} MiB"),
    }

    def __init__(self, parent=None):
        super().__init__(parent)
        self.unit_box = QComboBox()
        self.unit_box.setObjectName("usageUnit")
        self.unit_box.addItems(list(self.UNITS))
        self.unit_box.setToolTip("Show usage as a share of the cache, in tokens held, or in memory")
        self.unit_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.head.insertWidget(1, self.unit_box, 0)
        self.unit_box.currentTextChanged.connect(self._unit_changed)
        self._unit_changed(self.unit)

    @property
    def unit(self) -> str:
        return self.unit_box.currentText()

    def set_unit(self, name: str) -> None:
        if name not in self.UNITS:
            raise ValueError(f"unknown unit {name!r}; choose one of {', '.join(self.UNITS)}")
        self.unit_box.setCurrentText(name)

    def make_curves(self) -> None:
        self.add_curve("usage", "usage", BLUE, self.UNITS["% of cache"][2], legend=False)

    def _unit_changed(self, name: str) -> None:
        column, label, text = self.UNITS[name]
        curve = self.curves[0]
        curve.column, curve.text = column, text
        self.set_axis_label("left", label)
        self.y_max_top = 100.0 if column == "usage" else None
        self.y_min_top = 1.0 if column != "usage_tokens" else 100.0
        self._follow_y = True
        if self._series is not None:
            self.redraw_server(self._series)

    def state(self) -> tuple:
        return (self.unit,)

    def fill_export_copy(self, copy: PlotPanel) -> None:
        copy.set_unit(self.unit)
        super().fill_export_copy(copy)


class RequestsPlot(_ServerPlot):
    title = "Requests: running and waiting"
    y_label = "requests"

    def make_curves(self) -> None:
        self.add_curve("running", "running", GREEN, lambda v: f"{_number(v)} running")
        self.add_curve("waiting", "waiting", ORANGE, lambda v: f"{_number(v)} waiting", style=Qt.PenStyle.DashLine)


class ThroughputPlot(_ServerPlot):
    title = "Server generation throughput"
    y_label = "throughput (tokens/s)"

    def make_curves(self) -> None:
        self.add_curve("tokens_per_s", "tokens/s", BLUE, lambda v: f"{_number(v, 1)} tokens/s", legend=False)


class PrefixHitPlot(_ServerPlot):
    title = "Prefix-cache hit rate"
    y_label = "hit rate (%)"
    y_min_top = 100.0
    y_max_top = 100.0

    def make_curves(self) -> None:
        self.plot.getAxis("left").setTicks([[(v, str(v)) for v in range(0, 101, 20)]])
        self.add_curve("hit_rate", "this interval", PURPLE, lambda v: f"{_number(v, 1)} % interval", scatter=True)
        self.add_curve("hit_rate_total", "since attach", YELLOW, lambda v: f"{_number(v, 1)} % since attach")


class MillisecondLogAxis(pg.AxisItem):
    """A log axis labelled in plain numbers (20, 50, 100), only at 1, 2 and 5 of each decade."""

    def logTickStrings(self, values, scale, spacing):  # noqa: N802 - pyqtgraph override
        strings = []
        for v in values:
            value = 10.0 ** (v * scale)
            mantissa = value / 10.0 ** np.floor(np.log10(value) + 1e-9)
            strings.append(f"{value:g}" if round(mantissa, 3) in (1.0, 2.0, 5.0) else "")
        return strings


class ServerLatencyPlot(_ServerPlot):
    title = "Server latency percentiles (TTFT, inter-token)"
    y_label = "latency (ms, log scale)"
    zero_based = False
    STYLES = {"p50": Qt.PenStyle.SolidLine, "p90": Qt.PenStyle.DashLine, "p99": Qt.PenStyle.DotLine}

    def make_curves(self) -> None:
        axis = MillisecondLogAxis("left")
        axis.enableAutoSIPrefix(False)
        self.plot.setAxisItems({"left": axis})
        self.set_axis_label("left", self.y_label)
        self.plot.setLogMode(y=True)
        for which, name, colour in (("ttft", "TTFT", ORANGE), ("itl", "ITL", BLUE)):
            for key, style in self.STYLES.items():
                self.add_curve(
                    f"{which}_{key}", f"{name} {key}", colour, self._ms(name, key), style=style, legend=False
                )

    def legend_entries(self) -> list[Entry]:
        """The colour says which latency, the line style which percentile."""
        entries = [
            Entry(name, theme.readable(colour, self.palette_), width=1.5)
            for name, colour in (("TTFT", ORANGE), ("ITL", BLUE))
        ]
        muted = self.palette_.foreground
        return entries + [Entry(key, muted, style=style, width=1.5) for key, style in self.STYLES.items()]

    @staticmethod
    def _ms(name: str, key: str) -> Callable[[float], str]:
        return lambda v: f"{name} {key} {_number(v, 1)} ms"

    def values(self, series: ServerSeries, column: str) -> np.ndarray:
        y = series.column(column)
        if not (y <= 0).any():
            return y
        return np.where(y > 0, y, np.nan)  # log axis: nothing at or below 0

    def _fit_y(self) -> None:
        """In log10 view units."""
        if not self._follow_y or self._series is None:
            return
        ys = [self.values(self._series, c.column) for c in self.curves]
        ys = [y[np.isfinite(y)] for y in ys]
        ys = [y for y in ys if len(y)]
        if not ys:
            return
        lo = float(np.log10(min(y.min() for y in ys)))
        hi = float(np.log10(max(y.max() for y in ys)))
        span = max(hi - lo, 0.5)
        self.plot.setYRange(lo - 0.1 * span, hi + 0.1 * span, padding=0)
