"""An attach session as a trace-like JSON file, and the KV-bytes-per-token check.

File layout (``"format": "kvviz-attach"``, ``"version": 1``)::

    {"format", "version", "url", "model", "started", "finished", "interval",
     "cache": {labels of vllm:cache_config_info}, "prediction": {...} | null,
     "snapshots": [Snapshot...], "requests": [RequestRecord...], "load": {...} | null,
     "errors": [[t, message]...], "events": [[t, message]...], "summary": {...}}

Points (usage in tokens and bytes, rates, percentiles) are derived again from the snapshots on
load, so the file keeps raw measurements only and a later kvviz can derive more from them.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvviz.attach.client import RequestRecord
from kvviz.attach.metrics import Deriver, Point, Snapshot, allocated_bytes_per_token
from kvviz.trace import read_json

FORMAT = "kvviz-attach"
VERSION = 1

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


class SessionError(ValueError):
    """A file is not a readable kvviz attach session; the message says what is wrong."""


def kv_dtype_name(cache_dtype: str | None, server_dtype: str | None, config_dtype: str | None) -> tuple[str, str]:
    """The dtype the server stores keys and values in, and where that came from.

    vLLM's cache_dtype label is "auto" unless --kv-cache-dtype was given: the cache then has the
    model's dtype, which is the server's --dtype, or for "auto" the checkpoint's dtype with float32
    checkpoints cast to bfloat16 (vLLM's rule on CPU).
    """
    if cache_dtype and cache_dtype != "auto":
        if cache_dtype not in _DTYPES:
            raise ValueError(f"unknown KV cache dtype {cache_dtype!r}")
        return _DTYPES[cache_dtype], "the server's cache_dtype"
    if server_dtype and server_dtype != "auto":
        if server_dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {server_dtype!r}; use float32, bfloat16 or float16")
        return _DTYPES[server_dtype], "--dtype"
    name = _DTYPES.get(str(config_dtype or "float32").replace("torch.", ""), "float32")
    if name == "float32":
        return "bfloat16", "the checkpoint is float32, which vLLM serves as bfloat16 on CPU"
    return name, "the checkpoint's dtype"


def predict(model_dir: str | os.PathLike, cache: dict[str, Any], server_dtype: str | None = None) -> dict[str, Any]:
    """kvviz's predicted KV bytes per token from the model's config, next to the server's allocation."""
    import torch
    from transformers import AutoConfig

    from kvviz.engine.geometry import Geometry

    try:
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read a model config from {model_dir}: {exc}") from None
    text = config.get_text_config(decoder=True)
    config_dtype = getattr(text, "dtype", None) or getattr(config, "torch_dtype", None)
    dtype_name, why = kv_dtype_name(cache.get("cache_dtype"), server_dtype, str(config_dtype) if config_dtype else None)
    predicted = Geometry.of(config, getattr(torch, dtype_name)).kv_bytes_per_token
    allocated = allocated_bytes_per_token(cache)
    return {
        "model_dir": str(model_dir),
        "dtype": dtype_name,
        "dtype_from": why,
        "predicted_bytes_per_token": predicted,
        "allocated_bytes_per_token": allocated,
        "ratio": allocated / predicted if allocated else None,
    }


@dataclass
class Session:
    url: str
    model: str | None = None
    started: float = field(default_factory=time.time)
    finished: float | None = None
    interval: float = 0.5
    cache: dict[str, Any] = field(default_factory=dict)
    prediction: dict[str, Any] | None = None
    snapshots: list[Snapshot] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    load: dict[str, Any] | None = None
    errors: list[list[Any]] = field(default_factory=list)  # [time, message]: what failed
    events: list[list[Any]] = field(default_factory=list)  # [time, message]: restarts, old names, recoveries

    def points(self) -> list[Point]:
        deriver = Deriver()
        return [p for p in (deriver.add(s) for s in self.snapshots) if p is not None]

    def summary(self) -> dict[str, Any]:
        deriver = Deriver()
        points = [p for p in (deriver.add(s) for s in self.snapshots) if p is not None]
        usage = [p.usage for p in points if p.usage is not None]
        rates = [p.tokens_per_s for p in points if p.tokens_per_s is not None]
        own = [r for r in self.requests if r.tag == "own"]
        gaps = sorted(g for r in own for g in r.gaps_ms)
        last = points[-1] if points else None
        return {
            "snapshots": len(self.snapshots),
            "failed_scrapes": sum(1 for s in self.snapshots if not s.ok),
            "restarts": deriver.restarts,
            "usage_peak": max(usage, default=None),
            "usage_final": usage[-1] if usage else None,
            "usage_peak_tokens": max((p.usage_tokens for p in points if p.usage_tokens is not None), default=None),
            "usage_peak_bytes": max((p.usage_bytes for p in points if p.usage_bytes is not None), default=None),
            "running_peak": max((p.running for p in points if p.running is not None), default=None),
            "waiting_peak": max((p.waiting for p in points if p.waiting is not None), default=None),
            "prefix_queries": deriver.totals.get("prefix_queries"),
            "prefix_hits": deriver.totals.get("prefix_hits"),
            "prefix_hit_rate": last.prefix_hit_rate_total if last else None,
            "generation_tokens": deriver.totals.get("generation_tokens"),
            "tokens_per_s_peak": max(rates, default=None),
            "ttft": last.ttft if last else {},
            "itl": last.itl if last else {},
            "own_requests": len(own),
            "own_tokens": sum(len(r.tokens) for r in own),
            "own_ttft_s": own[0].ttft if own else None,
            "own_itl_ms_median": gaps[len(gaps) // 2] if gaps else None,
            "predicted_bytes_per_token": (self.prediction or {}).get("predicted_bytes_per_token"),
            "allocated_bytes_per_token": allocated_bytes_per_token(self.cache),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "url": self.url,
            "model": self.model,
            "started": self.started,
            "finished": self.finished,
            "interval": self.interval,
            "cache": self.cache,
            "prediction": self.prediction,
            "snapshots": [s.to_dict() for s in self.snapshots],
            "requests": [r.to_dict() for r in self.requests],
            "load": self.load,
            "errors": [list(e) for e in self.errors],
            "events": [list(e) for e in self.events],
            "summary": self.summary(),
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically, so that an interrupted save never leaves half a file."""
        path = Path(path)
        tmp = path.with_name(path.name + ".part")
        tmp.write_text(json.dumps(self.to_dict(), separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, path)
        return path


def load(path: str | os.PathLike) -> Session:
    return from_dict(read_json(path, "kvviz attach session", SessionError), source=str(path))


def _need(data: dict, key: str, kind, source: str, optional: bool = False):
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SessionError(f"{source}: field {key!r} is missing or not a {names}")
    return value


def from_dict(data: Any, source: str = "session") -> Session:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        hint = (
            " (it is a local-run trace: open it with `kvviz trace`)"
            if isinstance(data, dict) and data.get("format") == "kvviz-trace"
            else ""
        )
        raise SessionError(f'{source} is not a kvviz attach session: expected "format": "{FORMAT}"{hint}')
    if data.get("version") != VERSION:
        raise SessionError(
            f"{source} is a kvviz attach session of version {data.get('version')!r}; this kvviz reads version {VERSION}"
        )
    _need(data, "url", str, source)
    _need(data, "started", (int, float), source)
    for key in ("snapshots", "requests"):
        _need(data, key, list, source)
    _need(data, "cache", dict, source)
    snapshots = []
    for i, raw in enumerate(data["snapshots"]):
        where = f"{source}: snapshots[{i}]"
        if not isinstance(raw, dict):
            raise SessionError(f"{where} is not an object")
        _need(raw, "t", (int, float), where)
        try:
            snapshots.append(Snapshot.from_dict(raw))
        except (TypeError, KeyError, ValueError) as exc:
            raise SessionError(f"{where} is malformed ({exc})") from None
    requests = []
    for i, raw in enumerate(data["requests"]):
        where = f"{source}: requests[{i}]"
        if not isinstance(raw, dict):
            raise SessionError(f"{where} is not an object")
        _need(raw, "prompt", str, where)
        _need(raw, "tokens", list, where)
        try:
            requests.append(RequestRecord.from_dict(raw))
        except (TypeError, KeyError, ValueError) as exc:
            raise SessionError(f"{where} is malformed ({exc})") from None
    return Session(
        url=data["url"],
        model=data.get("model"),
        started=float(data["started"]),
        finished=data.get("finished"),
        interval=float(data.get("interval") or 0.5),
        cache=data["cache"],
        prediction=data.get("prediction"),
        snapshots=snapshots,
        requests=requests,
        load=data.get("load"),
        errors=[list(e) for e in data.get("errors") or []],
        events=[list(e) for e in data.get("events") or []],
    )
