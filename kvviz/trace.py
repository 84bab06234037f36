"""Records of a generation run and the trace file that keeps them.

Plain data only (stdlib + numpy): the engine produces these records, the window, the CLI and the
report consume them. Nothing here knows about torch or Qt.

A trace file is JSON:

    {"format": "kvviz-trace", "version": 1, "model": {...}, "strategy": {"name", "options"},
     "prompt": str, "prompt_tokens": int, "cancelled": bool, "steps": [...], "summary": {...}}
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "kvviz-trace"
VERSION = 1
ATTENTION_SINK_POSITIONS = 4  # the first positions whose share of attention the attention view follows


class SlotState(IntEnum):
    """What one cache position of one layer holds. The cache map draws these."""

    UNSEEN = 0  # beyond the tokens processed so far and not allocated
    PREALLOCATED = 1  # allocated but not yet written (static caches)
    FULL = 2  # keys/values in the model's dtype
    QUANTIZED = 3  # keys/values stored quantized
    RESIDUAL = 4  # full-precision buffer waiting to be quantized
    EVICTED = 5  # was cached, has been dropped
    SINK = 6  # attention-sink token kept forever


STORAGE_KINDS = ("full", "quantized", "residual")


@dataclass
class LayerRecord:
    """One decoder layer's cache after a step.

    `spans` describes the layer's positions as run-length pairs ``[state, count]`` covering
    absolute positions 0, 1, ... (see `SlotState`); a static cache's unwritten tail is PREALLOCATED.
    """

    keys_bytes: int
    values_bytes: int
    seq_len: int  # tokens held
    capacity: int  # token slots allocated (== seq_len for growing caches)
    layer_ms: float | None = None
    storage: dict[str, int] = field(default_factory=dict)  # bytes by STORAGE_KINDS
    spans: list[list[int]] = field(default_factory=list)
    # Where KV heads hold different positions (per-head eviction): run-length pairs [KV heads holding the
    # position, count] covering the same positions as `spans`; None when every head holds the same ones.
    head_spans: list[list[int]] | None = None

    @property
    def total_bytes(self) -> int:
        return self.keys_bytes + self.values_bytes


@dataclass
class StepRecord:
    index: int
    phase: str  # "prefill" or "decode"
    token_id: int
    token: str
    wall_ms: float
    cache_bytes: int
    predicted_cache_bytes: int
    rss_bytes: int
    strategy: str
    layers: list[LayerRecord]
    cuda_bytes: int | None = None
    position: int = 0  # absolute position of the token this step produced
    # Against a full-precision reference run in lockstep (None when no reference ran):
    kl: float | None = None  # KL(reference || run) of the next-token distributions, in nats
    top1_agree: bool | None = None
    ref_logprob: float | None = None  # reference log-probability of the token chosen
    reference_ms: float | None = None  # the reference's own step time, not in wall_ms
    scoring_ms: float | None = None  # part of wall_ms an evicting cache spent choosing what to keep (None: none)
    # The attention view (None unless asked for): per layer, the share of the current token's attention, averaged
    # over query heads, that lands on the first ATTENTION_SINK_POSITIONS positions...
    attention_sink: list[float] | None = None
    # ... and that attention itself, [layers, positions 0..position-1] (numpy float32, evicted positions 0): kept
    # in memory for the live view, not written to trace files.
    attention: Any = field(default=None, repr=False, compare=False, metadata={"saved": False})


@dataclass
class Switch:
    """A change of cache strategy that took effect before step `step`."""

    step: int
    from_strategy: str
    to_strategy: str
    options: dict[str, Any]


@dataclass
class Trace:
    model: dict[str, Any]
    strategy: dict[str, Any]  # {"name": str, "options": dict}
    prompt: str = ""
    prompt_tokens: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)
    cancelled: bool = False
    compile_ms: float | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(step.token for step in self.steps)

    def summary(self) -> dict[str, Any]:
        return summarize(self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "strategy": self.strategy,
            "prompt": self.prompt,
            "prompt_tokens": self.prompt_tokens,
            "settings": self.settings,
            "cancelled": self.cancelled,
            "compile_ms": self.compile_ms,
            "error": self.error,
            "switches": [asdict(s) for s in self.switches],
            "steps": [_saved(s) for s in self.steps],
            "summary": self.summary(),
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically, so that an interrupted save never leaves half a file."""
        path = Path(path)
        tmp = path.with_name(path.name + ".part")
        tmp.write_text(json.dumps(self.to_dict(), indent=None, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, path)
        return path


def _saved(step: StepRecord) -> dict[str, Any]:
    """A step as written to a file: every field but those marked not saved (the live attention rows)."""
    saved = {f.name: getattr(step, f.name) for f in fields(step) if f.metadata.get("saved", True)}
    saved["layers"] = [asdict(layer) for layer in step.layers]
    return saved


def summarize(steps: list[StepRecord]) -> dict[str, Any]:
    """Numbers a user compares runs by. Decode statistics exclude the prefill step."""
    decode_ms = np.array([s.wall_ms for s in steps if s.phase == "decode"], dtype=float)
    prefill = [s.wall_ms for s in steps if s.phase == "prefill"]
    mean = float(decode_ms.mean()) if decode_ms.size else None
    summary = {
        "new_tokens": len(steps),
        "prefill_ms": prefill[0] if prefill else None,
        "decode_ms_mean": mean,
        "decode_ms_p95": float(np.percentile(decode_ms, 95)) if decode_ms.size else None,
        "decode_tokens_per_s": 1000.0 / mean if mean else None,
        "peak_cache_bytes": max((s.cache_bytes for s in steps), default=0),
        "final_cache_bytes": steps[-1].cache_bytes if steps else 0,
        "peak_rss_bytes": max((s.rss_bytes for s in steps), default=0),
    }
    compared = [s for s in steps if s.kl is not None]
    if compared:
        disagree = [s.index for s in compared if not s.top1_agree]
        summary.update(
            mean_kl=float(np.mean([s.kl for s in compared])),
            top1_agreement=float(np.mean([s.top1_agree for s in compared])),
            first_divergence=disagree[0] if disagree else None,
            reference_perplexity=float(np.exp(-np.mean([s.ref_logprob for s in compared]))),
            reference_ms_mean=float(np.mean([s.reference_ms for s in compared])),
        )
    return summary


class TraceError(ValueError):
    """A file is not a readable kvviz trace; the message says what is wrong."""


_STEP_KEYS = {
    "index": int,
    "phase": str,
    "token_id": int,
    "token": str,
    "wall_ms": (int, float),
    "cache_bytes": int,
    "predicted_cache_bytes": int,
    "rss_bytes": int,
    "layers": list,
}
_LAYER_KEYS = {"keys_bytes": int, "values_bytes": int, "seq_len": int, "capacity": int}


def read_json(path: str | os.PathLike, kind: str = "kvviz trace", error: type[ValueError] = TraceError) -> Any:
    """A kept file's JSON; `error` names what is wrong (unreadable, not UTF-8 JSON text)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path} is not a {kind}: it is not JSON text ({exc})") from None


def load(path: str | os.PathLike) -> Trace:
    """Read and validate a trace file. Raises TraceError naming the first problem found."""
    return from_dict(read_json(path), source=str(path))


def from_dict(data: Any, source: str = "trace") -> Trace:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TraceError(f'{source} is not a kvviz trace: expected "format": "{FORMAT}" at the top level')
    if data.get("version") != VERSION:
        raise TraceError(
            f"{source} is a kvviz trace of version {data.get('version')!r}; this kvviz reads version {VERSION}"
        )
    for key, kind in (("model", dict), ("strategy", dict), ("steps", list), ("prompt_tokens", int)):
        if not isinstance(data.get(key), kind):
            raise TraceError(f"{source}: field {key!r} is missing or not a {kind.__name__}")
    steps = []
    for i, raw_step in enumerate(data["steps"]):
        _check_fields(raw_step, _STEP_KEYS, f"{source}: steps[{i}]")
        layers = []
        for j, raw_layer in enumerate(raw_step["layers"]):
            _check_fields(raw_layer, _LAYER_KEYS, f"{source}: steps[{i}].layers[{j}]")
            layers.append(
                LayerRecord(
                    keys_bytes=raw_layer["keys_bytes"],
                    values_bytes=raw_layer["values_bytes"],
                    seq_len=raw_layer["seq_len"],
                    capacity=raw_layer["capacity"],
                    layer_ms=raw_layer.get("layer_ms"),
                    storage=dict(raw_layer.get("storage") or {}),
                    spans=[list(s) for s in raw_layer.get("spans") or []],
                    head_spans=raw_layer.get("head_spans"),
                )
            )
        steps.append(
            StepRecord(
                index=raw_step["index"],
                phase=raw_step["phase"],
                token_id=raw_step["token_id"],
                token=raw_step["token"],
                wall_ms=float(raw_step["wall_ms"]),
                cache_bytes=raw_step["cache_bytes"],
                predicted_cache_bytes=raw_step["predicted_cache_bytes"],
                rss_bytes=raw_step["rss_bytes"],
                strategy=raw_step.get("strategy", data["strategy"].get("name", "")),
                layers=layers,
                cuda_bytes=raw_step.get("cuda_bytes"),
                position=raw_step.get("position", 0),
                kl=raw_step.get("kl"),
                top1_agree=raw_step.get("top1_agree"),
                ref_logprob=raw_step.get("ref_logprob"),
                reference_ms=raw_step.get("reference_ms"),
                scoring_ms=raw_step.get("scoring_ms"),
                attention_sink=raw_step.get("attention_sink"),
            )
        )
    switches = []
    for i, raw_switch in enumerate(data.get("switches") or []):
        try:
            switches.append(Switch(**raw_switch))
        except TypeError:
            raise TraceError(f"{source}: switches[{i}] is not a switch record") from None
    return Trace(
        model=data["model"],
        strategy=data["strategy"],
        prompt=data.get("prompt", ""),
        prompt_tokens=data["prompt_tokens"],
        settings=data.get("settings") or {},
        steps=steps,
        switches=switches,
        cancelled=bool(data.get("cancelled", False)),
        compile_ms=data.get("compile_ms"),
        error=data.get("error"),
    )


def _check_fields(obj: Any, fields: dict[str, Any], where: str) -> None:
    if not isinstance(obj, dict):
        raise TraceError(f"{where} is not an object")
    for key, kind in fields.items():
        value = obj.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise TraceError(f"{where}: field {key!r} is missing or has the wrong type")
        if isinstance(value, float) and not math.isfinite(value):
            raise TraceError(f"{where}: field {key!r} is not a finite number")
