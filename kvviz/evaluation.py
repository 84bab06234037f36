"""Teacher-forced evaluations of cache strategies along a document, and the files that keep them.

Plain data only (stdlib + numpy): the engine (`kvviz.engine.evaluate`) produces these records, the
command line and the window consume them. Nothing here knows about torch or Qt.

An evaluation file holds one strategy's run over one document, as JSON:

    {"format": "kvviz-eval", "version": 1, "model": {...}, "strategy": {"name", "options"},
     "document": {"name", "source", "title", "author", "tokens", "first_token_id", "cut"},
     "method": {"mode": "token-by-token" or "chunked", "chunk": int},
     "cancelled": bool, "error": str or null, "first_eviction": int or null,
     "records": {"position": [...], "token_id": [...], "nll": [...], "cache_bytes": [...],
                 "predicted_cache_bytes": [...], "tokens_held": [...], "wall_ms": [...]},
     "summary": {...}}

`records` is a table of columns of equal length, one entry per prediction: the document token at
`position` was fed through the cache and the model predicted the next one, `token_id`, with
negative log-likelihood `nll` (natural log). The summary is recomputed from the records on load.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvviz.trace import read_json

FORMAT = "kvviz-eval"
VERSION = 1
MODES = ("token-by-token", "chunked")
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
    wall_ms: float  # the forward and log-softmax of this prediction (a chunk's time shared by its tokens)


COLUMNS = ("position", "token_id", "nll", "cache_bytes", "predicted_cache_bytes", "tokens_held", "wall_ms")


@dataclass
class EvalRun:
    """One strategy's evaluation over one document (possibly partial: cancelled or failed)."""

    model: dict[str, Any]  # the model card
    strategy: dict[str, Any]  # {"name": str, "options": dict}
    document: dict[str, Any]  # name, source, title, author, tokens, first_token_id, cut
    method: dict[str, Any]  # {"mode": one of MODES, "chunk": tokens per forward}
    records: list[TokenRecord] = field(default_factory=list)
    cancelled: bool = False
    error: str | None = None
    # the first position predicted after the cache had dropped a token (None: it never did)
    first_eviction: int | None = None

    def label(self) -> str:
        options = self.strategy.get("options") or {}
        shown = ", ".join(f"{k}={v}" for k, v in options.items())
        return f"{self.strategy.get('name')} ({shown})" if shown else str(self.strategy.get("name"))

    @property
    def status(self) -> str:
        return "error" if self.error else "cancelled" if self.cancelled else "finished"

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
        """Write atomically (never half a file), as strict JSON (no NaN)."""
        return write_atomic(path, json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False))


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


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
        "wall_s": wall_ms / 1000.0,
        "tokens_per_s": n / (wall_ms / 1000.0) if n and wall_ms > 0 else None,
    }
    if first_eviction is not None:
        before = positions < first_eviction
        summary["before_eviction_perplexity"] = perplexity(nll[before])
        summary["after_eviction_perplexity"] = perplexity(nll[~before])
    return summary


# -- the summary CSV of a whole evaluation ------------------------------------------------------------

CSV_COLUMNS = (
    "strategy", "options", "model", "document", "tokens", "perplexity", "second_half_perplexity",
    "q1_perplexity", "q2_perplexity", "q3_perplexity", "q4_perplexity", "first_eviction",
    "before_eviction_perplexity", "after_eviction_perplexity", "final_cache_mib", "peak_cache_mib",
    "tokens_per_s", "wall_s", "method", "status", "file",
)


def summary_row(run: EvalRun, file: str | None = None) -> dict[str, Any]:
    s = run.summary()
    options = run.strategy.get("options") or {}
    quarters = [q["perplexity"] for q in s["quarters"]] + [None] * QUARTERS
    mib = {key: None if s[key] is None else s[key] / 2**20 for key in ("final_cache_bytes", "peak_cache_bytes")}
    method = run.method.get("mode", "")
    if method == "chunked":
        method += f" ({run.method.get('chunk')})"
    row = {
        "strategy": run.strategy.get("name", ""),
        "options": " ".join(f"{k}={v}" for k, v in options.items()),
        "model": run.model.get("name", ""),
        "document": run.document.get("name", ""),
        "final_cache_mib": mib["final_cache_bytes"],
        "peak_cache_mib": mib["peak_cache_bytes"],
        "method": method,
        "status": run.status,
        "file": file,
    }
    row.update({f"q{i + 1}_perplexity": quarters[i] for i in range(QUARTERS)})
    row.update({key: s[key] for key in CSV_COLUMNS if key in s})
    return row


