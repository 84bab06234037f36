"""`kvviz eval`: long-context perplexity of several cache strategies along one document, headless.

Each strategy reads the document through its own cache, a chunk of tokens per forward, each token attending to what it
would fed alone (strategies that evict at every token step through each chunk a token at a time; with `--token-by-token`
they are fed one token per forward, together, one batch row each, unless `--one-at-a-time`), and the command prints per
strategy the perplexity overall and over segments, the cache's size and the speed; `--out DIR` keeps one `kvviz-eval`
file per strategy and `summary.csv`. Ctrl-C or SIGTERM stops the evaluation, keeps and writes what was measured, keeps
the journals for `--resume`, and exits 130 or 143; a strategy that fails does not stop the others (exit status 1 then).
`kvviz trace FILE` prints a kept evaluation file's summary.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from kvviz import interrupts
from kvviz.cli import common
from kvviz.errors import UsageError
from kvviz.files.evaluation import ms_per_prediction, seconds_left
from kvviz.files.journal import differences, digest
from kvviz.present import clock, counted, mib, number, perplexity

SEGMENTS_NOTE = (
    "Q1-Q4: perplexity over each quarter of the predicted tokens (the same positions for every strategy); "
    "2nd half: over the last half.\n"
    "full / evicted: over the predictions made while the cache still held every earlier token, and after it had "
    "first dropped one (measured: the cache held fewer tokens than it had seen).\n"
    "policy MiB: what an evicting policy kept beside keys and values at the end (positions, H2O's attention sums)."
)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval", help="perplexity along a long document through each strategy's cache (StreamingLLM's evaluation)",
        description="Feed a document through each strategy's cache, a chunk per forward, each token attending to what "
        "it would fed alone (strategies that evict at every token step through each chunk a token at a time), and "
        "score "
        "every next token. Prints per strategy the perplexity overall, "
        "by quarter of the document and before/after the cache first dropped a token, the cache's size and tokens/s. "
        "Ctrl-C keeps and writes what was measured (with --out, --resume continues it).",
    )
    common.add_model_args(parser)
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
    parser.add_argument("--token-by-token", action="store_true",
                        help="feed the strategies that evict at every token one token per forward, as a decode does "
                        "(slower; their perplexities differ from the stepped chunks' by float rounding only); they "
                        "read the document together, one batch row each, sharing each forward's time")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="with --token-by-token, feed each strategy alone, so that its tokens/s is its own")
    parser.add_argument("--out", type=Path, metavar="DIR", help="write a kvviz-eval file per strategy and summary.csv "
                        "(each kept as a journal while it is measured, so that a killed process loses almost nothing)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an evaluation stopped (Ctrl-C, SIGTERM) or killed in --out DIR (same model, "
                        "text, settings and strategies): strategies that ended are kept, those read in chunks continue "
                        "from their last whole forward, those fed token by token start again")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")


def command(args) -> int:
    from kvviz.files import evaluation

    problem = evaluation.token_count_problem(args.tokens)
    if problem:
        raise UsageError(f"--tokens: {problem}")
    document = common.document(args)
    out = common.out_folder(args.out)
    from kvviz.engine import evaluate, evaluate_many, models

    choices = common.strategy_list(args.strategies)
    loaded = models.load_model(args.model, dtype=args.dtype, device=args.device,
                               progress=lambda message, fraction: common.log(message))
    ids, record, notice = evaluate.prepare(loaded, document, choices, args.tokens)
    if notice:
        common.log(notice)
    # every strategy is checked against the model before any work
    evaluations = [evaluate.Evaluation(loaded, c, ids, record, stepped=not args.token_by_token) for c in choices]
    common.log(f"{loaded.card['name']}, document {document.name}, {counted(len(ids), 'token')}, "
               f"{counted(len(choices), 'strategy', 'strategies')}")
    kept = _journals(out, evaluations, _resume_key(args, loaded.card, ids, choices), args.resume) if out else []
    rows = Rows(evaluations, args.json)
    progress = Progress(evaluations)
    interrupted = None
    try:
        for index, _ in evaluate_many.evaluate_all(evaluations, together=not args.one_at_a_time):
            for e, journal in zip(evaluations, kept, strict=False):  # what was measured, on disk as it comes
                if not journal.ended:
                    journal.update(end=e.finished)
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
        # what came since, and how each ended; also for an evaluation that yielded nothing here (a resumed exact
        # cache whose journal already held every record only rebuilds its cache), whose journal must still go
        for e, journal in zip(evaluations, kept, strict=False):
            if not journal.ended:
                journal.update(end=e.finished)
        progress.clear()
        rows.show(rows.ready(final=True))
        files = _save(evaluations, kept, out, keep_journals=interrupted is not None) if out else {}
        if args.json:
            print(json.dumps([_json_result(e.result, files.get(i)) for i, e in enumerate(evaluations) if e.started],
                             indent=2, allow_nan=False))
        else:
            _print_footer(evaluations)
        if out:
            common.log(f"wrote {len(files)} evaluation file(s) and {out / 'summary.csv'}")
            if interrupted is not None and any(j.journal.started for j in kept):
                common.log(f"the journals stay in {out}: the same command with --resume continues this evaluation")
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


def _resume_key(args, card: dict, ids: list[int], choices) -> dict:
    """What an evaluation's journal keeps for `--resume` to check: the same model, tokens, settings and
    strategies give the same numbers."""
    return {
        "model": card,
        "tokens_sha256": digest(ids),
        "settings": {"tokens": args.tokens, "token_by_token": args.token_by_token,
                     "one_at_a_time": args.one_at_a_time},
        "strategies": [{"name": c.name, "options": dict(c.options)} for c in choices],
    }


def _journals(out: Path, evaluations, key: dict, resume: bool) -> list:
    """A journal per evaluation (`EvalJournal`, written as records arrive); with `resume`, what the journals a killed
    evaluation left in `out` hold is taken up first (`Evaluation.resume`), after checking they match `key`."""
    from kvviz.files import evaluation

    journals = [evaluation.EvalJournal(_file(out, i, e), e.result, dict(key, index=i))
                for i, e in enumerate(evaluations)]
    left = sorted(out.glob("eval-*.json.journal"))
    if not resume:
        if left:
            common.log(f"{out} holds the journal of an evaluation that did not end ({left[0].name}); this one replaces "
                       "it (--resume would have continued it)")
        return journals
    if not left:
        raise UsageError(f"--resume: {out} holds no journal to resume (an evaluation that ended wrote its files and "
                         "removed its journals)")
    for path in left:
        try:
            found = evaluation.read_journal(path)
        except evaluation.EvalFileError as exc:
            raise UsageError(f"--resume: {exc}") from None
        theirs = {k: v for k, v in found.resume.items() if k != "index"}
        differing = differences(theirs, key, {
            "model": "the model", "tokens_sha256": "the document's tokens",
            "settings": "--tokens, --token-by-token or --one-at-a-time", "strategies": "the strategies"})
        if differing:
            raise UsageError(f"--resume: {path} was measured with other settings than these, so its numbers would not "
                             "continue: " + "; ".join(differing))
        i = found.resume.get("index")
        if not isinstance(i, int) or not 0 <= i < len(evaluations) or journals[i].path != path.with_suffix(""):
            raise UsageError(f"--resume: {path} is not the journal of one of these strategies")
        common.log(evaluations[i].resume(found.run, found.ended in ("finished", "error")))
        journals[i].run = evaluations[i].result
        if evaluations[i].finished:  # kept whole: its journal is written again at once, ended
            journals[i].update(end=True)
    return journals


def _file(out: Path, i: int, e) -> Path:
    from kvviz.files.evaluation_csv import file_name

    return out / file_name(i, e.result.strategy)


def _save(evaluations, journals, out: Path, keep_journals: bool) -> dict[int, str]:
    """Write every started evaluation and the summary CSV, then remove the journals unless `keep_journals` (an
    interrupted evaluation: `--resume` continues from them); returns the files by evaluation index."""
    from kvviz.files import evaluation_csv

    files: dict[int, str] = {}
    for i, e in enumerate(evaluations):
        if not e.started:
            continue
        journal = journals[i]
        if journal.journal.problem:
            common.log(journal.journal.problem)
        try:
            path = journal.save()
        except OSError as exc:
            raise RuntimeError(f"cannot write {journal.path}: {exc.strerror or exc}") from None
        files[i] = str(path)
    rows = [evaluation_csv.summary_row(e.result, files.get(i)) for i, e in enumerate(evaluations) if e.started]
    try:
        evaluation_csv.write_summary_csv(rows, out / "summary.csv")
    except OSError as exc:
        raise RuntimeError(f"cannot write {out / 'summary.csv'}: {exc.strerror or exc}") from None
    for journal in journals:  # only now: killed before this, --resume still finds every journal
        if keep_journals:
            journal.journal.close()
        else:
            journal.remove()
    return files


def _json_result(run, file: str | None) -> dict:
    return {"strategy": run.strategy, "method": run.method, "document": run.document, "status": run.status,
            "error": run.error, "file": file, "summary": run.summary()}


# -- output -----------------------------------------------------------------------------------------


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
        texts = [perplexity(value) for value in (s["perplexity"], s["second_half_perplexity"], *quarters[:4],
                                                  s["before_eviction_perplexity"], s["after_eviction_perplexity"])]
        texts += [mib(s["final_cache_bytes"], unit=False), mib(s["final_policy_bytes"], 3, unit=False),
                  number(s["tokens_per_s"])]
        cells = [f"{text:>{width}}" for text, width in zip(texts, self.WIDTHS, strict=True)]
        notes = [run.status]
        if run.method.get("prompt"):
            notes.append(f"the first {run.method['prompt']:,} tokens fed as one prompt")
        if s["first_eviction"] is not None:
            notes.append(f"evicting from token {s['first_eviction']:,}")
        if run.method["mode"] == "chunked":
            notes.append(f"up to {run.method['chunk']} tokens per forward")
        elif run.method["mode"] == "batched":
            notes.append(f"one of {run.method['rows']} strategies per forward")
        return " ".join(cells) + f"  {run.label()}: {', '.join(notes)}"


class Progress:
    """The strategies running, tokens done, speed and time left (these and in all) on stderr: one line
    rewritten twice a second on a terminal, else a line every 15 seconds."""

    def __init__(self, evaluations):
        self.evaluations = evaluations
        self.tty = sys.stderr.isatty()
        self.last_shown = 0.0

    def update(self, index: int) -> None:
        now = time.monotonic()
        e = self.evaluations[index]
        ms = ms_per_prediction(e.result)
        if ms is None or now - self.last_shown < (0.5 if self.tty else 15.0):
            return
        self.last_shown = now
        running = [x for x in self.evaluations if x.started and not x.finished] or [e]
        left, _ = seconds_left([(x.result, x.predictions) for x in running])
        in_all, complete = seconds_left([(x.result, len(x.result.records) if x.finished else x.predictions)
                                         for x in self.evaluations])
        later = any(not x.started for x in self.evaluations)
        what = e.result.label() if len(running) == 1 else f"{len(running)} strategies, one batch row each"
        numbers = ",".join(str(self.evaluations.index(x) + 1) for x in running)
        line = (f"kvviz: [{numbers}/{len(self.evaluations)}] {what}: {len(e.result.records):,}/{e.predictions:,} "
                f"tokens, {number(1000.0 / ms)} tokens/s, {clock(left)} left"
                + (f", {clock(in_all)}{'' if complete else '+'} in all" if later else ""))
        if self.tty:
            print(f"\r{line}\033[K", end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def clear(self) -> None:
        if self.tty and self.last_shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


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
