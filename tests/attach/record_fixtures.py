"""Record the /metrics fixtures in tests/attach/data/ from a real vLLM server (not run by pytest).

    KVVIZ_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python tests/attach/record_fixtures.py

Starts the server on loopback, saves /metrics idle, during a bounded load with a shared prefix and
after it; then restarts the server (counters reset) and saves it fresh and after one request.
The old-metric-name fixture is derived from a recording by test_metrics.py, not recorded.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx

from kvviz.attach.client import first_model, stream_completion
from kvviz.attach.load import run_load
from kvviz.attach.server import VllmServer
from kvviz.engine.model_cache import ensure_default_model

DATA = Path(__file__).parent / "data"
# Longer than two 128-token blocks: vLLM caches and matches prefixes in whole blocks.
PREFIX = (
    "You are a careful assistant working for a small public library. Visitors ask about books, opening "
    "hours, events and local history. Answer in plain English, briefly and precisely, and say so when you "
    "do not know. "
) * 8


def save(client: httpx.Client, url: str, name: str) -> None:
    text = client.get(url + "/metrics").text
    (DATA / name).write_text(text)
    print(f"saved {name}: {len(text)} chars", flush=True)


def save_stream(url: str, model: str, name: str) -> None:
    """The raw server-sent events of one streaming completion, as the server wrote them."""
    body = {
        "model": model,
        "prompt": "The capital of France is",
        "max_tokens": 12,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.Client(timeout=60, trust_env=False) as client:
        text = client.post(url + "/v1/completions", json=body).text
    (DATA / name).write_text(text)
    print(f"saved {name}: {len(text)} chars", flush=True)


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `timeout` still stops the server
    python = os.environ["KVVIZ_VLLM_PYTHON"]
    model_dir = str(ensure_default_model())
    server = VllmServer(python, model_dir, log_path="/tmp/kvviz-vllm-record.log")
    t0 = time.monotonic()
    with server, httpx.Client(timeout=30, trust_env=False) as client:
        print(f"server up in {time.monotonic() - t0:.0f} s at {server.url}", flush=True)
        save(client, server.url, "metrics_idle.txt")
        model = first_model(client, server.url)
        rec = stream_completion(client, server.url, model, "The capital of France is", max_tokens=16)
        print("own request:", repr(rec.text), rec.error, flush=True)
        save_stream(server.url, model, "completion_stream.txt")
        holder = {}

        def load() -> None:
            holder["r"] = run_load(server.url, model, 8, 4, 90, PREFIX, max_tokens=96, ignore_eos=True)

        worker = threading.Thread(target=load)
        worker.start()
        time.sleep(4)
        save(client, server.url, "metrics_load.txt")
        worker.join(120)
        print("load:", holder["r"].summary(), flush=True)
        time.sleep(1)
        save(client, server.url, "metrics_after.txt")
    t0 = time.monotonic()
    with VllmServer(python, model_dir, port=server.port, log_path="/tmp/kvviz-vllm-record2.log") as again:
        print(f"restarted in {time.monotonic() - t0:.0f} s", flush=True)
        with httpx.Client(timeout=30, trust_env=False) as client:
            save(client, again.url, "metrics_restarted.txt")
            stream_completion(client, again.url, model, "The capital of France is", max_tokens=8)
            save(client, again.url, "metrics_restarted_after.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
