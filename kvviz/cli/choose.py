"""`kvviz choose`: which cache should this model use? A sweep of cache configurations along the user's text, the
memory each needs at the user's context and number of sequences, the frontier and the answer.

Every configuration reads the text through its own cache and is compared at each prediction with the exact
cache (`kvviz.engine.sweep`); its row is printed as soon as it has finished. With `--task` or `--qa` every
configuration is also asked questions first (tasks kvviz writes, the user's own, or a kept conversation's), in the
regimes asked, and its accuracy stands beside its perplexity. Then the answer: the smallest cache within the
tolerance and the best quality within the budget, never one that answers worse than the accuracy tolerance.
`--out DIR` keeps the sweep (sweep.json, a kvviz-sweep file the window opens), sweep.csv, report.md and the
frontier picture (frontier.png, frontier.svg), and journals the sweep as it goes (each configuration as it finishes,
the answers to each item as they are given), so that `--resume` continues a sweep killed or stopped. Ctrl-C or
SIGTERM keeps and writes the configurations that finished.

Exit status: 0 when some configuration meets the tolerance and some fits the budget, 3 when none does (the
nearest is named), 2 for a mistake in the arguments, 130/143 when stopped.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from kvviz import interrupts
from kvviz.cli import common
from kvviz.errors import OptionError, UsageError, failure
from kvviz.files import documents, evaluation, qa
from kvviz.files.frontier import BUDGET_FORMS, TOLERANCE_FORMS, accuracy_loss, answer, frontier, memory, quality_loss
from kvviz.files.sweep import BUDGET_COVERS
from kvviz.files.sweep_report import by_memory, cells, columns, csv_row, keep, question_text, speed_text
from kvviz.present import clock, counted

PROGRESS_S = 10.0
NOT_MET = 3  # exit status: no configuration meets the tolerance, or none fits the budget
TOKENS = 2000
ITEMS, LENGTH = 5, 1000  # generated items per task, and the tokens each is written to fit


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "choose", help="which cache should I use? a sweep of configurations on your model and text, the "
        "quality-memory frontier and the memory each needs at your context length",
        description="Read a text through many cache configurations, compare each prediction with the exact cache "
        "(perplexity, KL, top-1 agreement), size each cache at the target context and number of sequences from its "
        "own size rule, and answer: the smallest cache within the tolerance, the best quality within the budget. "
        f"Exit status {NOT_MET} when no configuration meets one of them.",
    )
    common.add_model_args(parser)
    text = parser.add_mutually_exclusive_group()
    text.add_argument("--text", type=Path, metavar="FILE", help="a .txt or .md file of UTF-8 text")
    text.add_argument("--builtin", metavar="NAME", help="a text shipped with kvviz (default: alice)")
    text.add_argument("--conversation", type=Path, metavar="FILE",
                      help="a kept conversation (kvviz chat --trace), read as its messages one after another")
    parser.add_argument("--tokens", type=int, metavar="N",
                        help=f"measure the text's first N tokens (default {TOKENS:,}, or all of a shorter text)")
    parser.add_argument("--context", type=int, metavar="N",
                        help="the context length each sequence reaches in your application (default: the model's "
                        "maximum)")
    parser.add_argument("--sequences", type=int, default=1, metavar="N",
                        help="sequences held at once at that context, e.g. concurrent users (default 1)")
    parser.add_argument("--budget", default="free", metavar="SIZE",
                        help=f"memory for the caches (or, with --budget-covers process, for the whole process): "
                        f"{BUDGET_FORMS} (the default)")
    parser.add_argument("--budget-covers", choices=BUDGET_COVERS, default="cache",
                        help="what the budget bounds: the caches of the sequences (the default), or the whole process "
                        "serving them (the weights, one request's prefill at its peak and the other sequences' caches)")
    parser.add_argument("--no-first-token", action="store_true",
                        help="do not serve a request of the text's length through each configuration (its peak memory "
                        "and time to first token stay unknown; the sweep takes about a prefill less per configuration)")
    parser.add_argument("--tolerance", default="5%", metavar="T", help="quality you accept to lose: "
                        + TOLERANCE_FORMS.replace("%", "%%") + " (default 5%%)")  # argparse formats help with %
    parser.add_argument("--configs", metavar="LIST",
                        help="comma-separated configurations to try, as --strategies of kvviz eval (default: every "
                        "strategy available here at sensible settings; the exact cache is always added)")
    parser.add_argument("--rows", type=int, metavar="N",
                        help="configurations per batched forward answering questions (default 24; the text is read by "
                        "each alone, in chunks)")
    parser.add_argument("--quantized-alone", action="store_true",
                        help="answering questions, never feed quantized caches in a batch of rows: float rounding "
                        "moves a quantized cache's results by about 1%%")
    asked = parser.add_argument_group("questions", "ask every configuration questions too, and score its answers")
    given = asked.add_mutually_exclusive_group()
    given.add_argument("--task", metavar="NAME[,NAME]",
                       help="tasks kvviz writes: niah_single_1, niah_multikey_1, niah_multivalue, vt (RULER's) and "
                       "scbench_kv (SCBench's)")
    given.add_argument("--qa", type=Path, metavar="FILE",
                       help="your own questions: a JSONL file with kvpress's columns (context, question, answers, "
                       "optional answer_prefix and max_new_tokens), or a kept conversation (kvviz chat --trace), its "
                       "messages asked again turn after turn")
    asked.add_argument("--items", type=int, default=ITEMS, metavar="N", help=f"items per task (default {ITEMS})")
    asked.add_argument("--length", type=int, default=LENGTH, metavar="TOKENS",
                       help=f"tokens each task item is written to fit, questions and answers included (default "
                       f"{LENGTH:,})")
    asked.add_argument("--seed", type=int, default=0, metavar="S", help="what the task items are written from "
                       "(default 0; the same seed writes the same items)")
    asked.add_argument("--turns", type=int, default=1, metavar="N",
                       help="questions per task item, each with its own needle (default 1; the multi-turn regime "
                       "asks them one after another)")
    regimes = asked.add_mutually_exclusive_group()
    regimes.add_argument("--regime", metavar="NAME[,NAME]",
                         help=f"how the questions are fed: {', '.join(qa.REGIMES)} (default query-agnostic)")
    regimes.add_argument("--question-in-cache", action="store_true",
                         help="the query-aware regime: context and question compressed together")
    asked.add_argument("--raw", action="store_true", help="read context, question and answer prefix as plain text, "
                       "without the chat template")
    asked.add_argument("--accuracy-tolerance", type=float, default=5.0, metavar="POINTS",
                       help="accuracy you accept to lose against the exact cache's, in points (default 5)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="write sweep.json, sweep.csv, report.md, frontier.png and frontier.svg")
    parser.add_argument("--resume", action="store_true",
                        help="continue a sweep stopped (Ctrl-C, SIGTERM) or killed in --out DIR (same model, text, "
                        "question, configurations and questions asked): the configurations that finished and the "
                        "items answered are kept, the rest read again")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")


def _text(args):
    if args.conversation is not None:
        try:
            return documents.from_conversation(args.conversation)
        except documents.DocumentError as exc:
            raise UsageError(str(exc)) from None
    if args.text is None and args.builtin is None:
        args.builtin = "alice"
    return common.document(args)


def command(args) -> int:
    problem = evaluation.token_count_problem(args.tokens)
    if problem:
        raise UsageError(f"--tokens: {problem}")
    if args.rows is not None and args.rows < 1:
        raise UsageError(f"--rows must be at least 1, not {args.rows}")
    if args.context is not None and args.context < 1:
        raise UsageError(f"--context must be at least 1 token, not {args.context}")
    if args.sequences < 1:
        raise UsageError(f"--sequences must be at least 1, not {args.sequences}")
    if args.resume and args.out is None:
        raise UsageError("--resume continues the sweep journaled in --out DIR; give --out")
    configs = common.strategy_list(args.configs) if args.configs else None
    if configs is not None and not configs:
        raise UsageError("--configs names no configuration; give e.g. dynamic,sink:window=252")
    regimes = _regimes(args)
    document = _text(args)
    questions = _questions(args)
    out = common.out_folder(args.out)
    from kvviz.engine import evaluate, models, sweep, sweep_resume
    from kvviz.engine.qa_prompt import longest_reading

    loaded = models.load_model(args.model, dtype=args.dtype, device=args.device,
                               progress=lambda message, fraction: common.log(message))
    try:
        question = sweep.ask(loaded.model, args.context, args.sequences, args.budget, args.tolerance,
                             args.accuracy_tolerance / 100.0, args.budget_covers)
        asked = _asked(args, loaded, questions, regimes)
    except OptionError as exc:
        raise UsageError(str(exc)) from None
    tokens = args.tokens or TOKENS
    if configs is None:
        longest = longest_reading(asked, loaded.tokenizer) if asked else None
        configs, skipped = sweep.default_grid(loaded.model, tokens, longest)
        for reason in skipped:
            common.log(f"left out: {reason}")
    ids, record, notice = evaluate.prepare(loaded, document, sweep.with_reference(configs), tokens)
    if notice and args.tokens is None and len(ids) < tokens:
        notice = f"the text has {len(ids):,} tokens, fewer than the {tokens:,} a sweep reads by default: measuring all"
    if notice:
        common.log(notice)
    run = sweep.SweepRun(loaded, configs, ids, record, question, rows=args.rows or sweep.ROWS,
                         quantized_alone=args.quantized_alone, asked=asked, first_tokens=not args.no_first_token)
    common.log(f"{loaded.card['name']}, text {document.name}, {counted(len(ids), 'token')}, "
               f"{counted(len(run.sweep.configurations), 'configuration')}; target: {question_text(run.sweep)}")
    if asked:
        common.log(f"asking {counted(sum(len(i.turns) for i in asked.items), 'question')} of "
                   f"{counted(len(asked.items), 'item')} ({asked.source}) in {', '.join(asked.regimes)}, read "
                   f"{'as plain text' if asked.raw else 'in the chat template'}")
    journal, kept = _journal(out, run, sweep_resume.resume_key(run, args.budget), args.resume) if out else (None, [])
    table = Table(run.sweep, args.json)
    for config in kept:
        table.show(config)
    run.on_progress = Progress(run).update
    interrupted = None
    try:
        for config in run:
            table.show(config)
            if journal is not None and config.status != "cancelled":
                journal.finished(next(i for i, c in enumerate(run.sweep.configurations) if c is config),
                                 run.elapsed_s)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: keep what finished
        interrupted = exc
    with interrupts.deferred():  # a second Ctrl-C waits until what finished is shown and written
        result = run.sweep
        for config in result.configurations:  # those that did not finish: their rows say so
            table.show(config)
        said = _finish(result, out, args.json)
        if journal is not None:  # only now: killed before this, --resume still finds the journal
            if journal.journal.problem:
                common.log(journal.journal.problem)
            if interrupted is None:
                journal.remove()
            else:
                journal.journal.close()
                if journal.journal.started:
                    common.log(f"the journal stays in {out}: the same command with --resume continues this sweep")
    if interrupted is not None:
        raise interrupted
    return 0 if said.met else NOT_MET


def _journal(out: Path, run, key: dict, resume: bool):
    """The sweep's journal beside sweep.json (`SweepJournal`), and with `resume` the configurations the journal an
    earlier process left holds, taken up (`SweepRun.resume`) after checking it matches `key`."""
    from kvviz.engine import sweep_resume
    from kvviz.files.sweep import SweepJournal

    journal = SweepJournal(out / "sweep.json", run.sweep, key)
    left = journal.journal.path
    run.on_answered = journal.answered
    if not resume:
        if left.exists():
            common.log(f"{out} holds the journal of a sweep that did not end ({left.name}); this one replaces it "
                       "(--resume would have continued it)")
        return journal, []
    if not left.exists():
        raise UsageError(f"--resume: {out} holds no sweep journal to resume (a sweep that ended wrote its files and "
                         "removed its journal)")
    try:
        found, kept = sweep_resume.take_up(run, left, key)
    except OptionError as exc:
        raise UsageError(f"--resume: {exc}") from None
    journal.carry(found)
    count = len(run.sweep.configurations)
    said = f"--resume: {counted(len(found.finished), 'configuration')} of {count:,} kept as measured"
    if found.answered:
        said += f", the answers to {counted(len(found.answered), 'item')} kept"
    if len(found.finished) < count:
        said += "; the exact cache reads the text again (the reference the others are compared with)"
    common.log(said)
    return journal, kept


def _regimes(args) -> list[str]:
    from kvviz.engine.answering import regime_names

    if args.question_in_cache:
        return ["query-aware"]
    try:
        return regime_names(args.regime) if args.regime else ["query-agnostic"]
    except OptionError as exc:
        raise UsageError(f"--regime: {exc}") from None


def _questions(args) -> list | None:
    """The user's own questions (`--qa`), read and checked before any model is loaded; None without `--qa`. Refuses
    the question options that cannot apply."""
    if not 0 <= args.accuracy_tolerance <= 100:
        raise UsageError(f"--accuracy-tolerance is in points from 0 to 100, not {args.accuracy_tolerance:g}")
    for flag, value, default in (("--items", args.items, ITEMS), ("--length", args.length, LENGTH),
                                 ("--turns", args.turns, 1)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, not {value}")
        if value != default and not args.task:
            raise UsageError(f"{flag} sets how --task writes its items; give --task too")
    if args.qa is None:
        if (args.regime or args.question_in_cache or args.raw) and not args.task:
            raise UsageError("--regime, --question-in-cache and --raw say how questions are asked; give --task or "
                             "--qa too")
        return None
    try:
        return qa.read_asked(args.qa)
    except qa.QAFileError as exc:
        raise UsageError(str(exc)) from None


def _asked(args, loaded, questions: list | None, regimes: list[str]):
    """The questions to ask (an `Asked`), written for this model: the user's, or `--task`'s items; None for none."""
    from kvviz.engine.qa_prompt import asked

    if args.task is None and questions is None:
        return None
    source = args.qa.name if questions is not None else None
    return asked(loaded.tokenizer, regimes, args.raw, questions, source, args.task, args.items, args.length,
                 args.seed, args.turns)


def show_sweep(result, as_json: bool):
    """The sweep's speed, answer and frontier on stdout (or all of it as JSON); returns the answer."""
    said = answer(result)
    if as_json:
        print(json.dumps(_json(result, said), indent=2, allow_nan=False))
        return said
    print(f"\n{speed_text(result)}.")
    print("\n" + "\n".join(said.sentences))
    print("\n".join(said.caveats))
    print("frontier (no other configuration is both smaller at the target and better): "
          + "; ".join(f"{c.label} {memory(c, result.question.budget_covers):,} B" for c in frontier(result)))
    return said


