"""kvviz's own request: a prompt through the server's OpenAI-compatible streaming /v1/completions.

Every streamed chunk is timed on arrival (time.perf_counter, from just before the request is sent),
so the result carries the time to first token and every inter-token gap, measured by the client,
next to what the server's histograms say.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from kvviz.attach.poller import base_url, describe_http_error


@dataclass
class TokenTiming:
    index: int
    text: str
    t: float  # seconds since the request was sent

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenTiming:
        return cls(index=int(data["index"]), text=str(data["text"]), t=float(data["t"]))


@dataclass
class RequestRecord:
    prompt: str
    max_tokens: int
    started: float  # time.time() when sent
    tokens: list[TokenTiming] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # from the server's usage block
    completion_tokens: int | None = None
    total_s: float | None = None
    error: str | None = None
    tag: str = "own"  # "own" for kvviz's timed prompt, "load" for the load generator's

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)

    @property
    def ttft(self) -> float | None:
        return self.tokens[0].t if self.tokens else None

    @property
    def gaps_ms(self) -> list[float]:
        """Inter-token latency of every token after the first, in milliseconds."""
        return [1000.0 * (b.t - a.t) for a, b in zip(self.tokens, self.tokens[1:], strict=False)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        data = dict(data)
        data["tokens"] = [TokenTiming.from_dict(t) for t in data.get("tokens") or []]
        return cls(**data)


def count_prompt_tokens(client: httpx.Client, url: str, model: str, prompt: str) -> int | None:
    """How many tokens the server makes of a prompt (vLLM's POST /tokenize), or None if it cannot say."""
    try:
        response = client.post(base_url(url) + "/tokenize", json={"model": model, "prompt": prompt})
        response.raise_for_status()
        return int(response.json()["count"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def first_model(client: httpx.Client, url: str) -> str:
    """The id of the first model the server serves (GET /v1/models). Raises RuntimeError with a message."""
    models_url = base_url(url) + "/v1/models"
    try:
        response = client.get(models_url)
        response.raise_for_status()
        data = response.json()["data"]
        return data[0]["id"]
    except httpx.HTTPError as exc:
        raise RuntimeError(describe_http_error(models_url, exc)) from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise RuntimeError(f"{models_url} did not list any model in the OpenAI format") from None


def stream_completion(
    client: httpx.Client,
    url: str,
    model: str,
    prompt: str,
    max_tokens: int = 64,
    temperature: float = 0.0,
    timeout: float = 120.0,
    ignore_eos: bool = False,
    tag: str = "own",
    on_token: Callable[[TokenTiming], None] | None = None,
) -> RequestRecord:
    """Send one streaming completion and time each chunk. Never raises: failures go to `error`.

    on_token(timing) is called on this thread as each token arrives (a window forwards it through a
    queued signal to draw the request live).
    """
    record = RequestRecord(prompt=prompt, max_tokens=max_tokens, started=time.time(), tag=tag)
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True  # a vLLM extension: generate exactly max_tokens
    endpoint = base_url(url) + "/v1/completions"
    t0 = time.perf_counter()
    deadline = t0 + timeout
    try:
        with client.stream("POST", endpoint, json=body, timeout=httpx.Timeout(timeout)) as response:
            if response.status_code >= 400:
                response.read()
                record.error = f"{endpoint} answered HTTP {response.status_code}: {response.text[:300]}"
                return record
            for line in response.iter_lines():
                now = time.perf_counter()
                if now > deadline:
                    record.error = f"stopped after {timeout:g} s (the time limit)"
                    break
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if chunk.get("usage"):
                    record.prompt_tokens = chunk["usage"].get("prompt_tokens")
                    record.completion_tokens = chunk["usage"].get("completion_tokens")
                for choice in chunk.get("choices") or []:
                    text = choice.get("text") or ""
                    if text or choice.get("finish_reason") is None:
                        timing = TokenTiming(index=len(record.tokens), text=text, t=now - t0)
                        record.tokens.append(timing)
                        if on_token is not None:
                            on_token(timing)
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
    except httpx.HTTPError as exc:
        record.error = describe_http_error(endpoint, exc)
    except (json.JSONDecodeError, AttributeError, TypeError) as exc:
        record.error = f"{endpoint} streamed something that is not OpenAI completion chunks ({exc})"
    record.total_s = time.perf_counter() - t0
    return record
