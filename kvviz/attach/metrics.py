"""A vLLM server's Prometheus /metrics, read into plain records.

`parse(text)` turns one scrape into a `Snapshot` (raw values: gauges, counters, histogram buckets)
with prometheus_client's text parser. `Deriver` walks consecutive snapshots and produces `Point`s:
usage as a fraction, in tokens and in bytes; running and waiting requests; prefix-cache hit rate
and server tokens/s from counter deltas; TTFT and inter-token latency percentiles interpolated from
histogram buckets. A counter that goes down means the server restarted: the interval's delta is then
the new value (it counted from zero), the event is noted, and totals keep accumulating.

Plain data, no threads: `poller.py` does the scraping on a schedule.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

USAGE = "vllm:kv_cache_usage_perc"
USAGE_OLD = "vllm:gpu_cache_usage_perc"  # the name before vLLM 0.10
CACHE_INFO = "vllm:cache_config_info"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
COUNTERS = {
    "prefix_queries": "vllm:prefix_cache_queries",
    "prefix_hits": "vllm:prefix_cache_hits",
    "generation_tokens": "vllm:generation_tokens",
    "prompt_tokens": "vllm:prompt_tokens",
    "requests_finished": "vllm:request_success",
}
HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds"}
PERCENTILES = (50, 90, 99)


class MetricsError(ValueError):
    """The text is not Prometheus exposition, or it carries no vLLM metrics; the message says which."""


@dataclass
class Histogram:
    """Cumulative buckets `[(upper_bound, count), ...]` ending with +Inf, as Prometheus exposes them."""

    buckets: list[tuple[float, float]]
    count: float
    sum: float

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The observations made since `earlier` (all of them if it is None or from before a reset)."""
        if earlier is None or [b for b, _ in earlier.buckets] != [b for b, _ in self.buckets]:
            return self
        if self.count < earlier.count:
            return self
        return Histogram(
            buckets=[(b, c - e) for (b, c), (_, e) in zip(self.buckets, earlier.buckets, strict=True)],
            count=self.count - earlier.count,
            sum=self.sum - earlier.sum,
        )

    def plus(self, other: Histogram) -> Histogram:
        if [b for b, _ in other.buckets] != [b for b, _ in self.buckets]:
            return other
        return Histogram(
            buckets=[(b, c + o) for (b, c), (_, o) in zip(self.buckets, other.buckets, strict=True)],
            count=self.count + other.count,
            sum=self.sum + other.sum,
        )

    def quantile(self, q: float) -> float | None:
        """Like PromQL's histogram_quantile: linear inside the bucket that holds rank q * count.

        The first bucket starts at 0; a rank in the +Inf bucket returns the last finite bound.
        """
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower
                inside = cumulative - below
                if inside <= 0:
                    return bound
                return lower + (bound - lower) * (rank - below) / inside
            lower, below = bound, cumulative
        return lower

    def percentiles(self) -> dict[str, float | None]:
        return {f"p{p}": self.quantile(p / 100) for p in PERCENTILES}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Histogram:
        return cls(buckets=[(float(b), float(c)) for b, c in data["buckets"]], count=data["count"], sum=data["sum"])


