"""Teacher-forced evaluations of cache strategies along a document, and the files that keep them.

Plain data only (stdlib + numpy): the engine (`kvviz.engine.evaluate`) produces these records, the
command line and the window consume them. Nothing here knows about torch or Qt.

An evaluation file holds one strategy's run over one document, as JSON:

    {"format": "kvviz-eval", "version": 1, "model": {...}, "strategy": {"name", "options"},
     "document": {"name", "source", "title", "author", "tokens", "first_token_id", "cut"},
     "method": {"mode": "token-by-token", "chunked" or "batched", "chunk": int, "rows": int (batched),
                "prompt": int (tokens fed first in one forward, as a prompt; absent: none),
                "shared": int (batched: its first predictions, those of a cache that held the same tokens then,
                               read in the same batch; absent: none)},
     "cancelled": bool, "error": str or null, "first_eviction": int or null,
     "records": {"position": [...], "token_id": [...], "nll": [...], "cache_bytes": [...],
                 "predicted_cache_bytes": [...], "tokens_held": [...], "wall_ms": [...],
                 "policy_bytes": [...] (absent in files written before kvviz measured it)},
     "summary": {...}}

`records` is a table of columns of equal length, one entry per prediction: the document token at
`position` was fed through the cache and the model predicted the next one, `token_id`, with
negative log-likelihood `nll` (natural log). A summary that disagrees with the records is refused on load.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvviz.files.file_format import FileFormat
from kvviz.files.journal import Journal, ended_without_saving, journal_path, read_journal_of
from kvviz.files.jsonfile import KeptFileError, write_json
from kvviz.files.schema import (
    MAX_BYTES,
    Flag,
    Int,
    Json,
    ListOf,
    Number,
    Record,
    Refusal,
    Text,
    at,
    maybe,
    optional,
)
from kvviz.files.trace_schema import MAX_MS, MAX_POSITIONS, MODEL_CARD, STRATEGY
from kvviz.present import strategy_label

FORMAT = "kvviz-eval"
VERSION = 1
MODES = ("token-by-token", "chunked", "batched")  # batched: token by token, one batch row among `rows`
QUARTERS = 4


@dataclass
class TokenRecord:
    """One prediction: the token at `position` was fed, and `token_id` (at position + 1) was scored."""

    position: int
    token_id: int
    nll: float  # -ln p(token_id | what the cache held), from a float32 log-softmax
    cache_bytes: int | None  # measured after the feed; None inside a chunk of a chunked evaluation
    predicted_cache_bytes: int | None  # what the strategy's size rule says, likewise
    tokens_held: int | None  # the most tokens any layer held after the feed, likewise
    wall_ms: float  # the forward and log-softmax of this prediction (a chunk's or a batch's time shared by the
    # predictions it made)
    policy_bytes: int | None = None  # what the cache's policy keeps beside keys and values, measured like cache_bytes


COLUMNS = ("position", "token_id", "nll", "cache_bytes", "predicted_cache_bytes", "tokens_held", "wall_ms",
           "policy_bytes")


@dataclass
class EvalRun:
    """One strategy's evaluation over one document (possibly partial: cancelled or failed)."""

    model: dict[str, Any]  # the model card
    strategy: dict[str, Any]  # {"name": str, "options": dict}
    document: dict[str, Any]  # name, source, title, author, tokens, first_token_id, cut
    method: dict[str, Any]  # {"mode": one of MODES, "chunk": most tokens per forward, "rows": strategies per forward}
    records: list[TokenRecord] = field(default_factory=list)
    cancelled: bool = False
    error: str | None = None
    # the first position predicted after the cache had dropped a token (None: it never did)
    first_eviction: int | None = None

    def label(self) -> str:
        return strategy_label(self.strategy)

    @property
    def status(self) -> str:
        # stopped before its end is "cancelled" even with an error: the reason (a journal: the process ended)
        return "cancelled" if self.cancelled else "error" if self.error else "finished"

    def column(self, name: str) -> np.ndarray:
        """One column of the records as floats (None becomes NaN, for plotting)."""
        return np.array([np.nan if v is None else v for v in (getattr(r, name) for r in self.records)], dtype=float)

    def summary(self) -> dict[str, Any]:
        return summarize(self.records, self.first_eviction)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "strategy": self.strategy,
            "document": self.document,
            "method": self.method,
            "cancelled": self.cancelled,
            "error": self.error,
            "first_eviction": self.first_eviction,
            "records": {name: [getattr(r, name) for r in self.records] for name in COLUMNS},
            "summary": self.summary(),
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically and completely, even when Ctrl-C comes during the save (`kvviz.files.jsonfile`)."""
        return write_json(path, self.to_dict)


# -- the journal of an evaluation while it runs -------------------------------------------------------

class EvalJournal:
    """One strategy's evaluation kept as it is measured (`kvviz.files.journal`), beside the file it becomes:
    `update()` after records arrive (with `end=True` once the strategy is over: fsynced), `save()` writes the file,
    `remove()` the journal once every file of the evaluation is written.

    The header is the run's fields when its first record arrives (its method is known by then) and `resume`:
    what `kvviz eval --resume` checks before it continues (the token ids' hash, the settings, the strategies).
    Each line is a record (a list of its COLUMNS), ``{"first_eviction": position}`` or, last,
    ``{"end": status, "error": text or null}``."""

    def __init__(self, path: str | os.PathLike, run: EvalRun, resume: dict[str, Any]):
        self.path = Path(path)
        self.run = run
        self.resume = resume
        self.journal = Journal(journal_path(self.path), FORMAT)
        self._written = 0
        self._first_eviction: int | None = None
        self.ended = False

    def update(self, end: bool = False) -> None:
        """Append the records that arrived since the last call (and with `end`, the run's end)."""
        run = self.run
        lines: list[Any] = []
        if run.first_eviction != self._first_eviction:
            self._first_eviction = run.first_eviction
            lines.append({"first_eviction": run.first_eviction})
        lines += [[getattr(r, name) for name in COLUMNS] for r in run.records[self._written :]]
        self._written = len(run.records)
        if end:
            lines.append({"end": run.status, "error": run.error})
            self.ended = True
        if not lines:
            return
        if not self.journal.started:  # (not to_dict: its summary reads every record)
            self.journal.start({"format": FORMAT, "version": VERSION, "model": run.model, "strategy": run.strategy,
                                "document": run.document, "method": run.method, "resume": self.resume}, lines)
        else:
            self.journal.extend(lines)
        if end:
            self.journal.sync()

    def save(self) -> Path:
        """The evaluation file, written whole. Raises OSError. The journal stays until `remove`."""
        return self.run.save(self.path)

    def remove(self) -> None:
        """The files are written: the journal goes."""
        self.journal.remove()


@dataclass
class Journaled:
    """What an evaluation's journal holds: the run so far, what a resume checks, and how it ended (None: it did
    not; else the status its last line gives)."""

    run: EvalRun
    resume: dict[str, Any]
    ended: str | None


def read_journal(path: str | os.PathLike) -> Journaled:
    """An evaluation's journal, checked like an evaluation file. Raises EvalFileError naming what is wrong."""
    header, lines = read_journal_of(path, FORMAT, "an evaluation", EvalFileError)
    return _journaled(header, lines, str(path))


def _journaled(header: dict, lines: list, source: str) -> Journaled:
    rows, first_eviction, end = [], None, None
    for number, line in enumerate(lines, start=2):
        if isinstance(line, list) and len(line) == len(COLUMNS):
            rows.append(line)
        elif isinstance(line, dict) and "first_eviction" in line:
            first_eviction = line["first_eviction"]
        elif isinstance(line, dict) and "end" in line:
            end = line
        else:
            raise EvalFileError(f"{source}: line {number:,} of the journal is not a record of {len(COLUMNS)} values, "
                                "a first eviction or an end")
    data = {key: value for key, value in header.items() if key != "resume"}
    data["records"] = {name: [row[i] for row in rows] for i, name in enumerate(COLUMNS)}
    data["first_eviction"] = first_eviction
    ended = end.get("end") if end else None
    if end is None:
        planned = header.get("document", {}).get("tokens") if isinstance(header.get("document"), dict) else None
        data.update(cancelled=True,
                    error=ended_without_saving(len(rows), planned - 1 if isinstance(planned, int) else None))
    else:
        data.update(cancelled=ended == "cancelled", error=end.get("error"))
    run = FILE_FORMAT.parse(data, source)
    resume = header.get("resume")
    return Journaled(run, resume if isinstance(resume, dict) else {}, ended if isinstance(ended, str) else None)


def token_count_problem(tokens: int | None) -> str | None:
    """Why `tokens` cannot be the number of document tokens to evaluate (None: the whole document), or None."""
    if tokens is not None and tokens < 2:
        return f"the token count must be at least 2 (the first token is only fed, the rest predicted), not {tokens}"
    return None


# -- the numbers a user compares strategies by ---------------------------------------------------------


def perplexity(nll: np.ndarray) -> float | None:
    """exp of the mean NLL (accumulated in float64); None for no tokens or beyond a float's range."""
    if nll.size == 0:
        return None
    mean = float(np.mean(nll, dtype=np.float64))
    return math.exp(mean) if mean < 700 else None


def quarter_bounds(n: int) -> list[tuple[int, int]]:
    """Record index ranges [start, end) of the document's quarters (fewer for under four records).

    The same for every strategy evaluated on the same tokens, so that their rows line up.
    """
    cuts = sorted({round(k * n / QUARTERS) for k in range(QUARTERS + 1)})
    return list(zip(cuts[:-1], cuts[1:], strict=False))


def summarize(records: list[TokenRecord], first_eviction: int | None = None) -> dict[str, Any]:
    nll = np.array([r.nll for r in records], dtype=np.float64)
    positions = np.array([r.position for r in records], dtype=np.int64)
    wall_ms = float(np.sum([r.wall_ms for r in records], dtype=np.float64))
    measured = [r for r in records if r.cache_bytes is not None]
    n = len(records)
    summary = {
        "tokens": n,
        "mean_nll": float(nll.mean()) if n else None,
        "perplexity": perplexity(nll),
        "second_half_perplexity": perplexity(nll[n // 2 :]),
        "quarters": [
            {"first": int(positions[a]), "last": int(positions[b - 1]), "perplexity": perplexity(nll[a:b])}
            for a, b in quarter_bounds(n)
        ],
        "first_eviction": first_eviction,
        "before_eviction_perplexity": None,
        "after_eviction_perplexity": None,
        "final_cache_bytes": measured[-1].cache_bytes if measured else None,
        "peak_cache_bytes": max(r.cache_bytes for r in measured) if measured else None,
        "final_tokens_held": measured[-1].tokens_held if measured else None,
        "final_policy_bytes": measured[-1].policy_bytes if measured else None,
        "peak_policy_bytes": max((r.policy_bytes for r in measured if r.policy_bytes is not None), default=None),
        "wall_s": wall_ms / 1000.0,
        "tokens_per_s": n / (wall_ms / 1000.0) if n and wall_ms > 0 else None,
    }
    if first_eviction is not None:
        before = positions < first_eviction
        summary["before_eviction_perplexity"] = perplexity(nll[before])
        summary["after_eviction_perplexity"] = perplexity(nll[~before])
    return summary


# -- progress while an evaluation runs -----------------------------------------------------------------


RECENT = 256  # predictions: the time of one lately (later ones cost more as a growing cache is read)


def ms_per_prediction(run: EvalRun) -> float | None:
    """The measured time of one prediction lately, over the last RECENT (a chunk's or a batch's time shared by
    its predictions), or None before the first. Records of a chunk arrive together: a clock started at the
    first would read millions of tokens a second."""
    if not run.records:
        return None
    return float(np.mean([r.wall_ms for r in run.records[-RECENT:]], dtype=np.float64))


def seconds_left(runs: list[tuple[EvalRun, int]]) -> tuple[float | None, bool]:
    """(seconds, complete) until the given evaluations, each with the number of predictions it makes in all,
    have ended: each at its own measured time per prediction, one not started yet at the mean of those of its
    kind (method mode) measured so far. `complete` is False when some kind has no measurement yet (the figure
    is then a lower bound); seconds is None when nothing has been measured."""
    by_mode: dict[str, list[float]] = {}
    for run, _ in runs:
        ms = ms_per_prediction(run)
        if ms is not None:
            by_mode.setdefault(run.method.get("mode"), []).append(ms)
    total_ms, complete = 0.0, True
    for run, predictions in runs:
        ms = ms_per_prediction(run)
        known = by_mode.get(run.method.get("mode"))
        if ms is None and known:
            ms = sum(known) / len(known)
        if ms is None:
            complete = False
            continue
        total_ms += max(predictions - len(run.records), 0) * ms
    return (total_ms / 1000.0 if by_mode else None), complete


# -- reading ------------------------------------------------------------------------------------------


class EvalFileError(KeptFileError):
    """A file is not a readable kvviz evaluation; the message names the file, the field and what was expected."""


def load(path: str | os.PathLike) -> EvalRun:
    return FILE_FORMAT.read(path)


def from_dict(data: Any, source: str = "evaluation") -> EvalRun:
    return FILE_FORMAT.parse(data, source)


def _columns_agree(records: dict, where) -> None:
    lengths = sorted({len(column) for column in records.values() if column is not None})
    if len(lengths) > 1:
        raise Refusal(where, f"columns of one length (they have {', '.join(map(str, lengths))})", show_found=False)
    positions = records["position"]
    for i in range(1, len(positions)):
        if positions[i] <= positions[i - 1]:
            raise Refusal(at(where, "position", i), f"a position after {positions[i - 1]:,} (positions increase)",
                          positions[i])


def _within_document(run: dict, where) -> None:
    positions, tokens = run["records"]["position"], run["document"]["tokens"]
    if positions and positions[-1] >= tokens - 1:
        raise Refusal(
            at(where, "records", "position", len(positions) - 1),
            f"a position below {tokens - 1:,}: the document has {tokens:,} tokens and its last is only predicted",
            positions[-1],
        )


DOCUMENT = Record(  # also a sweep's
    {"name": Text(), "source": Text(), "tokens": Int(0, MAX_POSITIONS, what="a number of tokens"),
     "title": maybe(Text(null=True)), "author": maybe(Text(null=True)),
     "first_token_id": maybe(Int(0, null=True)),
     "cut": maybe(Text(null=True))},  # what was cut to fit the model's context, in words
    extra=Json(depth=1), what="a document (an object)",
)

EVAL_RECORD = Record(  # also a sweep's configurations' (kvviz.files.sweep)
    {
        "model": MODEL_CARD,
        "strategy": STRATEGY,
        "document": DOCUMENT,
        "method": Record({"mode": Text(MODES), "chunk": Int(1), "rows": maybe(Int(1)), "prompt": maybe(Int(1)),
                          "shared": maybe(Int(1))},
                         what="a method (an object with mode and chunk)"),
        "cancelled": Flag(),
        "error": Text(null=True),
        "first_eviction": Int(0, null=True),
        "records": Record(
            {
                "position": ListOf(Int(0, MAX_POSITIONS)),
                "token_id": ListOf(Int(0)),
                "nll": ListOf(Number(0, what="a negative log-likelihood in nats")),
                "cache_bytes": ListOf(Int(0, MAX_BYTES, null=True, what="a byte count")),
                "predicted_cache_bytes": ListOf(Int(0, MAX_BYTES, null=True, what="a byte count")),
                "tokens_held": ListOf(Int(0, MAX_POSITIONS, null=True)),
                "wall_ms": ListOf(Number(0, MAX_MS, what="a time in ms")),
                "policy_bytes": optional(ListOf(Int(0, MAX_BYTES, null=True, what="a byte count"))),
            },
            rules=(_columns_agree,),
            what="a table of columns (an object of lists)",
        ),
        "summary": optional(Json(depth=3)),  # what the records give: checked against them (`FileFormat.summary`)
    },
    rules=(_within_document,),
)


def build_run(data: dict) -> EvalRun:
    columns = dict(data["records"])
    if columns["policy_bytes"] is None:  # a file from before kvviz measured it: unknown
        columns["policy_bytes"] = [None] * len(columns["position"])
    rows = zip(*(columns[name] for name in COLUMNS), strict=True)
    records = [TokenRecord(*row) for row in rows]
    return EvalRun(data["model"], data["strategy"], data["document"], data["method"], records,
                   data["cancelled"], data["error"], data["first_eviction"])


def _from_journal(header: dict, lines: list, source: str) -> EvalRun:
    """The partial evaluation a killed process's journal holds (`EvalJournal`), said so in its error."""
    return _journaled(header, lines, source).run


FILE_FORMAT = FileFormat(name=FORMAT, version=VERSION, kind="kvviz evaluation", schema=EVAL_RECORD, build=build_run,
                         error=EvalFileError, from_journal=_from_journal, summary=EvalRun.summary)
