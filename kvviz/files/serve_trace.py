"""A serving run kept as a file: many requests through transformers' continuous batching and its paged cache.

Plain data (stdlib): `kvviz.engine.serve` fills these records as it serves; `kvviz serve --trace`, `kvviz trace` and
the window read them. A serve trace is JSON:

    {"format": "kvviz-serve", "version": 1, "model": {...}, "settings": {...},
     "pool": {"blocks", "pool_bytes", "max_batch_tokens", "sized_from_memory", "groups": [{name, layers, page,
              bytes_per_block,
              blocks}]},
     "requests": [{id, prompt, prompt_tokens, arrival, submitted, token_times, tokens, text, preempted_at,
                   peak_blocks, prefix_tokens, finished}],
     "steps": [{started, ended, batch: [{request, tokens, decoding}], tables: {group: {request: [blocks]}},
                shared: {group: {block: requests}}, cached: {group: [blocks]}, waiting: [requests]}],
     "cancelled": bool, "error": str | null, "summary": {...}}

Times are seconds from the run's start. While it serves, the run is journaled beside the file it becomes
(`ServeJournal`, `kvviz.files.journal`): a killed serve keeps the steps and requests it measured, and its journal
opens (File ▸ Open, `kvviz trace`) as the run so far.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvviz.errors import OptionError
from kvviz.files.file_format import FileFormat
from kvviz.files.journal import Journal, ended_without_saving, journal_path
from kvviz.files.jsonfile import KeptFileError, write_json
from kvviz.files.schema import (
    MAX_BYTES,
    Flag,
    Int,
    Json,
    ListOf,
    MapOf,
    Number,
    Record,
    Refusal,
    Text,
    at,
    optional,
)
from kvviz.files.trace_schema import MAX_POSITIONS, MODEL_CARD

FORMAT = "kvviz-serve"
VERSION = 1
SCHEDULERS = ("fifo", "prefill_first")
MAX_S = 86_400.0 * 30  # a month: no serving run lasts longer
JOURNAL_S = 1.0  # the longest a serving run's journal waits for a line (what a kill loses)


@dataclass
class ServeSettings:
    max_new_tokens: int = 64
    page_size: int | None = None  # tokens per block; None: transformers' default
    blocks: int | None = None  # the pool's blocks; None: sized from free memory, as transformers sizes it
    max_batch_tokens: int | None = None  # query tokens per step; None: transformers' choice
    concurrency: int | None = None  # requests per batch; None: transformers' choice
    scheduler: str = "fifo"
    prefix_sharing: bool = True
    rate: float | None = None  # requests per second, Poisson-spaced; None: all at once
    seed: int = 0

    def check(self) -> None:
        for name in ("max_new_tokens", "page_size", "blocks", "max_batch_tokens", "concurrency"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionError(f"{name.replace('_', ' ')} must be at least 1, got {value}")
        if self.page_size is not None and self.page_size < 4:
            raise OptionError(f"the page size must be at least 4 tokens (transformers' least), got {self.page_size}")
        if self.scheduler not in SCHEDULERS:
            raise OptionError(f"unknown scheduler {self.scheduler!r}: give {' or '.join(SCHEDULERS)}")
        if self.rate is not None and not self.rate > 0:
            raise OptionError(f"the rate must be above 0 requests per second, got {self.rate}")

    def arrivals(self, n: int) -> list[float]:
        """Seconds after the start at which each of `n` requests arrives: at once, or with exponential gaps."""
        if self.rate is None:
            return [0.0] * n
        draw, at_s, times = random.Random(self.seed), 0.0, []
        for _ in range(n):
            times.append(at_s)
            at_s += draw.expovariate(self.rate)
        return times


@dataclass(frozen=True)
class Group:
    """One allocator's layers: a block holds `page` tokens of each of its layers' keys and values."""

    name: str  # "full_attention", "sliding_attention"
    layers: int
    page: int
    bytes_per_block: int
    blocks: int  # the pool's blocks for this group
    first_block: int = 0  # the id of its first block (transformers keeps the pool's first sectors for padding)


@dataclass
class PoolState:
    """The pool at one step, after the scheduler allocated the step's blocks."""

    tables: dict[str, dict[str, list[int]]]  # per group: request id -> the blocks it holds, in order
    shared: dict[str, dict[str, int]]  # per group: block (as text, a JSON name) -> requests holding it (two or more)
    cached: dict[str, list[int]]  # per group: complete blocks no request holds, kept for a later prefix

    def held(self, group: str) -> int:
        """Blocks of `group` some request holds (a shared block once)."""
        return len({block for blocks in self.tables.get(group, {}).values() for block in blocks})


