"""Scrape a server's /metrics at a steady rate in a background thread.

`Poller(url, interval, callback)` is a plain object: `start()`, `cancel()`, `join()`. Every tick
makes one scrape (a `Snapshot`, with `error` set when it failed) and derives a `Point`; both are
kept in `snapshots` / `points` and handed to `callback(snapshot, point)` on the poller's thread.
Nothing raises into the caller: a failed scrape, a non-vLLM server or a callback that raises is
recorded as an error and polling goes on. Ticks are scheduled on a fixed grid (start + k x interval);
a scrape slower than the interval skips ticks instead of bunching them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx

from kvviz.attach.metrics import Deriver, MetricsError, Point, Snapshot, parse

Callback = Callable[[Snapshot, "Point | None"], None]


def base_url(url: str) -> str:
    """'http://host:port', 'host:port/', '.../v1' or '.../metrics' to the server's root URL."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    for suffix in ("/metrics", "/v1"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


def describe_http_error(url: str, exc: Exception) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {url}: nothing answers there (is the server running and the port right?)"
    if isinstance(exc, httpx.TimeoutException):
        return f"{url} did not answer in time ({type(exc).__name__})"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{url} answered HTTP {exc.response.status_code} {exc.response.reason_phrase}"
    return f"cannot read {url}: {exc}"


def scrape(client: httpx.Client, url: str) -> Snapshot:
    """One GET of URL/metrics. Never raises: failures come back as a Snapshot with `error` set."""
    metrics_url = base_url(url) + "/metrics"
    try:
        response = client.get(metrics_url)
        response.raise_for_status()
        return parse(response.text, t=time.time())
    except httpx.HTTPError as exc:
        return Snapshot(t=time.time(), error=describe_http_error(metrics_url, exc))
    except MetricsError as exc:
        return Snapshot(t=time.time(), error=f"{metrics_url}: {exc}")


class Poller:
    def __init__(
        self, url: str, interval: float = 0.5, callback: Callback | None = None, timeout: float | None = None
    ) -> None:
        if interval <= 0:
            raise ValueError("the polling interval must be positive")
        self.url = base_url(url)
        self.interval = interval
        self.callback = callback
        self.timeout = timeout if timeout is not None else max(1.0, 2 * interval)
        self.snapshots: list[Snapshot] = []
        self.points: list[Point] = []
        self.errors: list[tuple[float, str]] = []  # (time, message); repeated messages kept once in a row
        self.events: list[tuple[float, str]] = []  # notices: restarts, the old metric name, recoveries
        self.deriver = Deriver()
        self._events_seen = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Poller:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvviz-attach-poller", daemon=True)
            self._thread.start()
        return self

    def cancel(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread; True if it has ended."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def stop(self, timeout: float = 5.0) -> bool:
        self.cancel()
        return self.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll_once(self, client: httpx.Client) -> tuple[Snapshot, Point | None]:
        snap = scrape(client, self.url)
        with self._lock:
            self.snapshots.append(snap)
            failing = len(self.snapshots) >= 2 and not self.snapshots[-2].ok
            point = self.deriver.add(snap)
            if point is not None:
                self.points.append(point)
            if snap.error and (not self.errors or self.errors[-1][1] != snap.error):
                self.errors.append((snap.t, snap.error))
            if snap.ok and failing:
                self.events.append((snap.t, f"{self.url} answers again; nothing collected before was lost"))
            self.events.extend(self.deriver.events[self._events_seen :])
            self._events_seen = len(self.deriver.events)
        if self.callback is not None:
            try:
                self.callback(snap, point)
            except Exception as exc:  # a view's bug must not stop the collection
                with self._lock:
                    self.errors.append((time.time(), f"the callback raised {type(exc).__name__}: {exc}"))
        return snap, point

    def latest(self) -> tuple[Snapshot | None, Point | None]:
        with self._lock:
            return (self.snapshots[-1] if self.snapshots else None, self.points[-1] if self.points else None)

    def _run(self) -> None:
        try:
            with httpx.Client(timeout=self.timeout, trust_env=False) as client:
                start = time.monotonic()
                tick = 0
                while not self._stop.is_set():
                    try:
                        self.poll_once(client)
                    except Exception as exc:  # a bug in parsing or deriving: keep what we have, keep going
                        with self._lock:
                            self.errors.append((time.time(), f"poller error {type(exc).__name__}: {exc}"))
                    now = time.monotonic()
                    tick = max(tick + 1, int((now - start) / self.interval) + 1)
                    self._stop.wait(max(0.0, start + tick * self.interval - now))
        except Exception as exc:
            with self._lock:
                self.errors.append((time.time(), f"the poller stopped: {type(exc).__name__}: {exc}"))