def write_summary_csv(rows: list[dict[str, Any]], path: str | os.PathLike) -> Path:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow(["" if row.get(key) is None else _cell(row[key]) for key in CSV_COLUMNS])
    return write_atomic(path, out.getvalue())


def _cell(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


# -- reading ------------------------------------------------------------------------------------------


class EvalFileError(ValueError):
    """A file is not a readable kvviz evaluation; the message names the file, the field and what was expected."""


def is_eval_file(data: Any) -> bool:
    """Whether parsed JSON claims to be an evaluation file (the format field), valid or not."""
    return isinstance(data, dict) and data.get("format") == FORMAT


def load(path: str | os.PathLike) -> EvalRun:
    """Read and validate an evaluation file. Raises EvalFileError naming the first problem found."""
    return from_dict(read_json(path, "kvviz evaluation", EvalFileError), source=str(path))


def from_dict(data: Any, source: str = "evaluation") -> EvalRun:
    if not is_eval_file(data):
        raise EvalFileError(f'{source} is not a kvviz evaluation: expected "format": "{FORMAT}" at the top level')
    if data.get("version") != VERSION:
        raise EvalFileError(
            f"{source} is a kvviz evaluation of version {data.get('version')!r}; this kvviz reads version {VERSION}"
        )
    check = _Checker(source)
    model = check.kind(data, "model", dict)
    strategy = check.kind(data, "strategy", dict)
    check.kind(strategy, "name", str, "strategy.name")
    check.kind(strategy, "options", dict, "strategy.options")
    document = check.kind(data, "document", dict)
    check.kind(document, "name", str, "document.name")
    check.kind(document, "source", str, "document.source")
    check.count(document, "tokens", "document.tokens")
    method = check.kind(data, "method", dict)
    if method.get("mode") not in MODES:
        check.fail("method.mode", f"one of {', '.join(MODES)}")
    check.count(method, "chunk", "method.chunk", minimum=1)
    cancelled = check.kind(data, "cancelled", bool)
    error = check.kind(data, "error", (str, type(None)))
    first_eviction = check.kind(data, "first_eviction", (int, type(None)))
    if first_eviction is not None:
        check.count(data, "first_eviction")
    records = _records(check, check.kind(data, "records", dict), document["tokens"])
    return EvalRun(model, strategy, document, method, records, cancelled, error, first_eviction)


def _records(check: _Checker, table: dict, document_tokens: int) -> list[TokenRecord]:
    columns = {}
    for name in COLUMNS:
        values = check.kind(table, name, list, f"records.{name}")
        optional = name in ("cache_bytes", "predicted_cache_bytes", "tokens_held")
        for i, value in enumerate(values):
            where = f"records.{name}[{i}]"
            if value is None and optional:
                continue
            if name in ("nll", "wall_ms"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    check.fail(where, "a finite number")
                if value < 0:
                    check.fail(where, "a number >= 0")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                check.fail(where, "an integer >= 0" + (" or null" if optional else ""))
        columns[name] = values
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        check.fail("records", f"columns of one length (they have {', '.join(map(str, sorted(lengths)))})")
    positions = columns["position"]
    for i in range(1, len(positions)):
        if positions[i] <= positions[i - 1]:
            check.fail(f"records.position[{i}]", f"a position after {positions[i - 1]} (positions increase)")
    if positions and positions[-1] >= document_tokens - 1:
        check.fail(f"records.position[{len(positions) - 1}]", f"below {document_tokens - 1}: the document has "
                   f"{document_tokens} tokens, and its last one is only predicted")
    return [TokenRecord(*(columns[name][i] for name in COLUMNS)) for i in range(len(positions))]


_KIND_NAMES = {dict: "an object", list: "a list", str: "a string", bool: "true or false", int: "an integer",
               type(None): "null"}


class _Checker:
    """Field checks that raise EvalFileError naming the file, the field's path and what was expected."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, expected: str):
        raise EvalFileError(f"{self.source}: field {where} must be {expected}")

    def kind(self, obj: dict, key: str, kind, where: str | None = None):
        where = where or key
        value = obj.get(key, ...)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        bad_bool = isinstance(value, bool) and bool not in kinds
        if value is ... or bad_bool or not isinstance(value, kinds):
            expected = " or ".join(_KIND_NAMES[k] for k in kinds)
            self.fail(where, expected + (" (it is missing)" if value is ... else ""))
        return value

    def count(self, obj: dict, key: str, where: str | None = None, minimum: int = 0) -> int:
        value = obj.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(where or key, f"an integer >= {minimum}")
        return value
