"""Attach to a running vLLM server: its KV cache, requests and latency, read from /metrics.

metrics.py parses and derives, poller.py scrapes on a schedule in a thread, client.py sends kvviz's
own timed prompt, load.py a bounded load, session.py saves and opens sessions, server.py starts a
real vLLM on loopback for tests. Needs httpx and prometheus_client; never imports Qt or torch at
import time (session.predict imports kvviz.engine only when asked for a prediction).
"""