def show_kept_sweep(result, path: Path, as_json: bool) -> None:
    """`kvviz trace` of a kept sweep: every configuration by memory at the target, then the answer."""
    if not as_json:
        print(f"{path}: {result.model.get('name')} on {result.document.get('name')}; {question_text(result)}")
    table = Table(result, as_json)
    for index in by_memory(result):
        table.show(result.configurations[index])
    show_sweep(result, as_json)


def _finish(result, out: Path | None, as_json: bool):
    """Show the sweep and keep it in `out` (None: nowhere); returns its answer."""
    said = show_sweep(result, as_json)
    if out is None:
        return said
    figures = {}
    try:
        from kvviz.qt.tools.figures import render_frontier  # Qt only here, and only to draw

        figures = render_frontier(result, out)
    except Exception as exc:  # noqa: BLE001 - the sweep and its table are kept whatever the drawing does
        common.log(f"the frontier picture was not drawn: {failure('drawing the frontier', exc)}")
    written = keep(result, out, figures)
    common.log(f"wrote {', '.join(path.name for path in written)} in {out}")
    return said


def _json(result, said) -> dict:
    rows = []
    for config in result.configurations:
        row = csv_row(result, config)
        row["quality_loss"] = quality_loss(result, config)
        if result.asked:
            row["accuracy_loss"] = accuracy_loss(result, config)
            row["answers"] = [a.to_dict() for a in config.answers]
        rows.append(row)
    return {
        "model": result.model.get("name"),
        "document": result.document.get("name"),
        "question": result.question.to_dict(),
        "speed": result.speed.to_dict(),
        "configurations": rows,
        "frontier": [c.label for c in frontier(result)],
        "asked": _asked_json(result.asked),
        "answer": {"smallest": said.smallest.label if said.smallest else None,
                   "best": said.best.label if said.best else None, "met": said.met,
                   "sentences": said.sentences, "caveats": said.caveats},
        "cancelled": result.cancelled,
    }


