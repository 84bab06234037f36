"""`kvviz eval`: long-context perplexity of several cache strategies along one document, headless.

Each strategy reads the document through its own cache, one token at a time (strategies that keep
every token exactly: a chunk per forward; strategies that evict: together, one batch row each, unless
`--one-at-a-time`), and the command prints per strategy the perplexity
overall and over segments, the cache's size and the speed; `--out DIR` keeps one `kvviz-eval` file
per strategy and `summary.csv`. Ctrl-C or SIGTERM stops the evaluation, keeps and writes what was
measured, and exits 130 or 143; a strategy that fails does not stop the others (exit status 1 then).
`kvviz trace FILE` prints a kept evaluation file's summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from kvviz import interrupts
from kvviz.errors import UsageError

SEGMENTS_NOTE = (
    "Q1-Q4: perplexity over each quarter of the predicted tokens (the same positions for every strategy); "
    "2nd half: over the last half.\n"
    "full / evicted: over the predictions made while the cache still held every earlier token, and after it had "
    "first dropped one (measured: the cache held fewer tokens than it had seen).\n"
    "policy MiB: what an evicting policy kept beside keys and values at the end (positions, H2O's attention sums)."
)


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "eval", help="perplexity along a long document through each strategy's cache (StreamingLLM's evaluation)",
        description="Feed a document through each strategy's cache one token at a time (strategies that keep every "
        "token exactly: a chunk per forward; strategies that evict read it together, one batch row each) and score "
        "every next token. Prints per strategy the perplexity overall, "
        "by quarter of the document and before/after the cache first dropped a token, the cache's size and tokens/s. "
        "Ctrl-C keeps and writes what was measured.",
    )
    parser.add_argument("--model", default="default", help="default, tiny, a model directory, a .gguf file or a hub id")
    parser.add_argument("--dtype", default="auto", help="auto (float32 on CPU), float32, bfloat16 or float16")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    text = parser.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", type=Path, metavar="FILE", help="a .txt or .md file of UTF-8 text")
    text.add_argument("--builtin", metavar="NAME", help="a document shipped with kvviz: alice (Alice in Wonderland)")
    parser.add_argument("--tokens", type=int, metavar="N",
                        help="evaluate the document's first N tokens (default: all, cut at the model's context)")
    parser.add_argument(
        "--strategies", required=True, metavar="LIST",
        help="comma-separated NAME or NAME:KEY=VALUE:KEY=VALUE, e.g. dynamic,sliding:window=256,"
        "sink:sink_tokens=4:window=252,quantized:backend=hqq:nbits=2",
    )
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="feed each strategy alone, so that its tokens/s is its own (by default the strategies "
                        "that evict read the document together, one batch row each, sharing each forward's time)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="write a kvviz-eval file per strategy and summary.csv")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    return parser


def _document(args):
    from kvviz import documents

    try:
        return documents.builtin(args.builtin) if args.builtin is not None else documents.from_file(args.text)
    except documents.DocumentError as exc:
        raise UsageError(str(exc)) from None


def _out_folder(out: Path | None) -> Path | None:
    """The output folder, created and checked before any work so that an evaluation is never lost to it."""
    if out is None:
        return None
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for the evaluation files")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the folder {out}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK):
        raise UsageError(f"cannot write into the folder {out}: it is not writable")
    return out


def _log(message: str) -> None:
    print(f"kvviz: {message}", file=sys.stderr, flush=True)


def cmd_eval(args) -> int:
    from kvviz import evaluation

    problem = evaluation.token_count_problem(args.tokens)
    if problem:
        raise UsageError(f"--tokens: {problem}")
    document = _document(args)
    out = _out_folder(args.out)
    from kvviz.compare import parse_strategy_list
    from kvviz.engine import evaluate, models

    choices = parse_strategy_list([s for s in args.strategies.split(",") if s.strip()])
    loaded = models.load_model(args.model, dtype=args.dtype, device=args.device,
                               progress=lambda message, fraction: _log(message))
    ids, record, notice = evaluate.prepare(loaded, document, choices, args.tokens)
    if notice:
        _log(notice)
    # every strategy is checked against the model before any work
    evaluations = [evaluate.Evaluation(loaded, c, ids, record) for c in choices]
    _log(f"{loaded.card['name']}, document {document.name}, {len(ids):,} tokens, {len(choices)} strategies")
    rows = Rows(evaluations, args.json)
    progress = Progress(evaluations)
    interrupted = None
    try:
        for index, _ in evaluate.evaluate_all(evaluations, together=not args.one_at_a_time):
            ready = rows.ready()
            if ready:
                progress.clear()
                rows.show(ready)
            progress.update(index)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: keep what was measured
        interrupted = exc
    with interrupts.deferred():  # a second Ctrl-C waits until what was measured is shown and written
        if interrupted is not None:
            for e in evaluations:
                if e.started and not e.result.error and len(e.result.records) < e.ids.shape[-1] - 1:
                    e.result.cancelled = True
        progress.clear()
        rows.show(rows.ready(final=True))
        files = _save(evaluations, out) if out else {}
        if args.json:
            print(json.dumps([_json_result(e.result, files.get(i)) for i, e in enumerate(evaluations) if e.started],
                             indent=2, allow_nan=False))
        else:
            _print_footer(evaluations)
        if out:
            _log(f"wrote {len(files)} evaluation file(s) and {out / 'summary.csv'}")
    if interrupted is not None:
        raise interrupted
    return 1 if any(e.result.error for e in evaluations) else 0


class Rows:
    """The table on stdout: its header at once, then each strategy's row as soon as it has finished."""

    def __init__(self, evaluations, as_json: bool):
        self.evaluations = evaluations
        self.as_json = as_json
        self.table = Table()
        self.printed: set[int] = set()
        if not as_json:
            print(self.table.header(), flush=True)

    def ready(self, final: bool = False) -> list[int]:
        """The evaluations whose rows can be printed now, in order: those finished, up to the first one not
        finished (final: every one started)."""
        ready = []
        for i, e in enumerate(self.evaluations):
            if i in self.printed:
                continue
            if final and e.started or e.finished:
                ready.append(i)
            elif not final:
                break
        return ready

    def show(self, indices: list[int]) -> None:
        for i in indices:
            if not self.as_json:
                print(self.table.row(self.evaluations[i].result), flush=True)
            self.printed.add(i)


