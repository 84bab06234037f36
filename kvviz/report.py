"""Tables of runs: the Runs-table CSV and the comparison report's Markdown (stdlib only)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from kvviz.trace import Trace

COLUMNS = [
    ("run", "run"),
    ("model", "model"),
    ("strategy", "strategy"),
    ("options", "options"),
    ("prompt_tokens", "prompt tokens"),
    ("new_tokens", "new tokens"),
    ("prefill_ms", "prefill ms"),
    ("decode_ms_mean", "decode ms mean"),
    ("decode_ms_p95", "decode ms p95"),
    ("decode_tokens_per_s", "tokens/s"),
    ("final_cache_mib", "cache MiB at end"),
    ("peak_cache_mib", "peak cache MiB"),
    ("peak_rss_mib", "peak RSS MiB"),
    ("top1_agreement", "top-1 agreement"),
    ("mean_kl", "mean KL (nats)"),
    ("first_divergence", "first divergence"),
    ("reference_perplexity", "perplexity (reference)"),
    ("switches", "switches"),
    ("status", "status"),
]


def run_row(label: str, trace: Trace) -> dict:
    """One run's numbers as the Runs table and the report show them."""
    s = trace.summary()
    options = trace.strategy.get("options") or {}
    return {
        "run": label,
        "model": trace.model.get("name", ""),
        "strategy": trace.strategy.get("name", ""),
        "options": " ".join(f"{k}={v}" for k, v in options.items()),
        "prompt_tokens": trace.prompt_tokens,
        "new_tokens": s["new_tokens"],
        "prefill_ms": s["prefill_ms"],
        "decode_ms_mean": s["decode_ms_mean"],
        "decode_ms_p95": s["decode_ms_p95"],
        "decode_tokens_per_s": s["decode_tokens_per_s"],
        "final_cache_mib": s["final_cache_bytes"] / 2**20,
        "peak_cache_mib": s["peak_cache_bytes"] / 2**20,
        "peak_rss_mib": s["peak_rss_bytes"] / 2**20,
        "top1_agreement": s.get("top1_agreement"),
        "mean_kl": s.get("mean_kl"),
        "first_divergence": s.get("first_divergence"),
        "reference_perplexity": s.get("reference_perplexity"),
        "switches": " ".join(f"{w.step}:{w.to_strategy}" for w in trace.switches),
        "status": "error" if trace.error else "cancelled" if trace.cancelled else "finished",
    }


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
    lines += ["| " + " | ".join(_cell(row[k]) or "-" for k in keys) + " |" for row in rows]
    return "\n".join(lines)
