"""One strategy of an evaluation as the Evaluate tab sees it: its `EvalRun` plus numpy columns that double.

The run's records are appended by the engine on the worker's thread (`kvviz.engine.evaluate`); `sync()`
copies the ones that arrived since the last call into preallocated arrays, so that a redraw costs the new
records only, never the whole run again. From those arrays come the running mean of the NLL the
perplexity plot draws, the measured cache curve, and the table's numbers (perplexity overall and over the
second half, cache MiB, tokens/s), all kept up to date in O(new records).

A strategy that never started (refused before any work, or not reached before Stop) has no run; it keeps
its label, its status and its error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvviz.files.evaluation import EvalRun
from kvviz.present import FAILED, FINAL_STATUSES, MIB, RUNNING, STARTING, WAITING, strategy_label
from kvviz.qt.series import grown, nearest_index

SMOOTHING = 64  # tokens: the perplexity plot draws the mean NLL over the last this many predictions
# the first predictions' mean is over a few tokens only, and the start of any text is hard to predict: the
# perplexity plot's y range leaves them out (they may rise above it)
SETTLING = SMOOTHING // 4
X = 0  # the column `column(X)` gives: the position of the token fed (the plots' x)


class StrategySeries:
    def __init__(self, index: int, strategy: dict[str, Any], run: EvalRun | None = None, capacity: int = 256):
        self.index = index  # its place in the evaluation, from 0
        self.run_id = index + 1  # the plots' and legends' colour (theme.run_colour)
        self.strategy = {"name": strategy.get("name"), "options": dict(strategy.get("options") or {})}
        self.run: EvalRun | None = None
        self.state = WAITING
        self.error: str | None = None  # why it failed (also when it never started)
        self.defaults: dict[str, dict[str, Any]] | None = None  # strategies' option defaults, once listed
        self.n = 0  # records drawn
        self.fixed_kind: str | None = None  # the memory plot draws no fixed part apart for an evaluation
        capacity = max(16, capacity)
        self._x = np.zeros(capacity)
        self._mean = np.zeros(capacity)  # the running mean of the NLL over the last SMOOTHING predictions
        self._cum_nll = np.zeros(capacity)  # sum of the NLL up to and including each record (float64)
        self._wall_ms = 0.0
        self._settled = (math.inf, -math.inf)  # the running mean's range after its first SETTLING predictions
        self.m = 0  # records with a measured cache (a chunked run measures once per chunk)
        self._mem = np.zeros((capacity, 3))  # x, measured MiB, predicted MiB
        self._cache_bytes: int | None = None  # after the last measured prediction
        if run is not None:
            self.attach(run)

    @classmethod
    def from_run(cls, index: int, run: EvalRun) -> StrategySeries:
        """A strategy whose evaluation is over (opened from a file)."""
        series = cls(index, run.strategy, run, capacity=len(run.records) + 16)
        series.sync()
        series.finish(FAILED if run.status == "error" else run.status)
        return series

    # -- filling ------------------------------------------------------------------------------------

    def attach(self, run: EvalRun) -> None:
        """The engine's own result for this strategy: its records fill as the evaluation goes."""
        self.run = run
        self.strategy = {"name": run.strategy.get("name"), "options": dict(run.strategy.get("options") or {})}

    def sync(self) -> bool:
        """Take the records the run gained since the last call; False when there were none.

        The engine appends complete records from the worker's thread; a list append is atomic, so
        reading up to the length seen here is safe.
        """
        if self.run is None:
            return False
        records = self.run.records
        a, b = self.n, len(records)
        if b <= a:
            return False
        new = records[a:b]
        self._x = grown(self._x, b)
        self._mean = grown(self._mean, b)
        self._cum_nll = grown(self._cum_nll, b)
        self._x[a:b] = [r.position for r in new]
        before = self._cum_nll[a - 1] if a else 0.0
        self._cum_nll[a:b] = before + np.cumsum([r.nll for r in new], dtype=np.float64)
        # mean over the last SMOOTHING predictions (fewer at the start): a difference of cumulative sums
        ends = np.arange(a, b)
        starts = ends - SMOOTHING
        cum = self._cum_nll
        earlier = np.where(starts >= 0, cum[np.maximum(starts, 0)], 0.0)
        self._mean[a:b] = (cum[a:b] - earlier) / np.minimum(ends + 1, SMOOTHING)
        settled = self._mean[max(a, SETTLING) : b]
        if settled.size:
            self._settled = (min(self._settled[0], float(settled.min())), max(self._settled[1], float(settled.max())))
        self._wall_ms += math.fsum(r.wall_ms for r in new)
        measured = [r for r in new if r.cache_bytes is not None]
        if measured:
            self._mem = grown(self._mem, self.m + len(measured))
            rows = self._mem[self.m : self.m + len(measured)]
            rows[:, 0] = [r.position for r in measured]
            rows[:, 1] = [r.cache_bytes / MIB for r in measured]
            rows[:, 2] = [np.nan if r.predicted_cache_bytes is None else r.predicted_cache_bytes / MIB
                          for r in measured]
            self.m += len(measured)
            self._cache_bytes = measured[-1].cache_bytes
        self.n = b
        if self.state in (WAITING, STARTING):
            self.state = RUNNING
        return True

    def finish(self, state: str, error: str | None = None) -> None:
        self.state = state
        if error is not None:
            self.error = error
        elif self.run is not None and self.run.error:
            self.error = self.run.error

    @property
    def finished(self) -> bool:
        """Nothing more will arrive (the series plots let their x range fit the data exactly then)."""
        return self.state in FINAL_STATUSES

    # -- what the plots draw --------------------------------------------------------------------------

    def column(self, index: int) -> np.ndarray:
        """The positions of the predictions drawn (index X, the only column: what the x range follows)."""
        return self._x[: self.n]

    def running_mean(self) -> np.ndarray:
        """Mean NLL (nats) over the last SMOOTHING predictions at each position: the log of their perplexity."""
        return self._mean[: self.n]

    def mean_range(self) -> tuple[float, float] | None:
        """The running mean's lowest and highest value, past its first SETTLING predictions where it has more."""
        if self.n > SETTLING:
            return self._settled
        if not self.n:
            return None
        drawn = self.running_mean()
        return float(drawn.min()), float(drawn.max())

    def memory(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions where the cache was measured, its measured and its predicted MiB there."""
        rows = self._mem[: self.m]
        return rows[:, 0], rows[:, 1], rows[:, 2]

    def at(self, x: float) -> int | None:
        """The index of the prediction nearest position x (hover readouts)."""
        return nearest_index(self.column(X), x)

    @property
    def sparse(self) -> bool:
        """The cache was measured once per chunk of predictions, not after each one."""
        return self.run is not None and self.run.method.get("mode") == "chunked"

    @property
    def switches(self) -> list:
        """An evaluation never switches strategy (the series plots mark switches of live runs)."""
        return []

    # -- the table's numbers --------------------------------------------------------------------------

    @property
    def total(self) -> int | None:
        """Predictions this strategy makes over the whole document (None before the engine said)."""
        if self.run is None:
            return None
        return max(int(self.run.document.get("tokens") or 0) - 1, 0)

    def perplexity(self) -> float | None:
        return _perplexity(self._cum_nll[self.n - 1], self.n) if self.n else None

    def second_half_perplexity(self) -> float | None:
        """Over the last half of the predictions drawn (the summary's nll[n // 2:])."""
        if not self.n:
            return None
        half = self.n // 2
        before = self._cum_nll[half - 1] if half else 0.0
        return _perplexity(self._cum_nll[self.n - 1] - before, self.n - half)

    def cache_mib(self) -> float | None:
        """The cache after the last measured prediction."""
        return float(self._mem[self.m - 1, 1]) if self.m else None

    def cache_bytes(self) -> int | None:
        """The cache's bytes after the last measured prediction."""
        return self._cache_bytes

    def tokens_per_s(self) -> float | None:
        return self.n / (self._wall_ms / 1000.0) if self.n and self._wall_ms > 0 else None

    @property
    def first_eviction(self) -> int | None:
        return self.run.first_eviction if self.run is not None else None

    # -- names ----------------------------------------------------------------------------------------

    def label(self) -> str:
        return strategy_label(self.strategy)

    def short_label(self, limit: int = 40) -> str:
        """The strategy and the options it sets away from their defaults, cut to `limit` characters (legends)."""
        return strategy_label(self.strategy, self.defaults, limit)


def _perplexity(nll_sum: float, count: int) -> float | None:
    """exp of the mean NLL, None beyond a float's range (as kvviz.files.evaluation.perplexity)."""
    mean = float(nll_sum) / count
    return math.exp(mean) if mean < 700 else None
