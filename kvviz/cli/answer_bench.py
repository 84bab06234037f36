"""`kvviz answer-bench`: how long asking questions takes. Needle items kvviz writes, asked of a grid of cache
configurations in the query-agnostic and query-aware regimes (the figure the issue targets: the default model, 10
items of 1,000 tokens and 12 configurations, under 3 minutes on this machine), and with `--decode-time` the
decode-time regime apart (every token of every item read through every configuration one at a time). It prints
each regime's time, the forwards it took, and each configuration's answers; `--out FILE` keeps them as JSON.

One-off costs (loading the model, quanto's kernel build) come before the clock starts. A benchmark, not a test:
it passes or fails nothing, it measures.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from kvviz.cli import common
from kvviz.errors import OptionError, UsageError
from kvviz.present import clock, counted

# the grid of the issue: the exact cache, 3 quantized, 2 sliding windows, 2 sinks, 2 H2O, TOVA and SnapKV
GRID = ("dynamic,quantized:backend=quanto:nbits=4,quantized:backend=hqq:nbits=4,quantized:backend=hqq:nbits=2,"
        "sliding:window=257,sliding:window=513,sink:sink_tokens=4:window=252,sink:sink_tokens=4:window=508,"
        "h2o:budget=256,h2o:budget=512,tova:budget=256,snapkv:budget=256")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "answer-bench", help="how long asking questions of a grid of caches takes (query-agnostic and query-aware, "
        "decode-time apart)",
        description="Time asking needle items of a grid of cache configurations, with each configuration's answers.")
    common.add_model_args(parser)
    parser.add_argument("--task", default="niah_single_1", metavar="NAME[,NAME]", help="tasks (default niah_single_1)")
    parser.add_argument("--items", type=int, default=10, metavar="N", help="items per task (default 10)")
    parser.add_argument("--length", type=int, default=1000, metavar="TOKENS", help="tokens per item (default 1,000)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="what the items are written from (default 0)")
    parser.add_argument("--configs", default=GRID, metavar="LIST",
                        help="configurations (default: the issue's 12: the exact cache, 3 quantized, 2 sliding, "
                        "2 sink, 2 h2o, tova, snapkv)")
    parser.add_argument("--regime", default="query-agnostic,query-aware", metavar="NAME[,NAME]",
                        help="the regimes timed together (default query-agnostic,query-aware)")
    parser.add_argument("--decode-time", action="store_true", help="also time the decode-time regime, apart")
    parser.add_argument("--raw", action="store_true", help="read the items as plain text, without the chat template")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write the figures and answers as JSON")


def command(args) -> int:
    if args.items < 1 or args.length < 1:
        raise UsageError("--items and --length must be at least 1")
    choices = common.strategy_list(args.configs)
    if args.out is not None:
        common.check_writable(args.out, "--out")
    from kvviz.engine import models, tasks
    from kvviz.engine.answering import Asking, regime_names
    from kvviz.engine.cache_run import CacheRun
    from kvviz.engine.qa_prompt import Rendering

    try:
        timed = regime_names(args.regime)
    except OptionError as exc:
        raise UsageError(f"--regime: {exc}") from None

    loaded = models.load_model(args.model, dtype=args.dtype, device=args.device,
                               progress=lambda message, fraction: common.log(message))
    rendering = Rendering(loaded.tokenizer, args.raw)
    try:
        names = tasks.task_names(args.task)
        items = tasks.generate(names, args.items, args.length, args.seed, 1, rendering.tokens)
    except OptionError as exc:
        raise UsageError(str(exc)) from None
    for choice in choices:  # one-off kernel builds before the clock
        try:
            CacheRun(loaded.model, choice, args.length, loaded.tokenizer).warm_up(common.log)
        except OptionError as exc:
            common.log(f"{choice.label()} cannot run here: {exc}")
    figures = {"model": loaded.card["name"], "items": len(items), "length": args.length,
               "configurations": [c.label() for c in choices], "regimes": {}}
    runs = [timed] + ([["decode-time"]] if args.decode_time and "decode-time" not in timed else [])
    answers: dict[str, list] = {}
    for regimes in runs:
        asking = Asking(loaded, choices, items, regimes, rendering.raw)
        common.log(f"{' + '.join(regimes)}: {counted(len(items), 'item')} of {args.length:,} tokens x "
                   f"{counted(len(choices), 'configuration')}")
        begun, cpu = time.perf_counter(), time.process_time()
        for regime, index in asking:
            common.log(f"  {regime}: item {index + 1} of {len(items)} after {clock(time.perf_counter() - begun)}")
        wall, cpu = time.perf_counter() - begun, time.process_time() - cpu
        figures["regimes"][" + ".join(regimes)] = {"wall_s": wall, "cpu_s": cpu, "forwards": asking.forwards,
                                                   "by_regime_s": dict(asking.seconds)}
        # the processor time of this process, all its threads: on a machine shared with other work, what the work
        # itself cost
        print(f"{' + '.join(regimes)}: {clock(wall)} ({wall:.1f} s; processor time {cpu:.1f} s), "
              f"{asking.forwards:,} forwards")
        for regime in regimes:
            answers[regime] = [[a.to_dict() for a in mine if a.regime == regime] for mine in asking.answers]
    print("\nconfiguration | " + " | ".join(f"{regime} answered" for regime in answers))
    for i, choice in enumerate(choices):
        cells = []
        for regime in answers:
            scores = [a["score"] for a in answers[regime][i]]
            cells.append("-" if None in scores else f"{sum(scores):g}/{len(scores)}")
        print(f"{choice.label()} | " + " | ".join(cells))
    if args.out is not None:
        args.out.write_text(json.dumps({**figures, "answers": answers}, indent=2))
        common.log(f"wrote {args.out}")
    return 0
