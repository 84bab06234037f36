"""Records of a generation run and the trace file that keeps them.

Plain data only (stdlib + numpy): the engine produces these records, the window, the CLI and the
report consume them. Nothing here knows about torch or Qt.

A trace file is JSON:

    {"format": "kvviz-trace", "version": 1, "model": {...}, "strategy": {"name", "options"},
     "prompt": str, "prompt_tokens": int, "prompt_pieces": [str], "cancelled": bool, "steps": [...],
     "summary": {...}}
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np

from kvviz.jsonfile import KeptFileError, write_json
from kvviz.schema import (
    MAX_BYTES,
    FileFormat,
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
    token_id: int | None  # None: unknown (a served request's step, see kvviz.attach.request_trace)
    token: str
    wall_ms: float
    cache_bytes: int | None  # None: unknown, as are the two below
    predicted_cache_bytes: int | None
    rss_bytes: int | None
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


_NOT_SAVED = {f.name for f in fields(StepRecord) if not f.metadata.get("saved", True)}


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
    compile_ms: float | None = None  # torch.compile before the first decode step, not in any step's time
    warm_up_ms: float | None = None  # the strategy's one-time preparation (kernel builds), before the prefill
    error: str | None = None
    weight_bytes: int | None = None  # weights a decode step reads (every parameter once)
    bandwidth_bytes_per_s: float | None = None  # this machine's memory read bandwidth, measured once
    # the text of each prompt token as the model saw it (chat template included), what the window's cache map and
    # attention view name positions by; empty where not known (older files, served requests)
    prompt_pieces: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(step.token for step in self.steps)

    def floor_ms(self, cache_bytes: int | None) -> float | None:
        """The memory-bound floor of a decode step: weights plus the KV cache read once at this bandwidth."""
        if not self.bandwidth_bytes_per_s or self.weight_bytes is None or cache_bytes is None:
            return None
        return 1000.0 * (self.weight_bytes + cache_bytes) / self.bandwidth_bytes_per_s

    def summary(self) -> dict[str, Any]:
        summary = summarize(self.steps)
        last = self.floor_ms(self.steps[-1].cache_bytes) if self.steps else None
        decode = [s for s in self.steps if s.phase == "decode"]
        floors = [self.floor_ms(s.cache_bytes) for s in decode]
        summary["bandwidth_bytes_per_s"] = self.bandwidth_bytes_per_s
        summary["memory_bound_tokens_per_s"] = 1000.0 / last if last else None
        # the share of the memory-bound speed the run reached: its steps' floors over their real times
        known = decode and all(f is not None for f in floors)
        summary["share_of_memory_bound"] = sum(floors) / sum(s.wall_ms for s in decode) if known else None
        return summary

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "strategy": self.strategy,
            "prompt": self.prompt,
            "prompt_tokens": self.prompt_tokens,
            "prompt_pieces": self.prompt_pieces,
            "settings": self.settings,
            "cancelled": self.cancelled,
            "compile_ms": self.compile_ms,
            "warm_up_ms": self.warm_up_ms,
            "error": self.error,
            "weight_bytes": self.weight_bytes,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "switches": [asdict(s) for s in self.switches],
            "steps": [_step_dict(s) for s in self.steps],
            "summary": self.summary(),
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically and completely, even when Ctrl-C comes during the save (`kvviz.jsonfile`)."""
        return write_json(path, self.to_dict)


