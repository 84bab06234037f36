"""kvviz's own streaming request and the bounded load, against a loopback replay of a recorded vLLM stream."""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest

from kvviz.attach.client import first_model, stream_completion
from kvviz.attach.load import load_prompt, run_load, validate
from tests.attach.conftest import MODEL


def client():
    return httpx.Client(timeout=10, trust_env=False)


def test_first_model(replay_server, dead_url):
    with client() as c:
        assert first_model(c, replay_server.url) == MODEL
        with pytest.raises(RuntimeError, match="cannot connect"):
            first_model(c, dead_url)


def test_stream_times_every_token(replay_server):
    replay_server.chunk_delay = 0.01
    with client() as c:
        record = stream_completion(c, replay_server.url, MODEL, "The capital of France is", max_tokens=12)
    assert record.error is None
    assert record.text.startswith(" Paris")
    assert len(record.tokens) == 12 == record.completion_tokens  # the recorded stream: 12 tokens, then usage
    assert record.prompt_tokens == 5
    assert record.finish_reason == "length"
    times = [t.t for t in record.tokens]
    assert times == sorted(times) and times[0] > 0
    # the 10 ms spacing is seen on arrival (the median: on a loaded machine the client thread can wake late and read
    # two events in one go)
    assert len(record.gaps_ms) == 11 and statistics.median(record.gaps_ms) >= 5, record.gaps_ms
    assert record.total_s >= times[-1]


def test_stream_errors_are_recorded(replay_server, dead_url):
    with client() as c:
        missing = stream_completion(c, replay_server.url + "/nowhere", MODEL, "x")
        dead = stream_completion(c, dead_url, MODEL, "x")
    assert "HTTP 404" in missing.error or "cannot" in missing.error
    assert "cannot connect" in dead.error and dead.tokens == []


def test_stream_time_limit(replay_server):
    replay_server.chunk_delay = 0.2
    with client() as c:
        t0 = time.monotonic()
        record = stream_completion(c, replay_server.url, MODEL, "x", timeout=0.5)
    assert time.monotonic() - t0 < 2
    assert record.error and 0 < len(record.tokens) < 12


def test_load_runs_n_requests_at_concurrency_c(replay_server):
    result = run_load(replay_server.url, MODEL, requests=6, concurrency=3, duration=20, shared_prefix="Shared. ")
    summary = result.summary()
    assert summary["completed"] == 6 and summary["failed"] == 0 and summary["not_started"] == 0
    assert replay_server.completions == 6
    assert all(r.prompt.startswith("Shared. ") and r.tag == "load" for r in result.records)
    assert len({r.prompt for r in result.records}) == 6


def test_load_is_bounded_in_time(replay_server):
    replay_server.chunk_delay = 0.1  # 1.2 s per request
    t0 = time.monotonic()
    result = run_load(replay_server.url, MODEL, requests=50, concurrency=2, duration=0.6)
    assert time.monotonic() - t0 < 3
    assert result.not_started >= 40
    assert len(result.records) <= 4


def test_load_cancel(replay_server):
    replay_server.chunk_delay = 0.05
    cancel = threading.Event()
    cancel.set()
    result = run_load(replay_server.url, MODEL, requests=10, concurrency=2, duration=30, cancel=cancel)
    assert result.not_started == 10 and result.records == []


def test_load_validation():
    for args in ((-1, 1, 1), (10**6, 1, 1), (1, 0, 1), (1, 1000, 1), (1, 1, 0)):
        with pytest.raises(ValueError):
            validate(*args)
    assert load_prompt(3, "P: ").startswith("P: Request 3")