@dataclass
class Snapshot:
    """One scrape. Values are None where the server did not expose them; `error` says why a scrape failed."""

    t: float  # time.time() when the scrape returned
    usage: float | None = None  # 0..1
    usage_metric: str | None = None  # which name carried it (the new or the old one)
    running: float | None = None
    waiting: float | None = None
    counters: dict[str, float] = field(default_factory=dict)  # keys of COUNTERS, summed over label sets
    histograms: dict[str, Histogram] = field(default_factory=dict)  # keys of HISTOGRAMS
    cache: dict[str, Any] = field(default_factory=dict)  # labels of vllm:cache_config_info
    model: str | None = None  # the model_name label
    process_start: float | None = None  # process_start_time_seconds, if exposed
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["histograms"] = {k: asdict(h) for k, h in self.histograms.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        data = dict(data)
        data["histograms"] = {k: Histogram.from_dict(h) for k, h in (data.get("histograms") or {}).items()}
        return cls(**data)


def _number(text: Any) -> Any:
    """Labels are strings; numeric ones ("128", "46592", "True") become numbers and booleans, vLLM's "None" null."""
    if text == "None":
        return None
    if not isinstance(text, str):
        return text
    if text in ("True", "False", "true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse(text: str, t: float | None = None) -> Snapshot:
    """One /metrics body to a Snapshot. Raises MetricsError if it is not Prometheus text or not vLLM's."""
    t = time.time() if t is None else t
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError, TypeError or IndexError on junk
        raise MetricsError(f"the response is not Prometheus metrics text ({exc})") from None
    by_name = {f.name: f for f in families}
    if not any(name.startswith("vllm:") for name in by_name):
        raise MetricsError(
            f"the server answers /metrics but exposes no vllm: metrics ({len(families)} other metric families): "
            "it does not look like a vLLM server"
        )
    snap = Snapshot(t=t)

    def gauge(name: str, combine=sum) -> float | None:
        family = by_name.get(name)
        if family is None:
            return None
        values = [s.value for s in family.samples if s.name == name]
        return float(combine(values)) if values else None

    def mean(values):
        return sum(values) / len(values)

    for name in (USAGE, USAGE_OLD):
        value = gauge(name, combine=mean)  # one value per engine; each engine has its own cache
        if value is not None:
            snap.usage, snap.usage_metric = value, name
            break
    snap.running = gauge(RUNNING)
    snap.waiting = gauge(WAITING)
    for key, name in COUNTERS.items():
        family = by_name.get(name)
        if family is not None:
            snap.counters[key] = float(sum(s.value for s in family.samples if s.name == name + "_total"))
    for key, name in HISTOGRAMS.items():
        family = by_name.get(name)
        if family is not None:
            snap.histograms[key] = _histogram(family, name)
    info = by_name.get(CACHE_INFO)
    if info is not None and info.samples:
        labels = dict(info.samples[0].labels)
        labels.pop("engine", None)
        snap.cache = {k: _number(v) for k, v in labels.items()}
    for family in families:
        for sample in family.samples:
            if "model_name" in sample.labels:
                snap.model = sample.labels["model_name"]
                break
        if snap.model:
            break
    start = by_name.get("process_start_time_seconds")
    if start is not None and start.samples:
        snap.process_start = float(start.samples[0].value)
    return snap


def _histogram(family, name: str) -> Histogram:
    """Sum buckets with the same bound over all label sets (engines, models)."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    for s in family.samples:
        if s.name == name + "_bucket":
            bound = float(s.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + s.value
        elif s.name == name + "_count":
            count += s.value
        elif s.name == name + "_sum":
            total += s.value
    return Histogram(buckets=sorted(buckets.items()), count=count, sum=total)


@dataclass
class Point:
    """Derived values at one scrape, ready to plot. None where the inputs were missing."""

    t: float
    elapsed: float  # seconds since the first good snapshot
    usage: float | None = None  # fraction 0..1
    usage_tokens: float | None = None  # kv_cache_size_tokens x usage
    usage_bytes: float | None = None  # kv_cache_memory_bytes x usage
    running: float | None = None
    waiting: float | None = None
    prefix_hit_rate: float | None = None  # hits / queries in this interval
    prefix_hit_rate_total: float | None = None  # since attach
    tokens_per_s: float | None = None  # generation tokens in this interval / its length
    ttft: dict[str, float | None] = field(default_factory=dict)  # p50/p90/p99 in seconds, since attach
    itl: dict[str, float | None] = field(default_factory=dict)
    restart: bool = False  # counters went down since the previous snapshot


class Deriver:
    """Feed snapshots in order with `add`; it returns a Point and keeps running totals across restarts."""

    def __init__(self) -> None:
        self.first_t: float | None = None
        self.previous: Snapshot | None = None
        self.totals: dict[str, float] = {}  # counter increases since attach, across restarts
        self.histograms: dict[str, Histogram] = {}  # observations since attach, across restarts
        self.restarts = 0
        self.usage_peak = 0.0
        self.events: list[tuple[float, str]] = []  # (time, message) worth telling the user, in order

    def add(self, snap: Snapshot) -> Point | None:
        if not snap.ok:
            return None
        prev = self.previous
        if self.first_t is None:
            self.first_t = snap.t
        restart = prev is not None and _restarted(prev, snap)
        if restart:
            self.restarts += 1
            self.events.append(
                (
                    snap.t,
                    "the server restarted (its counters went back down): rates and totals continue from its new counts",
                )
            )
        if snap.usage_metric == USAGE_OLD and (prev is None or prev.usage_metric != USAGE_OLD):
            self.events.append((snap.t, f"the server reports KV-cache usage under the older name {USAGE_OLD}"))
        if snap.usage is None and (prev is None or prev.usage is not None):
            self.events.append((snap.t, f"the server exposes neither {USAGE} nor {USAGE_OLD}: no usage to show"))
        base = None if restart else prev
        point = Point(t=snap.t, elapsed=snap.t - self.first_t, restart=restart)
        point.usage = snap.usage
        if snap.usage is not None:
            self.usage_peak = max(self.usage_peak, snap.usage)
            tokens = snap.cache.get("kv_cache_size_tokens")
            memory = snap.cache.get("kv_cache_memory_bytes")
            if isinstance(tokens, (int, float)):
                point.usage_tokens = tokens * snap.usage
            if isinstance(memory, (int, float)):
                point.usage_bytes = memory * snap.usage
        point.running, point.waiting = snap.running, snap.waiting
        delta: dict[str, float] = {}
        if prev is not None:  # the first snapshot is the baseline: what came before attach is not ours
            for key, value in snap.counters.items():
                before = base.counters.get(key) if base is not None else 0.0
                if before is None:
                    continue
                delta[key] = value - before
                self.totals[key] = self.totals.get(key, 0.0) + delta[key]
            for key, hist in snap.histograms.items():
                new = hist.minus(base.histograms.get(key) if base is not None else None)
                self.histograms[key] = self.histograms[key].plus(new) if key in self.histograms else new
        if delta.get("prefix_queries"):
            point.prefix_hit_rate = delta.get("prefix_hits", 0.0) / delta["prefix_queries"]
        if self.totals.get("prefix_queries"):
            point.prefix_hit_rate_total = self.totals.get("prefix_hits", 0.0) / self.totals["prefix_queries"]
        if prev is not None and "generation_tokens" in delta and snap.t > prev.t:
            point.tokens_per_s = delta["generation_tokens"] / (snap.t - prev.t)
        for key in HISTOGRAMS:
            if key in self.histograms:
                setattr(point, key, self.histograms[key].percentiles())
        self.previous = snap
        return point


def _restarted(prev: Snapshot, snap: Snapshot) -> bool:
    if prev.process_start is not None and snap.process_start is not None and snap.process_start != prev.process_start:
        return True
    if any(snap.counters.get(k, math.inf) < v for k, v in prev.counters.items()):
        return True
    return any(h.count < prev.histograms[k].count for k, h in snap.histograms.items() if k in prev.histograms)


def allocated_bytes_per_token(cache: dict[str, Any]) -> float | None:
    """What the server allocated per token slot: kv_cache_memory_bytes / kv_cache_size_tokens."""
    memory, tokens = cache.get("kv_cache_memory_bytes"), cache.get("kv_cache_size_tokens")
    if isinstance(memory, (int, float)) and isinstance(tokens, (int, float)) and tokens > 0:
        return memory / tokens
    return None
