"""Tables of runs: the Runs-table CSV and the comparison report's Markdown (stdlib only).

The numbers of a row come from `kvviz.present.run_row`, the same builder the window's Runs table uses.
An unknown value is an empty CSV cell and UNKNOWN in Markdown.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from kvviz.present import UNKNOWN

COLUMNS = [
    ("run", "run"),
    ("model", "model"),
    ("strategy", "strategy"),
    ("options", "options"),
    ("prompt_tokens", "prompt tokens"),
    ("new_tokens", "new tokens"),
    ("prefill_ms", "prefill ms"),
    ("prefill_peak_mib", "prefill peak MiB"),
    ("decode_ms_mean", "decode ms mean"),
    ("decode_ms_p95", "decode ms p95"),
    ("scoring_ms_mean", "scoring ms mean"),
    ("decode_tokens_per_s", "tokens/s"),
    ("share_of_memory_bound", "share of memory-bound speed"),
    ("memory_bound_tokens_per_s", "memory-bound tokens/s"),
    ("warm_up_ms", "warm-up ms"),
    ("compile_ms", "compile ms"),
    ("final_cache_mib", "cache MiB at end"),
    ("peak_cache_mib", "peak cache MiB"),
    ("peak_policy_mib", "peak policy state MiB"),
    ("peak_rss_mib", "peak RSS MiB"),
    ("top1_agreement", "top-1 agreement"),
    ("mean_kl", "mean KL (nats)"),
    ("first_divergence", "first divergence"),
    ("reference_perplexity", "perplexity (reference)"),
    ("switches", "switches"),
    ("status", "status"),
]


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def write_csv(rows: list[dict], path: str | os.PathLike) -> Path:
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([title for _, title in COLUMNS])
        for row in rows:
            writer.writerow([_cell(row[key]) for key, _ in COLUMNS])
    return path


def markdown_table(rows: list[dict], keys: list[str]) -> str:
    titles = dict(COLUMNS)
    lines = ["| " + " | ".join(titles[k] for k in keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(row[k]) or UNKNOWN for k in keys) + " |" for row in rows]
    return "\n".join(lines)