def _step_dict(step: StepRecord) -> dict[str, Any]:
    """A step as written to a file: `asdict(step)` without its deep copies (about 2.5x faster: a save holds
    Ctrl-C back while it runs), and without the fields marked not saved (the live attention rows)."""
    layers = [
        dict(vars(layer), storage=dict(layer.storage), spans=[list(span) for span in layer.spans])
        for layer in step.layers
    ]
    saved = {name: value for name, value in vars(step).items() if name not in _NOT_SAVED}
    saved["layers"] = layers
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
        # None where no step measured it (a served request's steps carry no cache or RSS bytes)
        "peak_cache_bytes": max((s.cache_bytes for s in steps if s.cache_bytes is not None), default=None),
        "final_cache_bytes": steps[-1].cache_bytes if steps else None,
        "peak_rss_bytes": max((s.rss_bytes for s in steps if s.rss_bytes is not None), default=None),
    }
    compared = [s for s in steps if s.kl is not None]
    if compared:
        disagree = [s.index for s in compared if not s.top1_agree]
        summary.update(
            mean_kl=float(np.mean([s.kl for s in compared])),
            top1_agreement=float(np.mean([bool(s.top1_agree) for s in compared])),
            first_divergence=disagree[0] if disagree else None,
            reference_perplexity=_mean_of_known([s.ref_logprob for s in compared], lambda m: float(np.exp(-m))),
            reference_ms_mean=_mean_of_known([s.reference_ms for s in compared]),
        )
    return summary


def _mean_of_known(values: list[float | None], then=float) -> float | None:
    known = [v for v in values if v is not None]
    return then(float(np.mean(known))) if known else None


class TraceError(KeptFileError):
    """A file is not a readable kvviz trace; the message says what is wrong and where."""


def load(path: str | os.PathLike) -> Trace:
    """Read and check a trace file. Raises TraceError naming the file, the field and what was expected."""
    return FILE_FORMAT.read(path)


def from_dict(data: Any, source: str = "trace") -> Trace:
    """A trace from its parsed JSON, checked like a file (`source` names it in messages)."""
    return FILE_FORMAT.parse(data, source)


# -- the file's schema ----------------------------------------------------------------------------------

# The most positions (prompt tokens, cache slots) a trace may claim. 2**22 = 4,194,304 is four times the
# longest context of the open models kvviz runs; the cache map of a run that long already takes
# 4 MiB per layer to draw, and a damaged file that claims 10**9 positions is refused here, before
# any array is sized by it.
MAX_POSITIONS = 2**22
MAX_MS = 86_400_000.0  # one day: no single step or layer takes longer

_BYTES = Int(0, MAX_BYTES, what="a byte count")
_BYTES_OR_UNKNOWN = Int(0, MAX_BYTES, null=True, what="a byte count")
_POSITIONS = Int(0, MAX_POSITIONS, what="a number of positions")
_MS = Number(0, MAX_MS, what="a time in ms")
_MS_OR_UNKNOWN = Number(0, MAX_MS, null=True, what="a time in ms")
_OPTIONS = MapOf(Json(depth=1))
_SPAN = Pair(Int(0, max(SlotState)), _POSITIONS, what="span [slot state 0-6, count >= 0]")
_HEAD_SPAN = Pair(Int(0, 2**16), _POSITIONS, what="head span [KV heads holding the positions, count >= 0]")

_LAYER = Record(
    {
        "keys_bytes": _BYTES,
        "values_bytes": _BYTES,
        "seq_len": _POSITIONS,
        "capacity": _POSITIONS,
        "layer_ms": optional(_MS_OR_UNKNOWN),
        "storage": optional(MapOf(_BYTES, keys=STORAGE_KINDS), {}),
        "spans": optional(ListOf(_SPAN), []),
        "head_spans": optional(ListOf(_HEAD_SPAN, null=True)),
    },
    what="a layer record (an object)",
)

MODEL_CARD = Record(  # also the card of other formats' files (kvviz-eval)
    {
        "name": optional(Text(), ""),
        "architecture": maybe(Text(null=True)),
        "model_type": maybe(Text(null=True)),
        "parameters": maybe(Int(0, null=True)),
        "num_layers": maybe(Int(0, null=True)),
        "num_attention_heads": maybe(Int(0, null=True)),
        "num_kv_heads": maybe(Int(0, null=True)),
        "head_dim": maybe(Int(0, null=True)),
        "layer_types": maybe(ListOf(Text(), null=True)),
        "sliding_window": maybe(Int(0, null=True)),
        "dtype": maybe(Text(null=True)),
        "device": maybe(Text(null=True)),
        "kv_bytes_per_token": maybe(Int(0, MAX_BYTES, null=True)),
        "max_position_embeddings": maybe(Int(0, null=True)),
    },
    extra=Json(depth=2),
    what="a model card (an object)",
)

