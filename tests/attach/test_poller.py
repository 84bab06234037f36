"""The poller against a loopback server replaying recorded vLLM /metrics, a dead port and a non-vLLM exporter."""

from __future__ import annotations

import threading
import time

from kvviz.attach.poller import Poller, base_url
from tests.attach.conftest import recorded


def wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_base_url():
    assert base_url("127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert base_url("http://127.0.0.1:8000/metrics") == "http://127.0.0.1:8000"


def test_polls_derives_and_sees_a_restart(replay_server):
    names = ["idle", "load", "after", "restarted", "restarted_after"]
    replay_server.metrics = [recorded(f"metrics_{n}.txt") for n in names]
    seen = []
    poller = Poller(replay_server.url, interval=0.05, callback=lambda s, p: seen.append((s, p))).start()
    assert wait_for(lambda: len(poller.points) >= 7)
    assert poller.stop(timeout=2)
    assert not poller.running
    points = poller.points
    assert [p.usage > 0 for p in points[:3]] == [False, True, False]
    assert sum(p.restart for p in points) == 1 and points[3].restart
    assert poller.deriver.totals["prefix_hits"] > 0
    assert all(p.tokens_per_s is None or p.tokens_per_s >= 0 for p in points)
    assert len(seen) == len(poller.snapshots)  # the callback saw every scrape
    assert not poller.errors
    assert [m for _, m in poller.events] == [
        "the server restarted (its counters went back down): rates and totals continue from its new counts"
    ]


def test_steady_rate(replay_server):
    poller = Poller(replay_server.url, interval=0.1).start()
    time.sleep(1.05)
    poller.stop(timeout=2)
    times = [s.t for s in poller.snapshots]
    assert 9 <= len(times) <= 12
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) < 0.25 and min(gaps) > 0.03


def test_unreachable_server_is_reported_not_raised(dead_url):
    poller = Poller(dead_url, interval=0.05).start()
    assert wait_for(lambda: len(poller.snapshots) >= 3)
    poller.stop(timeout=2)
    assert all(not s.ok for s in poller.snapshots)
    assert poller.points == []
    assert len(poller.errors) == 1  # the same message is kept once while it repeats
    assert "cannot connect" in poller.errors[0][1]


def test_callback_that_raises_does_not_stop_collection(replay_server):
    def broken(snapshot, point):
        raise ZeroDivisionError("a view's bug")

    poller = Poller(replay_server.url, interval=0.05, callback=broken).start()
    assert wait_for(lambda: len(poller.snapshots) >= 3)
    poller.stop(timeout=2)
    assert len(poller.points) >= 3
    assert any("ZeroDivisionError" in message for _, message in poller.errors)


def test_cancel_is_prompt_even_with_a_long_interval(replay_server):
    poller = Poller(replay_server.url, interval=30).start()
    assert wait_for(lambda: len(poller.snapshots) == 1)
    t0 = time.monotonic()
    assert poller.stop(timeout=2)
    assert time.monotonic() - t0 < 1


def test_server_going_away_keeps_what_was_collected(replay_server):
    replay_server.metrics = [recorded("metrics_load.txt")]
    poller = Poller(replay_server.url, interval=0.05).start()
    assert wait_for(lambda: len(poller.points) >= 2)
    poller.url = "http://127.0.0.1:9"  # as if the server vanished: the discard port, nothing listens
    assert wait_for(lambda: any(not s.ok for s in poller.snapshots))
    poller.url = replay_server.url  # and back
    assert wait_for(lambda: poller.snapshots[-1].ok)
    poller.stop(timeout=2)
    assert len(poller.points) >= 3 and poller.points[0].usage > 0
    assert any("answers again" in m for _, m in poller.events)


def test_old_metric_name_is_noted(replay_server):
    from tests.attach.test_metrics import old_name

    replay_server.metrics = [old_name(recorded("metrics_load.txt"))]
    poller = Poller(replay_server.url, interval=0.05).start()
    assert wait_for(lambda: len(poller.points) >= 3)
    poller.stop(timeout=2)
    assert all(p.usage > 0 for p in poller.points)
    assert [m for _, m in poller.events] == [
        "the server reports KV-cache usage under the older name vllm:gpu_cache_usage_perc"
    ]


def test_non_vllm_server(tmp_path):
    """A real Prometheus exporter that is not vLLM: prometheus_client's own HTTP server on loopback."""
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    registry = CollectorRegistry()
    Counter("widgets_made", "Widgets", registry=registry).inc()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        poller = Poller(f"http://127.0.0.1:{server.server_port}", interval=0.05).start()
        assert wait_for(lambda: len(poller.snapshots) >= 2)
        poller.stop(timeout=2)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(2)
    assert poller.points == []
    assert "no vllm: metrics" in poller.errors[0][1] and "does not look like a vLLM server" in poller.errors[0][1]


def test_poller_thread_is_a_daemon_and_named(replay_server):
    poller = Poller(replay_server.url, interval=0.05).start()
    try:
        names = [t.name for t in threading.enumerate() if t.daemon]
        assert "kvviz-attach-poller" in names
    finally:
        poller.stop(timeout=2)
