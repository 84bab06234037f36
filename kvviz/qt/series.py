"""A run as the plots see it: its `Trace` plus preallocated numpy columns that double when full.

Live runs get steps one batch at a time (`extend`); finished or opened runs come from a whole
`Trace` (`RunSeries.from_trace`). Plot code only reads these arrays, never the records.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from kvviz.trace import SlotState, StepRecord, Trace

MIB = 1024.0 * 1024.0

# Columns of the per-step table.
X, WALL_MS, CACHE_MIB, PREDICTED_MIB, RSS_MIB, KL = range(6)  # KL is NaN where no reference ran
_NCOLS = 6


def grown(data: np.ndarray, need: int) -> np.ndarray:
    """`data` if it has room for `need` rows, else a copy with its capacity doubled until it does.

    The copy keeps every row of `data` (callers only read the first n); new rows are zero.
    """
    if need <= len(data):
        return data
    capacity = max(len(data), 1)
    while capacity < need:
        capacity *= 2
    bigger = np.zeros((capacity, *data.shape[1:]), dtype=data.dtype)
    bigger[: len(data)] = data
    return bigger


def nearest_index(xs: np.ndarray, x: float) -> int | None:
    """Index of the value in sorted `xs` closest to x (hover readouts), or None when empty."""
    if not len(xs):
        return None
    i = min(max(int(np.searchsorted(xs, x)), 0), len(xs) - 1)
    if i > 0 and abs(xs[i - 1] - x) < abs(xs[i] - x):
        i -= 1
    return i


class RunSeries:
    def __init__(self, run_id: int, trace: Trace, capacity: int = 256):
        self.run_id = run_id
        self.trace = trace
        self.finished = False
        self._data = np.zeros((max(16, capacity), _NCOLS), dtype=np.float64)
        self.n = 0
        self.latest: StepRecord | None = None
        self.prefill_ms: float | None = None
        self.prefill_x: float | None = None
        self._decode_ms_sum = 0.0
        self._decode_count = 0
        self._layer_ms_sum: np.ndarray | None = None
        self._layer_ms_count = 0
        self._map = np.zeros((0, 0), dtype=np.uint8)
        self._map_width = 0
        self._map_step = -1
        self.switches: list[tuple[float, str]] = []  # (x, strategy switched to), from the steps
        self.has_reference = False

    @classmethod
    def from_trace(cls, run_id: int, trace: Trace) -> RunSeries:
        series = cls(run_id, trace, capacity=len(trace.steps) + 16)
        series.extend(trace.steps, record=False)
        series.finished = True
        return series

    # -- filling ------------------------------------------------------------------------------------

    def extend(self, steps: Iterable[StepRecord], record: bool = True) -> None:
        """Append steps; with record=True they are also appended to the trace."""
        steps = list(steps)
        if not steps:
            return
        if record:
            self.trace.steps.extend(steps)
        need = self.n + len(steps)
        self._data = grown(self._data, need)
        base = self.trace.prompt_tokens
        rows = self._data[self.n : need]
        for row, step in zip(rows, steps, strict=True):
            x = base + step.index
            row[X] = x
            row[WALL_MS] = step.wall_ms
            row[CACHE_MIB] = _mib_or_nan(step.cache_bytes)
            row[PREDICTED_MIB] = _mib_or_nan(step.predicted_cache_bytes)
            row[RSS_MIB] = _mib_or_nan(step.rss_bytes)
            row[KL] = np.nan if step.kl is None else step.kl
            self.has_reference = self.has_reference or step.kl is not None
            previous = self.latest.strategy if self.latest is not None else None
            if previous is not None and step.strategy != previous:
                self.switches.append((x, step.strategy))
            self.latest = step
            if step.phase == "prefill":
                self.prefill_ms = step.wall_ms
                self.prefill_x = x
            else:
                self._decode_ms_sum += step.wall_ms
                self._decode_count += 1
                times = [layer.layer_ms for layer in step.layers]
                if times and all(t is not None for t in times):
                    arr = np.asarray(times, dtype=np.float64)
                    if self._layer_ms_sum is None or len(self._layer_ms_sum) != len(arr):
                        self._layer_ms_sum = np.zeros_like(arr)
                        self._layer_ms_count = 0
                    self._layer_ms_sum += arr
                    self._layer_ms_count += 1
        self.n = need

    def finish(self, trace: Trace) -> None:
        """The worker's final trace replaces ours (same steps, plus cancelled/error flags)."""
        if len(trace.steps) != self.n:
            # Should not happen (queued signals arrive in order), but never show stale data.
            fresh = RunSeries.from_trace(self.run_id, trace)
            self.__dict__.update(fresh.__dict__)
        self.trace = trace
        self.finished = True

    # -- columns ------------------------------------------------------------------------------------

    def column(self, index: int) -> np.ndarray:
        return self._data[: self.n, index]

    def decode_mask(self) -> np.ndarray:
        """True for decode steps (every step but a leading prefill)."""
        mask = np.ones(self.n, dtype=bool)
        if self.n and self.prefill_x is not None and self._data[0, X] == self.prefill_x:
            mask[0] = False
        return mask

    @property
    def tokens_per_s(self) -> float | None:
        if not self._decode_count or self._decode_ms_sum <= 0:
            return None
        return 1000.0 * self._decode_count / self._decode_ms_sum

    @property
    def cache_mib(self) -> float:
        return self._data[self.n - 1, CACHE_MIB] if self.n else 0.0

    def layer_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """Key and value bytes of each layer after the latest step."""
        if self.latest is None:
            return np.zeros(0), np.zeros(0)
        keys = np.array([layer.keys_bytes for layer in self.latest.layers], dtype=np.float64)
        values = np.array([layer.values_bytes for layer in self.latest.layers], dtype=np.float64)
        return keys, values

    def layer_ms_mean(self) -> np.ndarray | None:
        """Mean time of each layer over the decode steps, or None where the engine did not measure it."""
        if self._layer_ms_sum is None or not self._layer_ms_count:
            return None
        return self._layer_ms_sum / self._layer_ms_count

    def cache_map(self) -> np.ndarray:
        """The latest step's cache as a (layers, positions) uint8 array of SlotState values."""
        step = self.latest
        if step is None:
            return np.zeros((0, 0), dtype=np.uint8)
        if self._map_step == step.index and self._map.shape[0] == len(step.layers):
            return self._map[:, : self._map_width]
        rows = []
        for layer in step.layers:
            if layer.spans:
                spans = np.asarray(layer.spans, dtype=np.int64).reshape(-1, 2)
                rows.append(np.repeat(spans[:, 0].astype(np.uint8), np.maximum(spans[:, 1], 0)))
            else:
                rows.append(np.full(layer.seq_len, SlotState.FULL, dtype=np.uint8))
        width = max((len(r) for r in rows), default=0)
        if self._map.shape[0] != len(rows) or self._map.shape[1] < width:
            capacity = max(64, self._map.shape[1])
            while capacity < width:
                capacity *= 2
            self._map = np.zeros((len(rows), capacity), dtype=np.uint8)
        for i, row in enumerate(rows):
            self._map[i, : len(row)] = row
            self._map[i, len(row) : width] = SlotState.UNSEEN
        self._map_width = width
        self._map_step = step.index
        return self._map[:, :width]

    def short_label(self, limit: int = 34) -> str:
        """The label cut to `limit` characters (legends)."""
        text = self.label()
        return text if len(text) <= limit else text[: limit - 1].rstrip(", ") + "…)"

    def label(self) -> str:
        strategy = self.trace.strategy or {}
        options = strategy.get("options") or {}
        text = strategy.get("name", "?")
        if options:
            text += " (" + ", ".join(f"{k}={v}" for k, v in options.items()) + ")"
        return f"#{self.run_id} {text}"


def _mib_or_nan(n: int | None) -> float:
    """Bytes in MiB; an unknown value (a served request's) stays unknown: NaN, which plots leave out."""
    return np.nan if n is None else n / MIB