STRATEGY = Record(
    {"name": Text(nonempty=True), "options": optional(_OPTIONS, {})},
    what="an object with the strategy's name and options",
)

_SWITCH = Record(
    {"step": Int(0), "from_strategy": Text(), "to_strategy": Text(), "options": optional(_OPTIONS, {})},
    what="a switch record (an object with step, from_strategy, to_strategy, options)",
)


def _step_adds_up(step: dict, where) -> None:
    layers = step["layers"]
    for j, layer in enumerate(layers):
        total = layer["keys_bytes"] + layer["values_bytes"]
        if layer["storage"] and sum(layer["storage"].values()) != total:
            raise Refusal(
                at(where, "layers", j, "storage"),
                f"byte counts by kind that add up to keys_bytes + values_bytes ({total:,})",
                sum(layer["storage"].values()),
            )
        if layer["seq_len"] > layer["capacity"]:
            raise Refusal(
                at(where, "layers", j, "seq_len"),
                f"at most the layer's capacity ({layer['capacity']:,} slots)",
                layer["seq_len"],
            )
    if step["cache_bytes"] is not None:
        total = sum(layer["keys_bytes"] + layer["values_bytes"] for layer in layers)
        if step["cache_bytes"] != total:
            raise Refusal(
                at(where, "cache_bytes"),
                f"the sum of the layers' keys_bytes + values_bytes ({total:,})",
                step["cache_bytes"],
            )
    if step["kl"] is not None and step["top1_agree"] is None:
        raise Refusal(at(where, "top1_agree"), "true or false (the step has a reference KL)", None)


_STEP = Record(
    {
        "index": Int(0),
        "phase": Text(("prefill", "decode")),
        "token_id": Int(-1, null=True, what="a token id (-1 or null: unknown)"),  # -1: what older kvviz wrote
        "token": Text(),
        "wall_ms": _MS,
        "cache_bytes": _BYTES_OR_UNKNOWN,
        "predicted_cache_bytes": _BYTES_OR_UNKNOWN,
        "rss_bytes": _BYTES_OR_UNKNOWN,
        "strategy": optional(Text(nonempty=True, null=True)),  # absent: the trace's strategy
        "layers": ListOf(_LAYER),
        "cuda_bytes": optional(_BYTES_OR_UNKNOWN),
        "position": optional(Int(0), 0),
        "kl": optional(Number(0, null=True, what="a KL divergence in nats")),
        "top1_agree": optional(Flag(null=True)),
        "ref_logprob": optional(Number(max=0, null=True, what="a log-probability")),
        "reference_ms": optional(_MS_OR_UNKNOWN),
        "scoring_ms": optional(_MS_OR_UNKNOWN),
        # a share of a softmax's mass: 1 give or take float rounding
        "attention_sink": optional(ListOf(Number(0, 1.001, what="a share of attention"), null=True)),
    },
    rules=(_step_adds_up,),
    what="a step record (an object)",
)


def _steps_in_order(trace: dict, where) -> None:
    """Steps numbered 0, 1, ... with positions that only grow, each layer's positions within the run's."""
    prompt = trace["prompt_tokens"]
    width = None
    previous = 0
    for i, step in enumerate(trace["steps"]):
        here = at(where, "steps", i)
        if step["index"] != i:
            raise Refusal(at(here, "index"), f"{i} (steps are numbered 0, 1, 2, ... in order)", step["index"])
        seen = prompt + i  # tokens the model had been fed when this step was measured
        if step["position"] > seen or step["position"] < previous:
            raise Refusal(
                at(here, "position"),
                f"a position from {previous:,} to prompt_tokens + index ({seen:,})",
                step["position"],
            )
        previous = step["position"]
        if width is not None and len(step["layers"]) != width:
            raise Refusal(at(here, "layers"), f"{width} layer records, as in the steps before", step["layers"])
        width = len(step["layers"])
        for j, layer in enumerate(step["layers"]):
            _layer_within(layer, seen, at(here, "layers", j))