def _print_footer(evaluations) -> None:
    print(SEGMENTS_NOTE)
    if any(e.result.method["mode"] == "batched" for e in evaluations):
        print("Strategies read together share each forward: their tokens/s is each one's share of the batch's "
              "speed (--one-at-a-time measures each alone).")
    for e in evaluations:
        if e.result.error:
            print(f"{e.result.label()} failed: {e.result.error}")
    not_run = [e.result.label() for e in evaluations if not e.started]
    if not_run:
        print(f"not run: {', '.join(not_run)}")


def _save(evaluations, out: Path) -> dict[int, str]:
    """Write every started evaluation and the summary CSV; returns the files by evaluation index."""
    from kvviz import evaluation

    files: dict[int, str] = {}
    for i, e in enumerate(evaluations):
        if not e.started:
            continue
        path = out / f"eval-{i + 1}-{e.result.strategy['name']}.json"
        try:
            e.result.save(path)
        except OSError as exc:
            raise RuntimeError(f"cannot write {path}: {exc.strerror or exc}") from None
        files[i] = str(path)
    rows = [evaluation.summary_row(e.result, files.get(i)) for i, e in enumerate(evaluations) if e.started]
    try:
        evaluation.write_summary_csv(rows, out / "summary.csv")
    except OSError as exc:
        raise RuntimeError(f"cannot write {out / 'summary.csv'}: {exc.strerror or exc}") from None
    return files


def _json_result(run, file: str | None) -> dict:
    return {"strategy": run.strategy, "method": run.method, "document": run.document, "status": run.status,
            "error": run.error, "file": file, "summary": run.summary()}


# -- output -----------------------------------------------------------------------------------------


def _number(value: float | None, width: int, fixed: int | None = None) -> str:
    if value is None:
        return f"{'-':>{width}}"
    digits = fixed if fixed is not None else 2 if value < 100 else 1 if value < 10_000 else 0
    return f"{value:>{width}.{digits}f}"


