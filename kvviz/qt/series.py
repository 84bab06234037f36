"""A run as the plots see it: its `Trace` plus preallocated numpy columns that double when full.

The trace is the one its producer writes (the engine's decoder, or a server request): the columns
are a drawing cache of `trace.steps`, caught up by `sync()` whenever new records have arrived, so
the window draws exactly the records the trace keeps. Plot code only reads these arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvviz.files.trace import SlotState, StepRecord, Switch, Trace
from kvviz.present import MIB, shortened, strategy_label, strategy_path
from kvviz.qt.cache_cells import head_counts, kv_heads, shade_partial

# Columns of the per-step table. KL is NaN where no reference ran; FLOOR_MS, the step's memory-bound floor
# (Trace.floor_ms), is NaN at the prefill and where the bandwidth or the bytes read are not known.
# FIXED_MIB: the part of the cache that does not grow with the tokens generated (`RunSeries.fixed_kind`).
# SCORING_MS: the part of WALL_MS the cache spent choosing what to keep (NaN: none chose, or not known).
X, WALL_MS, CACHE_MIB, PREDICTED_MIB, RSS_MIB, KL, FLOOR_MS, FIXED_MIB, SCORING_MS = range(9)
# What a cache's fixed part is: linear-attention and state-space layers' states, or an encoder-decoder's
# cross-attention keys and values (of the encoder's output)
FIXED_STATE, FIXED_CROSS = "fixed-size state", "cross-attention"
_NCOLS = 9


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


@dataclass(frozen=True)
class Compression:
    """A decode step after which the cache held fewer tokens than before it, not by a switch: a policy compressing
    while decoding (decode_interval). A sliding window or an every-step policy holds as many as before, never fewer."""

    x: float  # tokens in context after the step (where it is drawn)
    step: int
    before: float  # tokens held per layer, the mean over the layers, before the step
    after: float  # ... and after it
    scoring_ms: float | None  # what choosing took, within the step's time


def tokens_held(step: StepRecord) -> float:
    """The tokens a step's cache holds per layer, the mean over the layers."""
    return sum(layer.seq_len for layer in step.layers) / len(step.layers) if step.layers else 0.0


