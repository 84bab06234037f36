"""An attach session as a trace-like JSON file, and the KV-bytes-per-token check.

File layout (``"format": "kvviz-attach"``, ``"version": 1``)::

    {"format", "version", "url", "model", "started", "finished", "interval",
     "cache": {labels of vllm:cache_config_info}, "prediction": {...} | null,
     "snapshots": [Snapshot...], "requests": [RequestRecord...], "load": {...} | null,
     "errors": [[t, message]...], "events": [[t, message]...], "summary": {...}}

Points (usage in tokens and bytes, rates, percentiles) are derived again from the snapshots on
load, so the file keeps raw measurements and a later kvviz can derive more from them; the summary it
keeps beside them must agree with them.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvviz.attach.client import RequestRecord, TokenTiming
from kvviz.attach.metrics import Deriver, Histogram, Point, Snapshot, allocated_bytes_per_token
from kvviz.files.file_format import FileFormat
from kvviz.files.jsonfile import KeptFileError, write_json
from kvviz.files.schema import (
    MAX_BYTES,
    Either,
    Flag,
    Int,
    Json,
    ListOf,
    MapOf,
    Number,
    Pair,
    Record,
    Refusal,
    Text,
    at,
    maybe,
    optional,
)
from kvviz.files.trace_schema import MAX_POSITIONS

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


class SessionError(KeptFileError):
    """A file is not a readable kvviz attach session; the message says what is wrong and where."""


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
        """Write atomically and completely, even when Ctrl-C comes during the save (`kvviz.files.jsonfile`).
        A histogram's +Inf bucket bound is written as null (JSON has no infinity) and read back as +Inf."""
        return write_json(path, self.to_dict)


def load(path: str | os.PathLike) -> Session:
    """Read and check a session file. Raises SessionError naming the file, the field and what was expected."""
    return FILE_FORMAT.read(path)


def from_dict(data: Any, source: str = "session") -> Session:
    return FILE_FORMAT.parse(data, source)


# -- the file's schema ----------------------------------------------------------------------------------

# vllm:cache_config_info labels, as `metrics.parse` keeps them: numbers, true/false, text, null for vLLM's "None"
# (older kvviz kept the text "None"). Those vLLM writes are declared; others a later vLLM adds are plain values.
_NUMBER_LABELS = (
    "block_size", "cache_hit_alignment_tokens", "cpu_offload_gb", "effective_attention_block_size",
    "gpu_memory_utilization", "hash_block_size", "kv_cache_max_concurrency", "kv_offloading_size", "mamba_block_size",
    "mamba_page_size_padded", "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override",
    "prefix_cache_retention_interval", "prefix_match_unit", "replayssm_buffer_len", "skip_page_size_padded",
    "sliding_window", "swap_space",
)
_FLAG_LABELS = (
    "_block_size_resolved", "calculate_kv_scales", "enable_mamba_shared_prefix_checkpoint", "enable_prefix_caching",
    "is_attention_free", "kv_sharing_fast_prefill", "sliding_window_only", "swa_bounded_replay", "use_kda_recoverssm",
    "use_replayssm", "user_specified_block_size",
)
_TEXT_LABELS = (
    "cache_dtype", "kv_cache_dtype_skip_layers", "kv_cache_layout", "kv_offloading_backend", "mamba_cache_dtype",
    "mamba_cache_mode", "mamba_ssm_cache_dtype", "prefix_caching_hash_algo",
)
_LABELS = Record(
    {name: maybe(Either(Number(null=True), Text(("None",)))) for name in _NUMBER_LABELS}
    | {name: maybe(Flag(null=True)) for name in _FLAG_LABELS}
    | {name: maybe(Text(null=True)) for name in _TEXT_LABELS}
    | {"kv_cache_size_tokens": maybe(Number(0, null=True, what="a number of tokens")),  # what kvviz computes with
       "kv_cache_memory_bytes": maybe(Number(0, null=True, what="a byte count"))},
    extra=Json(depth=0),
    what="an object of the server's cache labels",
)


def _in_order(items: str, key: str, strict: bool = False):
    """A rule: the `key` of each item of the list `items` does not decrease (strictly grows)."""

    def rule(record: dict, where) -> None:
        values = [item[key] for item in record[items] if item[key] is not None]
        for i, (a, b) in enumerate(zip(values, values[1:], strict=False)):
            if b < a or (strict and b == a):
                raise Refusal(at(where, items, i + 1, key), f"a value {'above' if strict else 'at least'} {a:g}", b)

    return rule


def _cumulative(histogram: dict, where) -> None:
    buckets = histogram["buckets"]
    for i, (bound, count) in enumerate(buckets):
        if bound is None and i != len(buckets) - 1:
            raise Refusal(at(where, "buckets", i, 0), "a finite bound (only the last bucket is +Inf)", None)
        if i and (bound is not None and bound <= buckets[i - 1][0] or count < buckets[i - 1][1]):
            raise Refusal(at(where, "buckets", i), "a bucket above the one before (cumulative counts)", [bound, count])


