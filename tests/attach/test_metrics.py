"""Parsing and deriving on /metrics text recorded from a real vLLM 0.32.0 server (see record_fixtures.py)."""

from __future__ import annotations

import pytest

from kvviz.attach.metrics import (
    USAGE,
    USAGE_OLD,
    Deriver,
    Histogram,
    MetricsError,
    allocated_bytes_per_token,
    parse,
)
from tests.attach.conftest import MODEL, recorded


def old_name(text: str) -> str:
    """The older vLLM's exposition, DERIVED (not recorded): a recorded file with the usage gauge renamed
    to vllm:gpu_cache_usage_perc, the name vLLM used before it became vllm:kv_cache_usage_perc."""
    assert USAGE in text
    return text.replace(USAGE, USAGE_OLD)


def test_idle_server_cache_config():
    snap = parse(recorded("metrics_idle.txt"), t=100.0)
    assert snap.ok and snap.usage == 0.0 and snap.usage_metric == USAGE
    assert snap.model == MODEL
    assert snap.cache["block_size"] == 128
    assert snap.cache["kv_cache_size_tokens"] == 46592
    assert snap.cache["kv_cache_memory_bytes"] == 1 << 30  # VLLM_CPU_KVCACHE_SPACE=1 (GiB)
    assert snap.cache["enable_prefix_caching"] is True
    assert snap.cache["cache_dtype"] == "auto"
    assert snap.running == 0 and snap.waiting == 0
    assert snap.counters["prefix_queries"] == 0 and snap.counters["generation_tokens"] == 0
    ttft = snap.histograms["ttft"]
    assert ttft.count == 0 and ttft.buckets[-1][0] == float("inf")
    assert snap.process_start is not None


def test_under_load():
    snap = parse(recorded("metrics_load.txt"))
    assert 0 < snap.usage < 1
    assert snap.running == 4
    assert snap.counters["prefix_hits"] > 0
    assert snap.counters["prefix_hits"] <= snap.counters["prefix_queries"]


def test_derived_values_over_a_recorded_session():
    deriver = Deriver()
    idle, load, after = (parse(recorded(f"metrics_{n}.txt"), t=t) for n, t in (("idle", 0), ("load", 2), ("after", 4)))
    first = deriver.add(idle)
    assert first.elapsed == 0 and first.tokens_per_s is None and first.prefix_hit_rate is None
    during = deriver.add(load)
    assert during.usage_tokens == pytest.approx(46592 * load.usage)
    assert during.usage_bytes == pytest.approx((1 << 30) * load.usage)
    assert during.tokens_per_s == pytest.approx(load.counters["generation_tokens"] / 2)
    hits, queries = load.counters["prefix_hits"], load.counters["prefix_queries"]
    assert during.prefix_hit_rate == pytest.approx(hits / queries)
    end = deriver.add(after)
    assert end.usage == 0.0 and end.running == 0
    assert end.prefix_hit_rate is None  # no new queries in that interval
    assert end.prefix_hit_rate_total == pytest.approx(hits / queries)
    assert deriver.totals["generation_tokens"] == after.counters["generation_tokens"]
    assert deriver.usage_peak == load.usage
    assert not any(p.restart for p in (first, during, end))


def test_histogram_percentiles_interpolated():
    # recorded TTFT buckets after the load: <=0.04: 2, <=0.25: 4, <=0.5: 7, <=0.75: 10 (of 10)
    ttft = parse(recorded("metrics_after.txt")).histograms["ttft"]
    assert ttft.count == 10
    assert ttft.quantile(0.5) == pytest.approx(0.25 + 0.25 * (5 - 4) / 3)
    assert ttft.quantile(0.9) == pytest.approx(0.5 + 0.25 * (9 - 7) / 3)
    assert ttft.quantile(0.1) == pytest.approx(0.02 + 0.02 * (1 - 0) / 2)
    p = ttft.percentiles()
    assert p["p50"] <= p["p90"] <= p["p99"] <= 0.75
    itl = parse(recorded("metrics_after.txt")).histograms["itl"]
    assert itl.count > 0 and 0 < itl.quantile(0.5) < 1


def test_quantile_edge_cases():
    empty = Histogram(buckets=[(0.1, 0), (float("inf"), 0)], count=0, sum=0)
    assert empty.quantile(0.5) is None
    tail = Histogram(buckets=[(0.1, 1), (float("inf"), 5)], count=5, sum=9)
    assert tail.quantile(0.9) == 0.1  # in the +Inf bucket: the last finite bound, as PromQL does


def test_restart_resets_counters_and_totals_keep_growing():
    deriver = Deriver()
    after = parse(recorded("metrics_after.txt"), t=0)
    restarted = parse(recorded("metrics_restarted.txt"), t=5)
    again = parse(recorded("metrics_restarted_after.txt"), t=6)
    assert restarted.counters["generation_tokens"] < after.counters["generation_tokens"]
    assert restarted.process_start != after.process_start
    deriver.add(after)
    point = deriver.add(restarted)
    assert point.restart and deriver.restarts == 1
    assert point.tokens_per_s is not None and point.tokens_per_s >= 0  # never a negative rate
    last = deriver.add(again)
    assert not last.restart
    new_tokens = again.counters["generation_tokens"]  # counted from zero by the new process
    assert new_tokens > 0
    assert deriver.totals["generation_tokens"] == pytest.approx(new_tokens)
    assert last.tokens_per_s == pytest.approx((new_tokens - restarted.counters["generation_tokens"]) / 1)
    assert deriver.histograms["ttft"].count == again.histograms["ttft"].count


def test_restart_seen_from_counters_alone():
    """Without process_start_time_seconds (not every deployment exposes it) a counter going down is enough."""
    deriver = Deriver()
    after, restarted = parse(recorded("metrics_after.txt")), parse(recorded("metrics_restarted.txt"))
    after.process_start = restarted.process_start = None
    deriver.add(after)
    assert deriver.add(restarted).restart


def test_old_usage_metric_name():
    text = old_name(recorded("metrics_load.txt"))
    snap = parse(text)
    assert snap.usage_metric == USAGE_OLD
    assert snap.usage == parse(recorded("metrics_load.txt")).usage > 0


def test_not_a_vllm_server():
    """Real exposition from a real non-vLLM process: prometheus_client's own default registry."""
    from prometheus_client import REGISTRY, generate_latest

    text = generate_latest(REGISTRY).decode()
    assert "process_" in text or "python_" in text
    with pytest.raises(MetricsError, match="no vllm: metrics"):
        parse(text)


def test_not_metrics_at_all():
    with pytest.raises(MetricsError):
        parse('<html><body>{"detail": "Not Found"}</body></html>')


def test_allocated_bytes_per_token():
    cache = parse(recorded("metrics_idle.txt")).cache
    assert allocated_bytes_per_token(cache) == pytest.approx((1 << 30) / 46592)
    assert allocated_bytes_per_token({}) is None


def test_snapshot_round_trip():
    from kvviz.attach.metrics import Snapshot

    snap = parse(recorded("metrics_load.txt"))
    again = Snapshot.from_dict(snap.to_dict())
    assert again == snap
