"""A bounded load: N streaming requests at concurrency C, within S seconds, optionally with a shared prefix.

Bounded both ways: at most `requests` requests are sent (capped at MAX_REQUESTS), none starts after
the deadline, and each in-flight request is given only the time left (checked on every streamed
line, and as the read timeout), so `run_load` returns within `duration` seconds while the server
streams, and within twice that if it stalls mid-stream without a byte. With a shared prefix every
prompt begins with the same text, so a server with prefix caching reuses its blocks and counts hits
(vLLM matches whole blocks: the prefix must be longer than one block, 128 tokens by default).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvviz.attach.client import RequestRecord, stream_completion

MAX_REQUESTS = 10_000
MAX_CONCURRENCY = 256

_TOPICS = (
    "the tides",
    "a lighthouse keeper",
    "bread dough",
    "the moon",
    "an old map",
    "winter birds",
    "a paper boat",
    "the last train",
)


def load_prompt(index: int, shared_prefix: str = "") -> str:
    body = f"Request {index}: write two sentences about {_TOPICS[index % len(_TOPICS)]}."
    return f"{shared_prefix}{body}" if shared_prefix else body


@dataclass
class LoadResult:
    requested: int
    concurrency: int
    duration: float
    shared_prefix: str
    records: list[RequestRecord] = field(default_factory=list)
    not_started: int = 0  # skipped because the deadline passed or it was cancelled
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        done = [r for r in self.records if r.error is None]
        ttfts = sorted(r.ttft for r in done if r.ttft is not None)
        return {
            "requested": self.requested,
            "concurrency": self.concurrency,
            "sent": len(self.records),
            "completed": len(done),
            "failed": len(self.records) - len(done),
            "not_started": self.not_started,
            "wall_s": self.wall_s,
            "completion_tokens": sum(r.completion_tokens or len(r.tokens) for r in done),
            "ttft_median_s": ttfts[len(ttfts) // 2] if ttfts else None,
            "errors": sorted({r.error for r in self.records if r.error})[:5],
        }


def validate(requests: int, concurrency: int, duration: float) -> None:
    if not 0 <= requests <= MAX_REQUESTS:
        raise ValueError(f"the number of requests must be between 0 and {MAX_REQUESTS}, got {requests}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"the concurrency must be between 1 and {MAX_CONCURRENCY}, got {concurrency}")
    if not duration > 0:
        raise ValueError(f"the duration must be a positive number of seconds, got {duration}")


def run_load(
    url: str,
    model: str,
    requests: int,
    concurrency: int,
    duration: float,
    shared_prefix: str = "",
    max_tokens: int = 64,
    cancel: threading.Event | None = None,
    ignore_eos: bool = False,
) -> LoadResult:
    validate(requests, concurrency, duration)
    cancel = cancel or threading.Event()
    result = LoadResult(requested=requests, concurrency=concurrency, duration=duration, shared_prefix=shared_prefix)
    lock = threading.Lock()
    t0 = time.monotonic()
    deadline = t0 + duration
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    with httpx.Client(timeout=httpx.Timeout(duration, connect=5.0), limits=limits, trust_env=False) as client:

        def one(index: int) -> None:
            left = deadline - time.monotonic()
            if left <= 0 or cancel.is_set():
                with lock:
                    result.not_started += 1
                return
            record = stream_completion(
                client,
                url,
                model,
                load_prompt(index, shared_prefix),
                max_tokens=max_tokens,
                timeout=left,
                ignore_eos=ignore_eos,
                tag="load",
            )
            with lock:
                result.records.append(record)

        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kvviz-load") as pool:
            list(pool.map(one, range(requests)))
    result.wall_s = time.monotonic() - t0
    return result