def _layer_within(layer: dict, seen: int, where) -> None:
    if layer["seq_len"] > seen:
        raise Refusal(at(where, "seq_len"), f"at most the {seen:,} tokens fed so far", layer["seq_len"])
    held = preallocated = 0
    for state, count in layer["spans"]:
        if state == SlotState.PREALLOCATED:
            preallocated += count
        else:
            held += count
    if held > seen:
        raise Refusal(
            at(where, "spans"),
            f"spans covering at most the {seen:,} positions fed so far (they cover {held:,})",
            show_found=False,
        )
    if preallocated > layer["capacity"]:
        raise Refusal(
            at(where, "spans"),
            f"at most capacity ({layer['capacity']:,}) preallocated slots (there are {preallocated:,})",
            show_found=False,
        )
    per_head = sum(count for _, count in layer["head_spans"] or ())
    if per_head > seen:
        raise Refusal(
            at(where, "head_spans"),
            f"head spans covering at most the {seen:,} positions fed so far (they cover {per_head:,})",
            show_found=False,
        )


def _pieces_match_prompt(trace: dict, where) -> None:
    pieces = trace["prompt_pieces"]
    if pieces and len(pieces) != trace["prompt_tokens"]:
        raise Refusal(
            at(where, "prompt_pieces"),
            f"one text per prompt token ({trace['prompt_tokens']:,}) or none (there are {len(pieces):,})",
            show_found=False,
        )


def _switches_in_order(trace: dict, where) -> None:
    last = 0
    for i, switch in enumerate(trace["switches"]):
        if not last <= switch["step"] <= len(trace["steps"]):
            raise Refusal(
                at(where, "switches", i, "step"),
                f"a step from {last} to the number of steps ({len(trace['steps'])}), in order",
                switch["step"],
            )
        last = switch["step"]


_TRACE = Record(
    {
        "model": MODEL_CARD,
        "strategy": STRATEGY,
        "prompt": optional(Text(), ""),
        "prompt_tokens": _POSITIONS,
        "prompt_pieces": optional(ListOf(Text()), []),
        "settings": optional(MapOf(Json(depth=1)), {}),
        "cancelled": optional(Flag(), False),
        "compile_ms": optional(_MS_OR_UNKNOWN),
        "warm_up_ms": optional(_MS_OR_UNKNOWN),
        "error": optional(Text(null=True)),
        # the memory-bound floor's inputs
        "weight_bytes": optional(_BYTES_OR_UNKNOWN),
        "bandwidth_bytes_per_s": optional(Number(0, null=True, what="bytes per second")),
        "switches": optional(ListOf(_SWITCH), []),
        "steps": ListOf(_STEP),
        "summary": optional(Json(depth=3)),  # derived again from the steps on load
    },
    rules=(_steps_in_order, _switches_in_order, _pieces_match_prompt),
)


def _build(data: dict) -> Trace:
    name = data["strategy"]["name"]
    steps = []
    for raw in data["steps"]:
        step = dict(raw, layers=[LayerRecord(**layer) for layer in raw["layers"]])
        step["strategy"] = step["strategy"] or name
        if step["token_id"] == -1:
            step["token_id"] = None
        steps.append(StepRecord(**step))
    return Trace(
        model=data["model"],
        strategy={"name": name, "options": data["strategy"]["options"]},
        prompt=data["prompt"],
        prompt_tokens=data["prompt_tokens"],
        prompt_pieces=data["prompt_pieces"],
        settings=data["settings"],
        steps=steps,
        switches=[Switch(**s) for s in data["switches"]],
        cancelled=data["cancelled"],
        compile_ms=data["compile_ms"],
        warm_up_ms=data["warm_up_ms"],
        error=data["error"],
        weight_bytes=data["weight_bytes"],
        bandwidth_bytes_per_s=data["bandwidth_bytes_per_s"],
    )


FILE_FORMAT = FileFormat(
    name=FORMAT,
    version=VERSION,
    kind="kvviz trace",
    schema=_TRACE,
    build=_build,
    error=TraceError,
    hints={"kvviz-attach": " (it is a server session: open it in the window or with `kvviz attach FILE`)"},
)