class RunSeries:
    def __init__(self, run_id: int, trace: Trace, capacity: int = 256):
        self.run_id = run_id
        self.trace = trace
        self.finished = False  # set by the run store when the producer is done
        self._data = np.zeros((max(16, capacity), _NCOLS), dtype=np.float64)
        self.n = 0
        self.latest: StepRecord | None = None
        self.prefill_ms: float | None = None
        self.prefill_x: float | None = None
        self._decode_ms_sum = 0.0
        self._decode_count = 0
        self._floor_ms_sum = 0.0
        self._floor_unknown = False  # a decode step without a floor: the run's share is unknown
        self._layer_ms_sum: np.ndarray | None = None
        self._layer_ms_count = 0
        self._map = np.zeros((0, 0), dtype=np.uint8)
        self._map_width = 0
        self._map_step = -1
        self.switches: list[tuple[float, str]] = []  # (x, strategy switched to) of trace.switches drawn
        self.compressions: list[Compression] = []  # each compression while decoding, in step order
        self.prefill_scoring_ms: float | None = None  # the prefill's time spent choosing (KVzip: its reading again)
        # what the prefill allocated over its time ([ms, bytes], thinned) and the most at once (None: not counted)
        self.prefill_allocations: list[list[float]] | None = None
        self.prefill_peak_bytes: int | None = None
        self.attention_step: StepRecord | None = None  # the newest step drawn that carries its attention matrix
        self.has_reference = False
        self.fixed_kind: str | None = None  # FIXED_STATE or FIXED_CROSS once a step held a part that does not grow

    @classmethod
    def from_trace(cls, run_id: int, trace: Trace) -> RunSeries:
        """A run whose trace is complete (opened from a file, or drawn for a report)."""
        series = cls(run_id, trace, capacity=len(trace.steps) + 16)
        series.sync()
        series.finished = True
        return series

    # -- filling ------------------------------------------------------------------------------------

    def attach(self, trace: Trace) -> None:
        """The producer's own trace replaces the request's header, before any record was drawn."""
        if self.n:
            raise ValueError(f"run #{self.run_id} already drew {self.n} records of another trace")
        self.trace = trace

    def sync(self) -> bool:
        """Draw the records the trace gained since the last call; False when there were none.

        The producer may append from another thread: a list append is atomic, and records are
        complete before they are appended, so reading up to the current length is safe.
        """
        steps = self.trace.steps[self.n :]
        if not steps:
            return False
        need = self.n + len(steps)
        self._data = grown(self._data, need)
        base = self.trace.prompt_tokens
        rows = self._data[self.n : need]
        previous = self.latest
        switched = {switch.step for switch in self.trace.switches}
        for row, step in zip(rows, steps, strict=True):
            x = base + step.index
            row[X] = x
            row[WALL_MS] = step.wall_ms
            row[CACHE_MIB] = _mib(step.cache_bytes)
            row[PREDICTED_MIB] = _mib(step.predicted_cache_bytes)
            row[RSS_MIB] = _mib(step.rss_bytes)
            state, cross = (sum(getattr(layer, name) for layer in step.layers) for name in ("state_bytes",
                                                                                              "cross_bytes"))
            row[FIXED_MIB] = _mib(state + cross)
            self.fixed_kind = self.fixed_kind or (FIXED_CROSS if cross else FIXED_STATE if state else None)
            row[KL] = np.nan if step.kl is None else step.kl
            row[SCORING_MS] = np.nan if step.scoring_ms is None else step.scoring_ms
            self.has_reference = self.has_reference or step.kl is not None
            self.latest = step
            row[FLOOR_MS] = np.nan
            if step.phase == "prefill":
                self.prefill_ms = step.wall_ms
                self.prefill_x = x
                self.prefill_scoring_ms = step.scoring_ms
                self.prefill_allocations, self.prefill_peak_bytes = step.allocations, step.peak_allocated_bytes
            else:
                if previous is not None and step.index not in switched:
                    before, after = tokens_held(previous), tokens_held(step)
                    if after < before:
                        self.compressions.append(Compression(x, step.index, before, after, step.scoring_ms))
                self._decode_ms_sum += step.wall_ms
                self._decode_count += 1
                floor = self.trace.floor_ms(step.cache_bytes)
                if floor is None:
                    self._floor_unknown = True
                else:
                    row[FLOOR_MS] = floor
                    self._floor_ms_sum += floor
                times = [layer.layer_ms for layer in step.layers]
                if times and all(t is not None for t in times):
                    arr = np.asarray(times, dtype=np.float64)
                    if self._layer_ms_sum is None or len(self._layer_ms_sum) != len(arr):
                        self._layer_ms_sum = np.zeros_like(arr)
                        self._layer_ms_count = 0
                    self._layer_ms_sum += arr
                    self._layer_ms_count += 1
            if step.attention is not None:
                self._keep_attention(step)
            previous = step
        self.n = need
        # a switch is drawn with the first step it applied to (the engine notes it just before that step)
        for switch in self.trace.switches[len(self.switches) :]:
            if switch.step > self.latest.index:
                break
            self.switches.append((base + switch.step, switch.to_strategy))
        return True

    def _keep_attention(self, step: StepRecord) -> None:
        """The attention view draws the newest matrix the run recorded, even when the view was hidden for the steps
        after it; older ones are let go (a run of 2,000 tokens would otherwise keep about 500 MB of them on the
        default model)."""
        if self.attention_step is not None:
            self.attention_step.attention = None
        self.attention_step = step

    def prefill_curve(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The prefill's allocations as the memory plot draws them: x the tokens in context, its time spread across
        the prompt (the start of the prefill at 0, its end at the prompt's last token), y MiB allocated then; None
        where they were not counted."""
        points = self.prefill_allocations
        if not points or self.prefill_x is None:
            return None
        ms = np.array([p[0] for p in points], dtype=np.float64)
        mib = np.array([p[1] for p in points], dtype=np.float64) / MIB
        end = max(float(ms[-1]), self.prefill_ms or 0.0) or 1.0
        return ms / end * self.prefill_x, mib

    # -- columns ------------------------------------------------------------------------------------

    def column(self, index: int) -> np.ndarray:
        return self._data[: self.n, index]

    @property
    def decode_start(self) -> int:
        """The row of the first decode step: 1 after a leading prefill, else 0 (columns sliced from it are views)."""
        return 1 if self.n and self.prefill_x is not None and self._data[0, X] == self.prefill_x else 0

    @property
    def tokens_per_s(self) -> float | None:
        if not self._decode_count or self._decode_ms_sum <= 0:
            return None
        return 1000.0 * self._decode_count / self._decode_ms_sum

    @property
    def share_of_memory_bound(self) -> float | None:
        """The share of the memory-bound speed the decode steps drawn so far reached (as Trace.summary's
        share_of_memory_bound, kept up step by step); None before a decode step or where a floor is unknown."""
        if not self._decode_count or self._floor_unknown or self._decode_ms_sum <= 0:
            return None
        return self._floor_ms_sum / self._decode_ms_sum

    @property
    def first_decode_x(self) -> float | None:
        """x of the first decode step drawn (torch.compile runs just before it), or None."""
        if not self._decode_count:
            return None
        return float(self._data[self.decode_start, X])

    def switch_shown(self) -> Switch | None:
        """The live switch whose strategy the latest step drawn ran with, or None (the run's own strategy)."""
        step = self.latest.index if self.latest is not None else -1
        return next((w for w in reversed(self.trace.switches) if w.step <= step), None)

    @property
    def cache_bytes(self) -> int | None:
        """The cache's size after the latest drawn step; None before any, or where it is not known."""
        return self.latest.cache_bytes if self.latest is not None else None

    def layer_bytes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Key, value and fixed bytes (`fixed_kind`) of each layer after the latest step (keys with an indexed
        layer's indexer keys)."""
        if self.latest is None:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        layers = self.latest.layers
        keys = np.array([layer.keys_bytes + layer.indexer_bytes for layer in layers], dtype=np.float64)
        values = np.array([layer.values_bytes for layer in layers], dtype=np.float64)
        fixed = np.array([layer.fixed_bytes for layer in layers], dtype=np.float64)
        return keys, values, fixed

    def layer_ms_mean(self) -> np.ndarray | None:
        """Mean time of each layer over the decode steps, or None where the engine did not measure it."""
        if self._layer_ms_sum is None or not self._layer_ms_count:
            return None
        return self._layer_ms_sum / self._layer_ms_count

    def cache_map(self) -> np.ndarray:
        """The latest step's cache as a (layers, positions) uint8 array of SlotState values, or where only some
        KV heads hold a position, the share that do (kvviz.qt.cache_cells)."""
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
            counts = head_counts(layer)  # per-head eviction: positions some KV heads still hold
            if counts is not None:
                shade_partial(rows[-1], counts, kv_heads(self.trace, layer))
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
        """The label cut to `limit` characters (legends); a run that switched names its strategies without options."""
        text = self.label()
        if len(text) > limit and self.trace.switches:
            text = f"#{self.run_id} {strategy_path(self.trace, options=False)}"
        return shortened(text, limit)

    def label(self) -> str:
        """"#3 sink (sink_tokens=4, window=60)"; a run that switched: "#5 dynamic -> quantized (…) @24"."""
        return f"#{self.run_id} {strategy_path(self.trace)}"

    def label_now(self) -> str:
        """The run and the strategy of its latest step drawn: "#5 quantized (nbits=4), from dynamic at step 24"."""
        switch = self.switch_shown()
        if switch is None:
            return f"#{self.run_id} {strategy_label(self.trace.strategy)}"
        shown = strategy_label({"name": switch.to_strategy, "options": switch.options})
        return f"#{self.run_id} {shown}, from {switch.from_strategy} at step {switch.step}"


def _mib(n_bytes: int | None) -> float:
    return np.nan if n_bytes is None else n_bytes / MIB
