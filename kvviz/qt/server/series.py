"""A vLLM server's derived metrics as the plots see them: numpy columns that double when full.

`ServerSeries.add(point)` appends one `kvviz.attach.metrics.Point` (a scrape); the plots only read
`column(name)`, in display units: percent, MiB, milliseconds. A value the server did not expose is NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from kvviz.attach.metrics import Point
from kvviz.present import MIB
from kvviz.qt.series import grown, nearest_index


def _scaled(value: float | None, factor: float) -> float:
    return np.nan if value is None else float(value) * factor


def _percentile(which: str, key: str) -> Callable[[Point], float]:
    def get(point: Point) -> float:
        values = getattr(point, which) or {}
        return _scaled(values.get(key), 1000.0)  # seconds -> ms

    return get


# Column name -> how one Point gives its value in display units.
COLUMNS: dict[str, Callable[[Point], float]] = {
    "elapsed": lambda p: _scaled(p.elapsed, 1.0),
    "usage": lambda p: _scaled(p.usage, 100.0),
    "usage_tokens": lambda p: _scaled(p.usage_tokens, 1.0),
    "usage_mib": lambda p: _scaled(p.usage_bytes, 1.0 / MIB),
    "running": lambda p: _scaled(p.running, 1.0),
    "waiting": lambda p: _scaled(p.waiting, 1.0),
    "hit_rate": lambda p: _scaled(p.prefix_hit_rate, 100.0),
    "hit_rate_total": lambda p: _scaled(p.prefix_hit_rate_total, 100.0),
    "tokens_per_s": lambda p: _scaled(p.tokens_per_s, 1.0),
    **{f"{which}_{key}": _percentile(which, key) for which in ("ttft", "itl") for key in ("p50", "p90", "p99")},
}
_INDEX = {name: i for i, name in enumerate(COLUMNS)}
_GETTERS = list(COLUMNS.values())


class ServerSeries:
    """Points of one attach session, in order. `generation` changes on `clear()` so plots redraw from scratch."""

    def __init__(self, capacity: int = 256):
        self._data = np.full((max(16, capacity), len(COLUMNS)), np.nan, dtype=np.float64)
        self.n = 0
        self.restarts: list[float] = []  # elapsed of each point where the server had restarted
        self.latest: Point | None = None
        self.generation = 0

    def add(self, point: Point) -> None:
        self.extend([point])

    def extend(self, points: Iterable[Point]) -> None:
        points = [p for p in points if p is not None]
        if not points:
            return
        need = self.n + len(points)
        self._data = grown(self._data, need)
        for row, point in zip(self._data[self.n : need], points, strict=True):
            row[:] = [get(point) for get in _GETTERS]
            if point.restart:
                self.restarts.append(float(point.elapsed))
        self.latest = points[-1]
        self.n = need

    def clear(self) -> None:
        self.n = 0
        self.restarts = []
        self.latest = None
        self.generation += 1

    def column(self, name: str) -> np.ndarray:
        """The first n values of a column (a view: copy it to keep it). KeyError names the known columns."""
        try:
            index = _INDEX[name]
        except KeyError:
            raise KeyError(f"no column {name!r}; the columns are {', '.join(COLUMNS)}") from None
        return self._data[: self.n, index]

    def nearest(self, elapsed: float) -> int | None:
        """Index of the point closest in time to `elapsed`, or None when empty."""
        return nearest_index(self.column("elapsed"), elapsed)
