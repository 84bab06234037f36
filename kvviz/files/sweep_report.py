"""How a sweep is written for people and spreadsheets: its table (the same cells on the command line, in the window
and in the report), its CSV, and the Markdown report `kvviz choose --out` keeps beside the sweep file, with the
frontier picture and the answer. (Here rather than in kvviz.files.sweep: a row needs the frontier's perplexity
change, and kvviz.files.frontier reads the sweep's records, so the file format stays below both.)"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

from kvviz.files.frontier import accuracy_text, answer, frontier, loss_text, memory, perplexity_change
from kvviz.files.jsonfile import write_atomic
from kvviz.files.qa import REGIMES
from kvviz.files.sweep import Configuration, Sweep
from kvviz.present import UNKNOWN, change, clock, counted, options_text, percent, perplexity, seconds, size

# (key, title): the columns of a sweep's table, in order
COLUMNS = (
    ("configuration", "configuration"),
    ("perplexity", "perplexity"),
    ("change", "vs exact"),
    ("second_half", "2nd half"),
    ("kl", "KL (nats)"),
    ("top1", "top-1"),
    ("measured", "measured at end"),
    ("target", "at target"),
    ("peak", "serving peak at target"),
    ("ttft", "TTFT at target (s)"),
    ("fit", "sequences in budget"),
    ("longest", "longest context in budget"),
    ("decode", "decode tok/s"),
    ("status", "status"),
)


def columns(sweep: Sweep) -> tuple[tuple[str, str], ...]:
    """The sweep's table columns: `COLUMNS`, and where questions were asked, one of answers per regime after top-1."""
    regimes = sweep.asked.regimes if sweep.asked else []
    at = [key for key, _ in COLUMNS].index("top1") + 1
    return (*COLUMNS[:at], *((f"accuracy:{regime}", f"{regime} answers") for regime in regimes), *COLUMNS[at:])


def longest_text(config: Configuration) -> str:
    """The longest context one sequence reaches in the budget: "no limit" for a cache of bounded size that no
    position limit stops (attention sinks), and "(all positions)" where the model's context stops it first."""
    target = config.target
    if target is None or target.per_sequence_bytes is None:
        return UNKNOWN
    if target.longest_limit == "none":
        return "no limit"
    if target.longest_context is None:
        return UNKNOWN
    return f"{target.longest_context:,}" + (" (all positions)" if target.longest_limit == "context" else "")


def first_token_cells(config: Configuration) -> tuple[str, str]:
    """One request served at the target up to its first token: the process's peak and the time, each marked
    "(pred.)" where predicted from the measurement at the text's length."""
    at = config.target.first_token if config.target else None
    if at is None:
        return UNKNOWN, UNKNOWN
    mark = " (pred.)" if at.predicted else ""
    peak = size(at.peak_bytes) + (mark if at.peak_bytes is not None else "")
    return peak, seconds(at.ttft_ms) + (mark if at.ttft_ms is not None else "")


def cells(sweep: Sweep, config: Configuration) -> dict[str, str]:
    """A configuration's row, written (the command line's, the report's and the window's): unknown values as
    UNKNOWN, never 0."""
    s = config.summary()
    target = config.target
    measured = size(s["final_cache_bytes"])
    checked = target.predicted_at_measured if target else None
    if s["final_cache_bytes"] is not None and checked is not None and checked != s["final_cache_bytes"]:
        measured += f" (size rule {checked - s['final_cache_bytes']:+,} B)"
    peak, ttft = first_token_cells(config)
    return {
        "configuration": config.label,
        "perplexity": perplexity(s["perplexity"]),
        "change": change(perplexity_change(sweep, config)),
        "second_half": perplexity(s["second_half_perplexity"]),
        "kl": UNKNOWN if s["mean_kl"] is None else f"{s['mean_kl']:.3g}",
        "top1": percent(s["top1"], 1),
        "measured": measured,
        "target": size(memory(config)),
        "peak": peak,
        "ttft": ttft,
        "fit": UNKNOWN if target is None or target.sequences_in_budget is None else f"{target.sequences_in_budget:,}",
        "longest": longest_text(config),
        "decode": UNKNOWN if s["decode_tokens_per_s"] is None else f"{s['decode_tokens_per_s']:.1f}",
        "status": config.status if not config.run.error else f"{config.status}: {config.run.error}",
        **{f"accuracy:{regime}": accuracy_text(sweep, config, regime)
           for regime in (sweep.asked.regimes if sweep.asked else ())},
    }


def by_memory(sweep: Sweep) -> list[int]:
    """The configurations' indices by memory at the target (of what the budget covers), smallest first; those without
    one last, in the sweep's order."""
    configs = sweep.configurations
    held = [memory(c, sweep.question.budget_covers) for c in configs]
    known = sorted((i for i, m in enumerate(held) if m is not None), key=lambda i: held[i])
    return known + [i for i, m in enumerate(held) if m is None]