@dataclass
class ServedRequest:
    """One request as served; times in seconds from the run's start."""

    id: str
    prompt: str
    prompt_tokens: int
    arrival: float
    submitted: float | None = None
    token_times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    preempted_at: list[float] = field(default_factory=list)  # when the scheduler preempted it (soft reset or offload)
    peak_blocks: int = 0  # the most blocks it held at once, every group counted
    prefix_tokens: int = 0  # of its prompt, found in blocks already in the pool (not computed again)
    finished: bool = False

    @property
    def preemptions(self) -> int:
        return len(self.preempted_at)

    @property
    def ttft_ms(self) -> float | None:
        if self.submitted is None or not self.token_times:
            return None
        return (self.token_times[0] - self.submitted) * 1000.0

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first; None for a single token."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1) * 1000.0


@dataclass
class ServeStep:
    """One forward of the batch."""

    started: float
    ended: float | None
    batch: list[tuple[str, int, bool]]  # (request, query tokens, decoding)
    pool: PoolState
    waiting: list[str]

    @property
    def prefill_tokens(self) -> int:
        return sum(tokens for _, tokens, decoding in self.batch if not decoding)

    @property
    def decode_tokens(self) -> int:
        return sum(tokens for _, tokens, decoding in self.batch if decoding)


@dataclass
class ServeRun:
    model: dict[str, Any]
    settings: ServeSettings
    groups: list[Group]
    pool_blocks: int  # the pool's size in blocks of every layer (each group's blocks hold its layers alone)
    pool_bytes: int
    max_batch_tokens: int
    requests: list[ServedRequest]
    steps: list[ServeStep] = field(default_factory=list)
    sized_from_memory: bool = False  # the pool's blocks were transformers' choice from free memory
    cancelled: bool = False  # stopped (Ctrl-C, SIGTERM, Stop) before every request finished
    error: str | None = None

    @property
    def page_size(self) -> int:
        return self.groups[0].page

    @property
    def blocks(self) -> int:
        return self.pool_blocks

    @property
    def bytes_per_block(self) -> int:
        """Every group's block together: what a request's block of positions costs across all layers."""
        return sum(group.bytes_per_block for group in self.groups)

    def step_bytes(self, step: ServeStep) -> int:
        return sum(step.pool.held(group.name) * group.bytes_per_block for group in self.groups)

    @property
    def peak_blocks(self) -> int:
        """The most blocks held at once (a block shared by several requests once), every group counted."""
        return max((sum(step.pool.held(g.name) for g in self.groups) for step in self.steps), default=0)

    @property
    def peak_bytes(self) -> int:
        return max((self.step_bytes(step) for step in self.steps), default=0)

    @property
    def reused_blocks(self) -> int:
        """Blocks a request took from the pool by a prefix match instead of computing them again."""
        return sum(r.prefix_tokens // g.page for r in self.requests for g in self.groups)

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(len(r.token_times) for r in self.requests)

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens over the time from the first request's submission to the last token."""
        times = [t for r in self.requests for t in r.token_times]
        submitted = [r.submitted for r in self.requests if r.submitted is not None]
        if not times or not submitted or max(times) <= min(submitted):
            return None
        return len(times) / (max(times) - min(submitted))

    def summary(self) -> dict[str, Any]:
        return {"requests": len(self.requests), "finished": sum(r.finished for r in self.requests),
                "steps": len(self.steps), "output_tokens": self.output_tokens, "peak_blocks": self.peak_blocks,
                "peak_bytes": self.peak_bytes, "reused_blocks": self.reused_blocks,
                "preemptions": self.preemptions, "tokens_per_s": self.tokens_per_s}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "model": self.model, "settings": asdict(self.settings),
            "pool": self._pool_dict(), "requests": [asdict(r) for r in list(self.requests)],
            "steps": [_step_dict(s) for s in list(self.steps)], "cancelled": self.cancelled, "error": self.error,
            "summary": self.summary(),
        }

    def _pool_dict(self) -> dict[str, Any]:
        return {"blocks": self.pool_blocks, "pool_bytes": self.pool_bytes, "max_batch_tokens": self.max_batch_tokens,
                "sized_from_memory": self.sized_from_memory, "groups": [asdict(g) for g in self.groups]}

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically and completely, even when Ctrl-C comes during the save (`kvviz.files.jsonfile`)."""
        return write_json(path, self.to_dict)


PHASES = ("waiting", "prefill", "decode", "preempted")


def phases(run: ServeRun) -> dict[str, list[tuple[str, float, float]]]:
    """Each request's spans over the run, (phase, start s, end s), from the steps: waiting from its submission to its
    first step; prefill and decode where a step fed it (a request the scheduler held back a step, its blocks kept,
    stays in the phase it was in); preempted from a preemption, while it waits, to the step that feeds it again. A span
    ends where the next step starts (the last, where it ended); a finished request has no span after its last token."""
    steps = list(run.steps)
    ends = [s.started for s in steps[1:]] + [steps[-1].ended or steps[-1].started] if steps else []
    spans: dict[str, list[tuple[str, float, float]]] = {r.id: [] for r in run.requests}
    for request in run.requests:
        if request.submitted is None:
            continue
        done = request.token_times[-1] if request.finished and request.token_times else None
        preemptions = sorted(request.preempted_at)
        phase, since, preempted = "waiting", request.submitted, False
        for step, end in zip(steps, ends, strict=True):
            while preemptions and preemptions[0] <= step.started:
                preemptions.pop(0)
                preempted = True
            if end <= request.submitted or (done is not None and step.started >= done):
                continue
            fed = next((decoding for rid, _, decoding in step.batch if rid == request.id), None)
            if fed is not None:
                now, preempted = ("decode" if fed else "prefill"), False
            elif request.id in step.waiting:
                now = "preempted" if preempted else "waiting"
            else:
                now = phase
            if now != phase:
                if step.started > since:
                    spans[request.id].append((phase, since, step.started))
                phase, since = now, max(step.started, since)
        last = done if done is not None else (ends[-1] if ends else since)
        if last > since:
            spans[request.id].append((phase, since, last))
    return spans


def _step_dict(step: ServeStep) -> dict[str, Any]:
    return {"started": step.started, "ended": step.ended,
            "batch": [{"request": r, "tokens": tokens, "decoding": decoding} for r, tokens, decoding in step.batch],
            **asdict(step.pool), "waiting": list(step.waiting)}


class ServeJournal:
    """A serving run kept as it goes (`kvviz.files.journal`), beside the file it becomes: `update()` at its start
    and end, `step()` after each step (a line at most every JOURNAL_S), `remove()` once the file is written. The header
    is the run's model, settings and pool; each line holds the steps since the last line (``{"from": steps before}``)
    and every request as it stands."""

    def __init__(self, path: str | os.PathLike, run: ServeRun):
        self.path = Path(path)
        self.run = run
        self.journal = Journal(journal_path(self.path), FORMAT)
        self._written = 0
        self._updated = 0.0

    def step(self) -> None:
        """After a step (on the manager's thread): a line, unless one was written less than JOURNAL_S ago."""
        if time.monotonic() - self._updated >= JOURNAL_S:
            self.update()

    def update(self) -> None:
        self._updated = time.monotonic()
        steps = list(self.run.steps)
        line = {"from": self._written, "steps": [_step_dict(s) for s in steps[self._written:]],
                "requests": [asdict(r) for r in self.run.requests]}
        self._written = len(steps)
        if not self.journal.started:
            self.journal.start({"format": FORMAT, "version": VERSION, "model": self.run.model,
                                "settings": asdict(self.run.settings), "pool": self.run._pool_dict()}, [line])
        else:
            self.journal.extend([line])

    def remove(self) -> None:
        self.journal.remove()


def _from_journal(header: dict, lines: list, source: str) -> ServeRun:
    """The run a killed serve's journal holds: its steps, and its requests as the last line had them."""
    data: dict[str, Any] = {key: header.get(key) for key in ("format", "version", "model", "settings", "pool")}
    data.update(steps=[], requests=[])
    for number, line in enumerate(lines, start=2):
        if not isinstance(line, dict) or line.get("from") != len(data["steps"]) \
                or not isinstance(line.get("steps"), list) or not isinstance(line.get("requests"), list):
            raise ServeFileError(f"{source}: line {number:,} of the journal is not the steps that follow line "
                                 f"{number - 1:,} (an object with from, steps and requests)")
        data["steps"] += line["steps"]
        data["requests"] = line["requests"]
    done = sum(1 for r in data["requests"] if isinstance(r, dict) and r.get("finished"))
    data.update(cancelled=True, error=ended_without_saving(done, len(data["requests"]), "request"))
    return FILE_FORMAT.parse(data, source)


class ServeFileError(KeptFileError):
    """A file is not a readable kvviz serve trace; the message says what is wrong and where."""


_SECONDS = Number(0, MAX_S, what="seconds from the run's start")
_COUNT = Int(0, MAX_POSITIONS, what="a number of tokens")
_BLOCKS = Int(0, MAX_BYTES, what="a number of blocks")
_OPTIONAL_COUNT = Int(1, MAX_POSITIONS, null=True, what="a number (null: transformers' choice)")

_SETTINGS = Record({
    "max_new_tokens": Int(1, MAX_POSITIONS, what="a number of tokens"), "page_size": _OPTIONAL_COUNT,
    "blocks": Int(1, MAX_BYTES, null=True, what="a number of blocks (null: sized from memory)"),
    "max_batch_tokens": _OPTIONAL_COUNT, "concurrency": _OPTIONAL_COUNT, "scheduler": Text(SCHEDULERS),
    "prefix_sharing": Flag(), "rate": Number(0, null=True, what="requests per second (null: all at once)"),
    "seed": Int(0, what="a seed"),
}, what="the serving settings (an object)")

_GROUP = Record({"name": Text(nonempty=True), "layers": Int(1, MAX_POSITIONS), "page": Int(1, MAX_POSITIONS),
                 "bytes_per_block": Int(1, MAX_BYTES), "blocks": _BLOCKS, "first_block": optional(_BLOCKS, 0)},
                what="a group of layers (an object)")

_POOL = Record({"blocks": _BLOCKS, "pool_bytes": Int(0, MAX_BYTES, what="a byte count"),
                "max_batch_tokens": Int(1, MAX_POSITIONS), "sized_from_memory": Flag(), "groups": ListOf(_GROUP)},
               what="the pool (an object)")


def _times_in_order(request: dict, where) -> None:
    times = request["token_times"]
    if any(later < earlier for earlier, later in zip(times, times[1:], strict=False)):
        raise Refusal(at(where, "token_times"), "times in order", times)
    if request["finished"] and len(times) != len(request["tokens"]):
        raise Refusal(at(where, "tokens"), f"a token for each of its {len(times):,} token times",
                      len(request["tokens"]))


_REQUEST = Record({
    "id": Text(nonempty=True), "prompt": Text(), "prompt_tokens": _COUNT, "arrival": _SECONDS,
    "submitted": Number(0, MAX_S, null=True, what="seconds from the run's start (null: not sent)"),
    "token_times": ListOf(_SECONDS), "tokens": ListOf(Int(0, what="a token id")), "text": Text(),
    "preempted_at": ListOf(_SECONDS), "peak_blocks": _BLOCKS, "prefix_tokens": _COUNT, "finished": Flag(),
}, rules=(_times_in_order,), what="a request (an object)")

_BLOCK_LIST = ListOf(Int(0, MAX_BYTES, what="a block"))
_BATCH_ITEM = Record({"request": Text(nonempty=True), "tokens": Int(1, MAX_POSITIONS, what="query tokens"),
                      "decoding": Flag()}, what="a request of the batch (an object with request, tokens, decoding)")
_STEP = Record({
    "started": _SECONDS, "ended": Number(0, MAX_S, null=True, what="seconds (null: the forward did not end)"),
    "batch": ListOf(_BATCH_ITEM),
    "tables": MapOf(MapOf(_BLOCK_LIST)), "shared": MapOf(MapOf(Int(2, MAX_POSITIONS, what="requests"))),
    "cached": MapOf(_BLOCK_LIST), "waiting": ListOf(Text()),
}, what="a step (an object)")


def _steps_name_requests(data: dict, where) -> None:
    """Every request a step names is a request of the file; the pool has a group."""
    if not data["pool"]["groups"]:
        raise Refusal(at(where, "pool", "groups"), "at least one group of layers", [])
    ids = {r["id"] for r in data["requests"]}
    for i, step in enumerate(data["steps"]):
        named = [item["request"] for item in step["batch"]] + step["waiting"] + \
            [rid for tables in step["tables"].values() for rid in tables]
        unknown = sorted(set(named) - ids)
        if unknown:
            raise Refusal(at(where, "steps", i), f"requests of the file ({', '.join(sorted(ids)[:5])}...)",
                          unknown[0])


_SERVE = Record(
    {
        "model": MODEL_CARD,
        "settings": _SETTINGS,
        "pool": _POOL,
        "requests": ListOf(_REQUEST),
        "steps": ListOf(_STEP),
        "cancelled": optional(Flag(), False),
        "error": optional(Text(null=True)),
        "summary": optional(Json(depth=1)),  # what the records give: checked against them (`FileFormat.summary`)
    },
    rules=(_steps_name_requests,),
)


def _build(data: dict) -> ServeRun:
    pool = data["pool"]
    return ServeRun(
        model=data["model"], settings=ServeSettings(**data["settings"]), groups=[Group(**g) for g in pool["groups"]],
        pool_blocks=pool["blocks"], pool_bytes=pool["pool_bytes"], max_batch_tokens=pool["max_batch_tokens"],
        requests=[ServedRequest(**r) for r in data["requests"]],
        steps=[ServeStep(s["started"], s["ended"], [(b["request"], b["tokens"], b["decoding"]) for b in s["batch"]],
                         PoolState(s["tables"], s["shared"], s["cached"]), s["waiting"]) for s in data["steps"]],
        sized_from_memory=pool["sized_from_memory"], cancelled=data["cancelled"], error=data["error"],
    )


def load(path: str | os.PathLike) -> ServeRun:
    return FILE_FORMAT.read(path)


FILE_FORMAT = FileFormat(name=FORMAT, version=VERSION, kind="kvviz serve trace", schema=_SERVE, build=_build,
                         error=ServeFileError, summary=ServeRun.summary, from_journal=_from_journal)