def _asked_json(asked) -> dict | None:
    """What was asked, as --json prints it: the items without their contexts (in sweep.json with --out)."""
    if asked is None:
        return None
    data = asked.to_dict()
    data["items"] = [{k: v for k, v in item.items() if k != "context"} for item in data["items"]]
    return data


class Progress:
    """How far the sweep is, on stderr every PROGRESS_S seconds."""

    def __init__(self, run):
        self.run = run
        self.said = time.monotonic()

    def update(self) -> None:
        if time.monotonic() - self.said < PROGRESS_S:
            return
        self.said = time.monotonic()
        done, total = self.run.progress()
        left, complete = self.run.seconds_left()
        known = left is not None and (complete or left >= 1)  # a bound of nothing says nothing
        time_left = f", {'about' if complete else 'at least'} {clock(left)} left" if known else ""
        common.log(f"{done / total:.0%} of the predictions made{time_left}")


class Table:
    """The configurations' rows on stdout, each once, as soon as it has finished (or, at the end, as it stands)."""

    def __init__(self, result, as_json: bool):
        self.result = result
        self.as_json = as_json
        self.shown: set[int] = set()
        self.keys = [key for key, _ in columns(result)]
        self.titles = dict(columns(result))
        if not as_json:
            print(" | ".join(self.titles[k] for k in self.keys), flush=True)

    def show(self, config) -> None:
        if id(config) in self.shown or self.as_json:
            return
        self.shown.add(id(config))
        row = cells(self.result, config)
        print(" | ".join(row[k] for k in self.keys), file=sys.stdout, flush=True)