def question_text(sweep: Sweep) -> str:
    q = sweep.question
    covered = "a cache budget" if q.budget_covers == "cache" else "a budget for the whole process"
    return (f"{counted(q.sequences, 'sequence')} of {q.context:,} tokens, {covered} of {q.budget}, "
            f"{q.tolerance.describe()}")


def speed_text(sweep: Sweep) -> str:
    speed = sweep.speed
    tokens = max((c.summary()["tokens"] for c in sweep.configurations if c.run.records), default=0) + 1
    text = (f"{counted(len(sweep.configurations), 'configuration')} x {tokens:,} tokens in "
            f"{clock(speed.wall_s) if speed.wall_s is not None else UNKNOWN}")
    if speed.floor_share is not None:
        text += (f", {speed.floor_share:.2f} x the compute-bound floor ({clock(speed.floor_s)}: {tokens - 1:,} plain "
                 f"forwards of one token for {counted(speed.floor_rows, 'row')} over a full cache of "
                 f"{tokens // 2:,} tokens, timed after the text)")
    if speed.forwards_per_s is not None:
        text += (f"; forwards of one token: {speed.rows_per_forward:.1f} rows each, "
                 f"{speed.forwards_per_s:.1f} per second")
        if speed.memory_bound_share is not None:
            text += (f", {percent(speed.memory_bound_share, 1)} of the memory-bound speed (every weight and every "
                     f"row's cache read once per forward at {speed.bandwidth_bytes_per_s / 1e9:.1f} GB/s)")
    if speed.answering_s is not None:
        text += f"; the questions asked in {clock(speed.answering_s)}"
    if speed.first_token_s is not None:
        text += f"; a request served through each in {clock(speed.first_token_s)}"
    return text


def markdown(sweep: Sweep, figures: dict[str, Path] | None = None) -> str:
    said = answer(sweep)
    lines = [f"# Which cache? {sweep.model.get('name', 'the model')} on {sweep.document.get('name', 'the text')}", "",
             f"Asked: {question_text(sweep)}.", "", "## Answer", "", *said.sentences, "", *said.caveats, ""]
    if figures and "png" in figures:
        lines += [f"![Quality loss against cache memory at the target]({figures['png'].name})", ""]
    best = frontier(sweep)
    if best:
        lines += ["## The frontier", "", "No other configuration is both smaller at the target and better:", ""]
        lines += [f"- {c.label}: {size(memory(c, sweep.question.budget_covers))}, {loss_text(sweep, c)}" for c in best]
        lines.append("")
    keys = [key for key, _ in columns(sweep)]
    titles = dict(columns(sweep))
    lines += ["## Every configuration, by memory at the target", "",
              "| " + " | ".join(titles[k] for k in keys) + " |", "|" + "---|" * len(keys)]
    for index in by_memory(sweep):
        row = cells(sweep, sweep.configurations[index])
        lines.append("| " + " | ".join(row[k].replace("|", "/") for k in keys) + " |")
    lines += answers_markdown(sweep)
    lines += ["", "## How it was measured", "",
              f"Speed: {speed_text(sweep)}.", "",
              "Each configuration read the text through its own cache, one token per forward (the exact cache a "
              "chunk at a time, SnapKV the first half as its prompt), and each prediction was compared with the exact "
              "cache's: perplexity, KL(exact || configuration) and whether the most likely tokens agree. Memory at the "
              "target is each cache's own size rule replayed to the target, checked against the cache measured at the "
              "end of the text (where the rule differs, by how many bytes is shown beside the measurement); decode "
              "tok/s is a step with the configuration's cache alone after the text. The serving peak and TTFT are one "
              "request of the text's length served through a fresh cache up to its first token, as a user's code "
              "would (the prompt's prefill, the cache's own work after it, the last position's logits): the process's "
              "peak is the model's weights and buffers and the most the request allocated at once, every tensor "
              "allocation counted by torch's profiler; at the target both are predicted (pred.) from that measurement, "
              "the cache's size rule and the shapes of the model's widest forward.", ""]
    return "\n".join(lines)


# -- the table a spreadsheet reads -------------------------------------------------------------------------

CSV_COLUMNS = (
    "strategy", "options", "status", "tokens", "perplexity", "second_half_perplexity", "perplexity_change",
    "mean_kl", "top1_agreement", "final_cache_bytes", "final_policy_bytes", "target_context", "target_sequences",
    "target_bytes", "peak_bytes_at_target", "ttft_ms_at_target", "at_target_predicted", "process_bytes",
    "measured_tokens", "peak_bytes_measured", "ttft_ms_measured", "sequences_in_budget", "longest_context",
    "decode_tokens_per_s", "sweep_tokens_per_s",
    "rows_per_forward", *(f"accuracy_{regime.replace('-', '_')}" for regime in REGIMES), "error",
)


# the columns that are times, which differ from one run of the same sweep to the next
TIMED_COLUMNS = ("ttft_ms_at_target", "ttft_ms_measured", "decode_tokens_per_s", "sweep_tokens_per_s")


