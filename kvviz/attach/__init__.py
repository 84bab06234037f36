"""Attach to a running vLLM server: its KV cache, requests and latency, read from /metrics.

metrics.py parses and derives, poller.py scrapes on a schedule in a thread, client.py sends kvviz's
own timed prompt, load.py a bounded load, session.py saves and opens sessions, server.py starts a
real vLLM on loopback for tests. Needs httpx and prometheus_client; never imports Qt or torch at
import time (session.predict imports kvviz.engine only when asked for a prediction).

From a window (the callback runs on the poller's thread: forward it through a queued signal)::

    poller = Poller(url, interval=0.5, callback=lambda snap, point: sig_point.emit(snap, point)).start()
    ...  # point.usage, .usage_tokens, .usage_bytes, .running, .waiting, .prefix_hit_rate,
    ...  # .tokens_per_s, .ttft / .itl ({"p50", "p90", "p99"} seconds); snap.error for a failed scrape
    poller.cancel()  # returns at once; poller.join(timeout) to wait; poller.events for notices
    record = stream_completion(client, url, model, prompt)  # in a thread; on_token=... for each token
    Session(url=url, snapshots=poller.snapshots, requests=[record], ...).save(path); session.load(path)
"""
