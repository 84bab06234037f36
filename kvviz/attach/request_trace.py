"""kvviz's own request to a server as a run: a `Trace` of per-token timings, drawn by the local-run views.

So a served request sits in the Runs table next to local runs and shares their latency plot and
token view. The server's cache is not visible per request, so the steps carry timings and text
only: cache, predicted and RSS bytes and the token id are None (unknown, not 0), and there are no
layers; `is_served(trace)` tells the memory and layer views to leave such runs out.
"""

from __future__ import annotations

from kvviz.attach.client import RequestRecord, TokenTiming
from kvviz.files.trace import StepRecord, Trace

STRATEGY = "vLLM server"


def is_served(trace: Trace) -> bool:
    return bool((trace.model or {}).get("server"))


def model_label(model: str | None) -> str:
    """A served model's id for a table cell: a local folder's last part, a hub id as it is."""
    model = (model or "").rstrip("/")
    return model.rsplit("/", 1)[-1] if model.startswith("/") else model


def request_trace(url: str, model: str | None, prompt: str, max_tokens: int, prompt_tokens: int | None) -> Trace:
    """The empty run for a request about to be sent; `token_step` fills it as tokens arrive."""
    return Trace(
        model={"name": model_label(model), "server": url, "model_id": model},
        strategy={"name": STRATEGY, "options": {}},
        prompt=prompt,
        prompt_tokens=prompt_tokens or 0,
        settings={"max_new_tokens": max_tokens},
    )


def token_step(timing: TokenTiming, previous: TokenTiming | None) -> StepRecord:
    """One arrived token as a step: the first token's wait is the prefill, each later gap a decode step."""
    since = previous.t if previous is not None else 0.0
    return StepRecord(
        index=timing.index,
        phase="prefill" if previous is None else "decode",
        token_id=None,  # the completions stream carries text, not token ids
        token=timing.text,
        wall_ms=1000.0 * (timing.t - since),
        cache_bytes=None,  # the server's cache is not seen per request
        predicted_cache_bytes=None,
        rss_bytes=None,  # the server's process, not ours
        strategy=STRATEGY,
        layers=[],
    )


def record_trace(url: str, model: str | None, record: RequestRecord, prompt_tokens: int | None = None) -> Trace:
    """A finished request as a whole run (sessions opened from a file)."""
    trace = request_trace(url, model, record.prompt, record.max_tokens, record.prompt_tokens or prompt_tokens)
    trace.steps = [token_step(t, p) for t, p in zip(record.tokens, [None, *record.tokens], strict=False)]
    trace.error = record.error
    return trace