_HISTOGRAM = Record(
    {
        # null: +Inf, the last bucket (JSON has no infinity); older files wrote the Infinity literal
        "buckets": ListOf(Pair(Number(null=True, infinite=True), Number(0), what="bucket [upper bound, count]")),
        "count": Number(0),
        "sum": Number(),
    },
    rules=(_cumulative,),
    what="a histogram (an object with buckets, count, sum)",
)

_SNAPSHOT = Record(
    {
        "t": Number(0),
        "usage": optional(Number(0, 1, null=True)),
        "usage_metric": optional(Text(null=True)),
        "running": optional(Number(0, null=True)),
        "waiting": optional(Number(0, null=True)),
        "counters": optional(MapOf(Number(0)), {}),
        "histograms": optional(MapOf(_HISTOGRAM), {}),
        "cache": optional(_LABELS, {}),
        "model": optional(Text(null=True)),
        "process_start": optional(Number(null=True)),
        "error": optional(Text(null=True)),
    },
    what="a scrape record (an object)",
)

_TOKEN = Record({"index": Int(0), "text": Text(), "t": Number(0)}, what="a token timing (an object)")


def _tokens_numbered(record: dict, where) -> None:
    for i, token in enumerate(record["tokens"]):
        if token["index"] != i:
            raise Refusal(
                at(where, "tokens", i, "index"), f"{i} (tokens are numbered 0, 1, 2, ... in order)", token["index"]
            )


_REQUEST = Record(
    {
        "prompt": Text(),
        "max_tokens": Int(0),
        "started": Number(0),
        "tokens": ListOf(_TOKEN),
        "finish_reason": optional(Text(null=True)),
        "prompt_tokens": optional(Int(0, MAX_POSITIONS, null=True)),
        "completion_tokens": optional(Int(0, null=True)),
        "total_s": optional(Number(0, null=True)),
        "error": optional(Text(null=True)),
        "tag": optional(Text(), "own"),
    },
    rules=(_tokens_numbered, _in_order("tokens", "t")),
    what="a request record (an object)",
)

_PREDICTION = Record(
    {
        "model_dir": Text(),
        "dtype": Text(),
        "dtype_from": optional(Text(), ""),
        "predicted_bytes_per_token": Int(0, MAX_BYTES),
        "allocated_bytes_per_token": optional(Number(0, null=True)),
        "ratio": optional(Number(0, null=True)),
    },
    null=True,
    what="a prediction (an object) or null",
)

_LOAD = Record(
    {
        "requested": Int(0),
        "completed": Int(0),
        "failed": Int(0),
        "not_started": Int(0),
        "wall_s": Number(0),
        "concurrency": maybe(Int(0)),
        "sent": maybe(Int(0)),
        "completion_tokens": maybe(Int(0)),
        "ttft_median_s": maybe(Number(0, null=True)),
        "errors": maybe(ListOf(Text())),
    },
    null=True,
    extra=Json(depth=1),
    what="a load summary (an object) or null",
)

_NOTES = ListOf(Pair(Number(), Text(), what="note [time, message]"))

_SESSION = Record(
    {
        "url": Text(nonempty=True),
        "model": optional(Text(null=True)),
        "started": Number(0),
        "finished": optional(Number(0, null=True)),
        "interval": optional(Number(0, 3600, null=True)),
        "cache": _LABELS,
        "prediction": optional(_PREDICTION),
        "snapshots": ListOf(_SNAPSHOT),
        "requests": ListOf(_REQUEST),
        "load": optional(_LOAD),
        "errors": optional(_NOTES, []),
        "events": optional(_NOTES, []),
        "summary": optional(Json(depth=3)),  # what the snapshots give: checked against them (`FileFormat.summary`)
    },
    rules=(_in_order("snapshots", "t"),),
)


def _snapshot(data: dict) -> Snapshot:
    histograms = {
        key: Histogram(
            buckets=[(math.inf if bound is None else bound, count) for bound, count in h["buckets"]],
            count=h["count"],
            sum=h["sum"],
        )
        for key, h in data["histograms"].items()
    }
    return Snapshot(**dict(data, histograms=histograms))


def _request(data: dict) -> RequestRecord:
    return RequestRecord(**dict(data, tokens=[TokenTiming(**t) for t in data["tokens"]]))


def _build(data: dict) -> Session:
    return Session(
        url=data["url"],
        model=data["model"],
        started=data["started"],
        finished=data["finished"],
        interval=data["interval"] or 0.5,
        cache=data["cache"],
        prediction=data["prediction"],
        snapshots=[_snapshot(s) for s in data["snapshots"]],
        requests=[_request(r) for r in data["requests"]],
        load=data["load"],
        errors=data["errors"],
        events=data["events"],
    )


FILE_FORMAT = FileFormat(
    name=FORMAT,
    version=VERSION,
    kind="kvviz attach session",
    schema=_SESSION,
    build=_build,
    error=SessionError,
    hints={"kvviz-trace": " (it is a local-run trace: open it with `kvviz trace`)"},
    summary=Session.summary,
)