def csv_row(sweep: Sweep, config: Configuration) -> dict[str, Any]:
    s = config.summary()
    target, first = config.target, config.first_token
    at = target.first_token if target else None
    return {
        "strategy": config.run.strategy.get("name", ""),
        "options": options_text(config.run.strategy.get("options"), " "),
        "status": config.status,
        "tokens": s["tokens"],
        "perplexity": s["perplexity"],
        "second_half_perplexity": s["second_half_perplexity"],
        "perplexity_change": perplexity_change(sweep, config),
        "mean_kl": s["mean_kl"],
        "top1_agreement": s["top1"],
        "final_cache_bytes": s["final_cache_bytes"],
        "final_policy_bytes": s["final_policy_bytes"],
        "target_context": sweep.question.context,
        "target_sequences": sweep.question.sequences,
        "target_bytes": target.total_bytes if target else None,
        "peak_bytes_at_target": at.peak_bytes if at else None,
        "ttft_ms_at_target": at.ttft_ms if at else None,
        "at_target_predicted": at.predicted if at else None,
        "process_bytes": target.process_bytes if target else None,
        "measured_tokens": first.tokens if first else None,
        "peak_bytes_measured": first.peak_bytes if first else None,
        "ttft_ms_measured": first.ttft_ms if first else None,
        "sequences_in_budget": target.sequences_in_budget if target else None,
        "longest_context": target.longest_context if target else None,
        "decode_tokens_per_s": s["decode_tokens_per_s"],
        "sweep_tokens_per_s": s["sweep_tokens_per_s"],
        "rows_per_forward": config.measured_rows,
        **{f"accuracy_{regime.replace('-', '_')}": config.accuracy(regime) for regime in REGIMES},
        "error": config.run.error or "; ".join(f"answering ({', '.join(regimes)}): {reason}"
                                               for reason, regimes in config.answer_failures().items()) or None,
    }


def write_csv(sweep: Sweep, path: str | os.PathLike) -> Path:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for config in sweep.configurations:
        row = csv_row(sweep, config)
        writer.writerow(["" if row[key] is None else f"{row[key]:.6g}" if isinstance(row[key], float) else row[key]
                         for key in CSV_COLUMNS])
    return write_atomic(path, out.getvalue().encode("utf-8"))


def answers_markdown(sweep: Sweep) -> list[str]:
    """Where questions were asked: what was asked, and per regime each configuration's answer to each question
    (✓ right, ✗ wrong with what it said, a share where an answer scores in part)."""
    asked = sweep.asked
    if asked is None:
        return []
    rendering = "as plain text" if asked.raw else "in the model's chat template"
    lines = ["", "## Questions asked", "",
             f"{counted(sum(len(i.turns) for i in asked.items), 'question')} of {counted(len(asked.items), 'item')} "
             f"({asked.source}; read {rendering}), in the regimes {', '.join(asked.regimes)}. Each configuration "
             "answered greedily; an answer scores the share of its references it contains (RULER's string_match_all). "
             "query-agnostic: the context compressed before the question, which is then fed uncompressed; "
             "query-aware: context and question compressed together; decode-time: everything read one token at a "
             "time, the policy acting throughout; multi-turn: the questions asked one after another on one cache, "
             "each answer kept on it.", ""]
    names = [f"{item.name}" + (f" q{t + 1}" if len(item.turns) > 1 else "")
             for item in asked.items for t in range(len(item.turns))]
    for regime in asked.regimes:
        lines += [f"### Answers, {regime}", "", "| configuration | " + " | ".join(names) + " |",
                  "|" + "---|" * (len(names) + 1)]
        for index in by_memory(sweep):
            config = sweep.configurations[index]
            got = {(a.item, a.turn): a for a in config.answered(regime)}
            row = [_answer_cell(got.get((i, t))) for i, item in enumerate(asked.items) for t in range(len(item.turns))]
            lines.append(f"| {config.label} | " + " | ".join(row) + " |")
        lines.append("")
    return lines


def _answer_cell(record) -> str:
    if record is None or record.score is None:
        return UNKNOWN
    if record.score == 1:
        return "✓"
    said = record.answer.replace("|", "/").replace("\n", " ")
    said = said if len(said) <= 24 else said[:23] + "…"
    return ("✗" if record.score == 0 else f"{record.score:.2g}") + (f" {said}" if said else "")


def write_report(sweep: Sweep, path: Path, figures: dict[str, Path] | None = None) -> Path:
    return write_atomic(path, markdown(sweep, figures).encode("utf-8"))


def keep(sweep: Sweep, folder: Path, figures: dict[str, Path]) -> list[Path]:
    """A sweep as `kvviz choose --out` and the window keep it, in `folder`: sweep.json (kvviz-sweep), sweep.csv and
    report.md, which shows `figures` (the frontier picture, drawn by the caller: {"png": path, "svg": path})."""
    return [sweep.save(folder / "sweep.json"), write_csv(sweep, folder / "sweep.csv"),
            write_report(sweep, folder / "report.md", figures), *figures.values()]
