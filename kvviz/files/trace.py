"""Records of a generation run and the trace file that keeps them.

Plain data only (stdlib + numpy): the engine produces these records, the window, the CLI and the
report consume them. Nothing here knows about torch or Qt. What a file may hold, field by field, is
declared in `kvviz.files.trace_schema`.

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

from kvviz.files.formats import file_format
from kvviz.files.journal import Journal, journal_path
from kvviz.files.jsonfile import KeptFileError, write_json

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
    STATE = 7  # folded into a layer's fixed-size state (a linear-attention or state-space layer holds no positions)
    SHARED = 8  # read from another layer's keys and values (a KV-shared layer keeps none of its own)


STORAGE_KINDS = ("full", "quantized", "residual", "indexer", "state", "cross")


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
    # Beside keys and values: an indexed-attention layer's indexer keys (growing with the tokens held), and a
    # linear-attention or state-space layer's convolution and recurrent states (fixed size), with their shapes
    indexer_bytes: int = 0
    state_bytes: int = 0
    state_shapes: list[list[int]] | None = None
    # An encoder-decoder's cross-attention keys and values (of the encoder's output: fixed once the prompt is read)
    cross_bytes: int = 0
    cross_tokens: int = 0

    @property
    def total_bytes(self) -> int:
        return self.keys_bytes + self.values_bytes + self.indexer_bytes + self.state_bytes + self.cross_bytes

    @property
    def fixed_bytes(self) -> int:
        """What does not grow with the tokens generated: a fixed-size state, cross-attention keys and values."""
        return self.state_bytes + self.cross_bytes


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
    # What the cache's policy keeps beside keys and values (positions, scores), measured and predicted like
    # cache_bytes; 0 for a cache without a policy of its own, None where not known (files from before they were)
    policy_bytes: int | None = None
    predicted_policy_bytes: int | None = None
    # The attention view (None unless asked for): per layer, the share of the current token's attention, averaged
    # over query heads, that lands on the first ATTENTION_SINK_POSITIONS positions...
    attention_sink: list[float] | None = None
    # ... and that attention itself, [layers, positions 0..position-1] (numpy float32, evicted positions 0): kept
    # in memory for the live view, not written to trace files.
    attention: Any = field(default=None, repr=False, compare=False, metadata={"saved": False})
    # Per pinned span of the trace (`Trace.pins`), per layer, per KV head: how many of the span's tokens the cache
    # still holds after this step (None for a layer that holds no tokens); None when nothing is pinned
    pins_held: list[list[list[int] | None]] | None = None
    # The prefill's allocations, counted (None at decode steps and where not counted): the most it held at once beside
    # what was allocated before it (activations, logits, the cache it built), and [ms since it began, bytes then],
    # thinned to a few hundred points that keep the peak
    peak_allocated_bytes: int | None = None
    allocations: list[list[float]] | None = None


_NOT_SAVED = {f.name for f in fields(StepRecord) if not f.metadata.get("saved", True)}


@dataclass
class Pin:
    """A span of the prompt being watched (a task's needle, a span the user chose): its tokens [start, end)."""

    start: int
    end: int
    label: str = ""

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Holding:
    """How many layer-heads hold all of a span's tokens, of the layers that hold tokens x their KV heads."""

    held: int
    layers: int
    heads: int  # KV heads per layer

    @property
    def layer_heads(self) -> int:
        return self.layers * self.heads

    def text(self) -> str:
        """ "held in 12 of 30 x 3 layer-heads" """
        return f"held in {self.held} of {self.layers} x {self.heads} layer-heads"


def heads_holding(counts: list[list[int] | None], size: int) -> Holding:
    """From per-layer, per-KV-head counts of a span's tokens held (`StepRecord.pins_held`, one pin's): the
    layer-heads holding all `size` of them, of the layers that hold tokens x their KV heads."""
    layers = [layer for layer in counts if layer is not None]
    held = sum(1 for layer in layers for count in layer if count >= size)
    return Holding(held, len(layers), max((len(layer) for layer in layers), default=0))


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
    pins: list[Pin] = field(default_factory=list)  # spans of the prompt whose tokens each step says are held or not

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
        held = self.steps[-1].pins_held if self.steps else None
        if self.pins and held:
            summary["pins"] = [{**asdict(pin), **asdict(heads_holding(counts, pin.size))}
                               for pin, counts in zip(self.pins, held, strict=True)]
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
            "pins": [asdict(pin) for pin in self.pins],
            "steps": [step_dict(s) for s in self.steps],
            "summary": self.summary(),
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically and completely, even when Ctrl-C comes during the save (`kvviz.files.jsonfile`)."""
        return write_json(path, self.to_dict)


# what a trace's journal holds besides its header (the trace's own fields, less these)
JOURNALED = ("steps", "switches", "summary", "cancelled", "error")


class TraceJournal:
    """A run's trace kept as it is measured (`kvviz.files.journal`), beside the trace file it becomes: call
    `update()` after each step; `save()` writes the trace file and removes the journal. The journal's header is
    the trace's fields at its first step; each line is ``{"step": ...}`` or ``{"switch": ...}``."""

    def __init__(self, path: str | os.PathLike, trace: Trace):
        self.path = Path(path)
        self.trace = trace
        self.journal = Journal(journal_path(self.path), FORMAT)
        self._steps = self._switches = 0

    def update(self) -> None:
        """Append what the trace gained since the last call."""
        trace = self.trace
        lines = [{"switch": asdict(s)} for s in trace.switches[self._switches :]]
        lines += [{"step": step_dict(s)} for s in trace.steps[self._steps :]]
        if not lines:
            return
        self._steps, self._switches = len(trace.steps), len(trace.switches)
        if not self.journal.started:
            self.journal.start({key: value for key, value in trace.to_dict().items() if key not in JOURNALED}, lines)
        else:
            self.journal.extend(lines)

    def save(self) -> Path:
        """The trace file, written whole; then the journal goes. Raises OSError (the journal stays)."""
        saved = self.trace.save(self.path)
        self.journal.remove()
        return saved


def step_dict(step: StepRecord) -> dict[str, Any]:
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
        # the most the prefill allocated at once beside what was there before it (None: not counted)
        "prefill_peak_bytes": next((s.peak_allocated_bytes for s in steps if s.phase == "prefill"), None),
        "decode_ms_mean": mean,
        "decode_ms_p95": float(np.percentile(decode_ms, 95)) if decode_ms.size else None,
        "decode_tokens_per_s": 1000.0 / mean if mean else None,
        # None where no step measured it (a served request's steps carry no cache or RSS bytes)
        "peak_cache_bytes": max((s.cache_bytes for s in steps if s.cache_bytes is not None), default=None),
        "final_cache_bytes": steps[-1].cache_bytes if steps else None,
        "peak_rss_bytes": max((s.rss_bytes for s in steps if s.rss_bytes is not None), default=None),
        "peak_policy_bytes": max((s.policy_bytes for s in steps if s.policy_bytes is not None), default=None),
        "final_policy_bytes": steps[-1].policy_bytes if steps else None,
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
    return file_format(FORMAT).read(path)


def from_dict(data: Any, source: str = "trace") -> Trace:
    """A trace from its parsed JSON, checked like a file (`source` names it in messages)."""
    return file_format(FORMAT).parse(data, source)