class Table:
    """The per-strategy table: perplexity overall and by segment, cache size and speed, then the strategy."""

    COLUMNS = ("perplexity", "2nd half", "Q1", "Q2", "Q3", "Q4", "full", "evicted", "cache MiB", "policy MiB",
               "tokens/s")
    WIDTHS = (10, 8, 7, 7, 7, 7, 7, 7, 9, 10, 8)

    def header(self) -> str:
        return " ".join(f"{c:>{w}}" for c, w in zip(self.COLUMNS, self.WIDTHS, strict=True)) + "  strategy"

    def row(self, run) -> str:
        s = run.summary()
        quarters = [q["perplexity"] for q in s["quarters"]] + [None] * 4
        cache, policy = (None if s[key] is None else s[key] / 2**20 for key in ("final_cache_bytes",
                                                                                  "final_policy_bytes"))
        values = [s["perplexity"], s["second_half_perplexity"], *quarters[:4], s["before_eviction_perplexity"],
                  s["after_eviction_perplexity"], cache, policy, s["tokens_per_s"]]
        fixed = {"cache MiB": 2, "policy MiB": 3, "tokens/s": 1}
        cells = [_number(v, w, fixed.get(c)) for v, c, w in zip(values, self.COLUMNS, self.WIDTHS, strict=True)]
        notes = [run.status]
        if run.method.get("prompt"):
            notes.append(f"the first {run.method['prompt']:,} tokens fed as one prompt")
        if s["first_eviction"] is not None:
            notes.append(f"evicting from token {s['first_eviction']:,}")
        if run.method["mode"] == "chunked":
            notes.append(f"{run.method['chunk']} tokens per forward")
        elif run.method["mode"] == "batched":
            notes.append(f"one of {run.method['rows']} strategies per forward")
        return " ".join(cells) + f"  {run.label()}: {', '.join(notes)}"


class Progress:
    """The strategies running, tokens done, speed and time left (these and in all) on stderr: one line
    rewritten twice a second on a terminal, else a line every 15 seconds."""

    def __init__(self, evaluations):
        self.evaluations = evaluations
        self.tty = sys.stderr.isatty()
        self.started: dict[int, float] = {}  # when each evaluation's first record came
        self.last_shown = 0.0
        self.rates: dict[str, float] = {}  # tokens/s by evaluation mode, as seen so far

    def update(self, index: int) -> None:
        now = time.monotonic()
        self.started.setdefault(index, now)
        e = self.evaluations[index]
        done, total = len(e.result.records), e.predictions
        elapsed = now - self.started[index]
        if elapsed <= 0 or now - self.last_shown < (0.5 if self.tty else 15.0):
            return
        self.last_shown = now
        rate = done / elapsed
        self.rates[e.result.method["mode"]] = rate
        left = (total - done) / rate
        later = [(x.predictions, self.rates.get(x.result.method["mode"])) for x in self.evaluations if not x.started]
        in_all = left + sum(n / r for n, r in later if r)
        unknown = "+" if any(r is None for _, r in later) else ""
        running = [i for i, x in enumerate(self.evaluations) if x.started and not x.finished] or [index]
        what = e.result.label() if len(running) == 1 else f"{len(running)} strategies, one batch row each"
        line = (f"kvviz: [{','.join(str(i + 1) for i in running)}/{len(self.evaluations)}] {what}: "
                f"{done:,}/{total:,} tokens, {rate:.1f} tokens/s, {_clock(left)} left"
                + (f", {_clock(in_all)}{unknown} in all" if later else ""))
        if self.tty:
            print(f"\r{line}\033[K", end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def clear(self) -> None:
        if self.tty and self.last_shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


# -- kvviz trace FILE --------------------------------------------------------------------------------


def show_eval_run(run, path, as_json: bool) -> None:
    """The summary of a kept evaluation file (`kvviz trace FILE`)."""
    if as_json:
        print(json.dumps(_json_result(run, str(path)), indent=2, allow_nan=False))
        return
    doc = run.document
    print(f"kvviz evaluation of {run.model.get('name', '?')} on {doc['name']} ({doc['tokens']:,} tokens, "
          f"{run.method['mode']}), {run.status}" + (f": {run.error}" if run.error else ""))
    table = Table()
    print(table.header())
    print(table.row(run))
    print(SEGMENTS_NOTE)
