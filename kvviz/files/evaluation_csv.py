"""The summary CSV of a whole evaluation: one row of figures per strategy, as `kvviz eval` and the window write it;
and how the files of an evaluation kept in a folder are named (`kvviz eval --out`, File ▸ Save evaluation)."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

from kvviz.files.evaluation import QUARTERS, EvalRun, load, read_journal
from kvviz.files.journal import journal_path
from kvviz.files.jsonfile import write_atomic

CSV_COLUMNS = (
    "strategy", "options", "model", "document", "tokens", "perplexity", "second_half_perplexity",
    "q1_perplexity", "q2_perplexity", "q3_perplexity", "q4_perplexity", "first_eviction",
    "before_eviction_perplexity", "after_eviction_perplexity", "final_cache_mib", "peak_cache_mib",
    "peak_policy_mib", "tokens_per_s", "wall_s", "method", "status", "file",
)


def summary_row(run: EvalRun, file: str | None = None) -> dict[str, Any]:
    s = run.summary()
    options = run.strategy.get("options") or {}
    quarters = [q["perplexity"] for q in s["quarters"]] + [None] * QUARTERS
    mib = {key: None if s[key] is None else s[key] / 2**20
           for key in ("final_cache_bytes", "peak_cache_bytes", "peak_policy_bytes")}
    method = run.method.get("mode", "")
    if method == "chunked":
        method += f" ({run.method.get('chunk')})"
    elif method == "batched":
        method += f" ({run.method.get('rows')})"
    if run.method.get("prompt"):
        method += f" after a prompt of {run.method['prompt']}"
    if run.method.get("shared"):
        method += f", its first {run.method['shared']} predictions shared"
    row = {
        "strategy": run.strategy.get("name", ""),
        "options": " ".join(f"{k}={v}" for k, v in options.items()),
        "model": run.model.get("name", ""),
        "document": run.document.get("name", ""),
        "final_cache_mib": mib["final_cache_bytes"],
        "peak_cache_mib": mib["peak_cache_bytes"],
        "peak_policy_mib": mib["peak_policy_bytes"],
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
    return write_atomic(path, out.getvalue().encode("utf-8"))


def file_name(index: int, strategy: dict[str, Any]) -> str:
    """The file of strategy `index` (from 0) of an evaluation kept in a folder: "eval-2-sliding.json"."""
    return f"eval-{index + 1}-{strategy['name']}.json"


def write_folder_summary(folder: str | os.PathLike, strategies: list[dict[str, Any]]) -> Path:
    """The summary CSV of the evaluation of `strategies` kept in `folder`, written again from what the folder holds
    (a strategy continued there since): a row per strategy in order, from its file, or where it has none from its
    journal (what was measured, no file); a strategy with neither never started and has no row. Raises KeptFileError
    naming a file there that cannot be read, or OSError."""
    folder = Path(folder)
    rows = []
    for index, strategy in enumerate(strategies):
        path = folder / file_name(index, strategy)
        if path.exists():
            rows.append(summary_row(load(path), str(path)))
        elif journal_path(path).exists():
            rows.append(summary_row(read_journal(journal_path(path)).run))
    return write_summary_csv(rows, folder / "summary.csv")


def _cell(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
