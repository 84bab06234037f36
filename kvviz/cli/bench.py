"""`kvviz bench`: kvviz's decode speed against plain `model.generate` in a fresh process; `--gui` for the window;
`--sweep` and `--eval` for how long `kvviz choose` and `kvviz eval` take to read a text, beside plain generate's
speed (a sweep also against its compute-bound floor, timed in the same run)."""

from __future__ import annotations

import json
import operator
import sys
from pathlib import Path

from kvviz.cli import common
from kvviz.errors import UsageError

DECODE_STRATEGIES = "dynamic,static,quantized,sliding,sink,none"
EVAL_STRATEGIES = "dynamic,sliding:window=256,sink:sink_tokens=4:window=252,h2o:budget=256"
FIRST_TOKEN_STRATEGIES = ("dynamic,dynamic:prefill_chunk=256,sink:sink_tokens=4:window=252,"
                          "sink:sink_tokens=4:window=252:prefill_chunk=256,snapkv:budget=250,kvzip:budget=500")
READ_TOKENS = 2000
FLOOR_FORWARDS = 32
REPEATS = 3
GUI_REPEATS = 5  # the window's ratio is read against 0.95: more pairs of runs than the headless bench's
SERVE_REQUESTS = 8
SERVE_LEVELS = "1,2,4,8"
SERVE_POOL = {"page_size": 16, "blocks": 256, "max_batch_tokens": 256}  # 8 requests never wait for a block
COMPARISONS = {">=": operator.ge, "<": operator.lt, "<=": operator.le}  # of the targets the benches print


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="measure the decoder's overhead against model.generate")
    common.add_model_args(bench)
    bench.add_argument(
        "--strategies", metavar="LIST",
        help="comma-separated NAME or NAME:KEY=VALUE:KEY=VALUE, as for compare (default: "
        f"{DECODE_STRATEGIES}; with --eval: {EVAL_STRATEGIES}; with --sweep: kvviz choose's default grid)",
    )
    bench.add_argument("--new-tokens", type=int, default=128, help="tokens per measured run (default 128)")
    bench.add_argument("--repeats", type=int, help="interleaved repeats per strategy; with --sweep or --eval, plain "
                       "generate's runs, half before the reading and half after (default 3; with --gui 5)")
    bench.add_argument("--out", type=Path, default=Path("bench.json"), help="write the figures here as JSON "
                       "(default: bench.json)")
    mode = bench.add_mutually_exclusive_group()
    mode.add_argument("--gui", action="store_true", help="measure the window instead (needs the Qt window)")
    mode.add_argument("--sweep", action="store_true", help="time kvviz choose's reading of a text through the "
                      "strategies (the exact cache added) against its compute-bound floor")
    mode.add_argument("--eval", action="store_true", help="time kvviz eval's reading of a text through the strategies")
    mode.add_argument("--first-token", action="store_true",
                      help="serve one request of the text's first --tokens tokens up to its first token through each "
                      "strategy: the peak memory and time kvviz measures against plain model.generate's in fresh "
                      "processes (every allocation counted), and kvviz's prediction at --second tokens beside a "
                      f"measurement there (default strategies: {FIRST_TOKEN_STRATEGIES})")
    mode.add_argument("--serve", action="store_true",
                      help="serve --requests requests of the built-in text through kvviz serve, against "
                      "transformers' own generate_batch of the same requests (kvviz's overhead), then at each "
                      "--concurrency against plain generate of one request after another; fresh processes")
    text = bench.add_mutually_exclusive_group()
    text.add_argument("--text", type=Path, metavar="FILE", help="with --sweep, --eval or --first-token: a .txt or .md "
                      "file to read")
    text.add_argument("--builtin", metavar="NAME", help="with --sweep, --eval or --first-token: a text shipped with "
                      "kvviz (default: alice)")
    bench.add_argument("--tokens", type=int, default=READ_TOKENS, metavar="N",
                       help=f"with --sweep, --eval or --first-token: tokens of the text read (default {READ_TOKENS:,})")
    bench.add_argument("--second", type=int, metavar="N",
                       help="with --first-token: the second length, predicted and measured (default half of --tokens)")
    bench.add_argument("--rows", type=int, metavar="N", help="with --sweep: configurations per batched forward "
                       "answering questions, as kvviz choose's")
    bench.add_argument("--requests", type=int, default=SERVE_REQUESTS, metavar="N",
                       help=f"with --serve: requests served (default {SERVE_REQUESTS})")
    bench.add_argument("--concurrency", default=SERVE_LEVELS, metavar="LIST",
                       help=f"with --serve: the requests per batch compared, comma-separated (default {SERVE_LEVELS})")
    bench.add_argument("--floor-forwards", type=int, default=FLOOR_FORWARDS, metavar="N",
                       help=f"with --sweep: forwards of the floor timed, the median kept (default {FLOOR_FORWARDS})")


def command(args) -> int:
    if args.repeats is None:
        args.repeats = GUI_REPEATS if args.gui else REPEATS
    # a rate is read between the first and the last new token: two at least
    for name, least in (("repeats", 1), ("new_tokens", 2), ("rows", 1), ("floor_forwards", 1)):
        value = getattr(args, name)
        if value is not None and value < least:
            raise UsageError(f"--{name.replace('_', '-')} must be at least {least}, not {value}")
    if args.gui:
        try:
            from kvviz.qt.tools.bench import run_gui_bench
        except ImportError as exc:
            raise RuntimeError(f"the window benchmark is not available: {exc}") from None
        figures = run_gui_bench(
            model=args.model, new_tokens=args.new_tokens, repeats=args.repeats,
            progress=lambda message: common.progress(message, None),
        )
        print_gui_bench(figures)
    elif args.sweep or args.eval:
        figures = _reading(args)
        print_reading(figures)
    elif args.first_token:
        figures = _first_token(args)
        print_first_token(figures)
    elif args.serve:
        figures = _serve(args)
        print_serve(figures)
    else:
        from kvviz.engine.bench import run_bench

        choices = common.strategy_list(args.strategies or DECODE_STRATEGIES)
        figures = run_bench(
            args.model, choices, args.new_tokens, args.repeats, dtype=args.dtype, device=args.device,
            log=common.progress,
        )
        print_bench(figures)
    args.out.write_text(json.dumps(figures, indent=2))
    print(f"kvviz: wrote {args.out}", file=sys.stderr)
    return 0


def _reading(args) -> dict:
    from kvviz.engine.bench import reading_bench
    from kvviz.files.evaluation import token_count_problem

    problem = token_count_problem(args.tokens)
    if problem:
        raise UsageError(f"--tokens: {problem}")
    if args.text is None and args.builtin is None:
        args.builtin = "alice"
    document = common.document(args)
    listed = args.strategies or (None if args.sweep else EVAL_STRATEGIES)
    choices = common.strategy_list(listed) if listed else None
    return reading_bench(args.model, document, args.tokens, choices, args.sweep, args.rows, args.floor_forwards,
                         args.repeats, args.new_tokens, dtype=args.dtype, device=args.device, log=common.progress)


def _first_token(args) -> dict:
    from kvviz.engine.bench import first_token_bench
    from kvviz.files.evaluation import token_count_problem

    second = args.second if args.second is not None else args.tokens // 2
    problem = token_count_problem(args.tokens) or ("" if 1 <= second else f"--second must be at least 1, not {second}")
    if problem:
        raise UsageError(problem if problem.startswith("--") else f"--tokens: {problem}")
    if args.text is None and args.builtin is None:
        args.builtin = "alice"
    document = common.document(args)
    choices = common.strategy_list(args.strategies or FIRST_TOKEN_STRATEGIES)
    text = document.text[: (args.tokens + 1) * 32]  # more characters than the tokens can span (evaluate.tokenize)
    return first_token_bench(args.model, choices, text, args.tokens, second, args.repeats, dtype=args.dtype,
                             device=args.device, log=common.progress)


def _serve(args) -> dict:
    from kvviz.engine.bench import serve_bench

    try:
        levels = [int(level) for level in args.concurrency.split(",") if level.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1 or args.requests < 1:
        raise UsageError(f"--serve needs --requests of at least 1 and --concurrency as numbers of at least 1 "
                         f"separated by commas (such as {SERVE_LEVELS}), got {args.requests} and "
                         f"{args.concurrency!r}")
    return serve_bench(args.model, args.requests, args.new_tokens, args.repeats, levels, **SERVE_POOL,
                       dtype=args.dtype, device=args.device, log=common.progress)


def print_serve(figures: dict) -> None:
    import statistics

    print(f"{figures['requests']} requests of {figures['new_tokens']} new tokens at most on {figures['model']}, a pool "
          f"of {figures['blocks']} blocks of {figures['page_size']} tokens; reference: {figures['reference']}")
    print(f"kvviz serve against generate_batch: {figures['ratio']:.3f} of its throughput (median of "
          f"{figures['repeats']} interleaved runs; kvviz "
          + ", ".join(f"{r:.1f}" for r in figures["kvviz_tokens_per_s"]) + " tokens/s, generate_batch "
          + ", ".join(f"{r:.1f}" for r in figures["generate_batch_tokens_per_s"]) + ")")
    each = statistics.mean(figures["generate_each_tokens_per_s"])
    print(f"plain generate, one request after another: {each:.1f} tokens/s (before and after: "
          + ", ".join(f"{r:.1f}" for r in figures["generate_each_tokens_per_s"]) + ")")
    for level, rate in figures["concurrency"].items():
        print(f"  concurrency {level:>3}: {rate:.1f} tokens/s, {rate / each:.2f}x one after another")
    print("answers: " + ("the same on every side" if figures["same_answers"] else "NOT the same on every side"))


def print_first_token(figures: dict) -> None:
    from kvviz.present import UNKNOWN, seconds, size

    def share(ours, theirs) -> str:
        return UNKNOWN if ours is None or not theirs else f"{ours / theirs:.3f}"

    print(f"one request served up to its first token on {figures['model']}, {figures['tokens']:,} tokens, median of "
          f"{figures['repeats']} interleaved runs; reference: {figures['reference']}")
    rows = [("strategy", "peak kvviz", "generate", "ratio", "TTFT kvviz (s)", "generate", "ratio",
             f"peak at {figures['second']:,}: predicted", "measured", "TTFT predicted", "measured")]
    for label, r in figures["strategies"].items():
        if "skipped" in r:
            rows.append((label, f"skipped: {r['skipped']}", *[""] * 9))
            continue
        there = r["second"]
        peak_off = there["predicted_peak_bytes"] / there["peak_bytes"] - 1
        ttft_off = there["predicted_ttft_ms"] / there["ttft_ms"] - 1
        rows.append((label, size(r["kvviz_peak_bytes"]), size(r["generate_peak_bytes"]),
                     share(r["kvviz_peak_bytes"], r["generate_peak_bytes"]), seconds(r["kvviz_ttft_ms"]),
                     seconds(r["generate_ttft_ms"]), share(r["kvviz_ttft_ms"], r["generate_ttft_ms"]),
                     f"{size(there['predicted_peak_bytes'])} ({peak_off:+.1%})", size(there["peak_bytes"]),
                     f"{seconds(there['predicted_ttft_ms'])} ({ttft_off:+.1%})", seconds(there["ttft_ms"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                        for i, (cell, width) in enumerate(zip(row, widths, strict=True))))


def print_reading(figures: dict) -> None:
    from kvviz.present import UNKNOWN, clock, counted

    what = "kvviz choose's sweep" if figures["reading"] == "sweep" else "kvviz eval"
    configurations = figures["configurations"]
    print(f"{what}: {counted(len(configurations), 'configuration')} x {figures['tokens']:,} tokens of "
          f"{figures['document']} on {figures['model']}: {clock(figures['wall_s'])} ({figures['wall_s']:.1f} s)")
    if figures["reading"] == "sweep":
        floor = figures["floor_s"]
        if floor is None:
            print(f"compute-bound floor: {UNKNOWN} (the exact cache could not be cut back to half the text)")
        else:
            print(f"compute-bound floor: {clock(floor)} ({floor:.1f} s): {figures['tokens'] - 1:,} plain forwards of "
                  f"one token for {counted(figures['floor_rows'], 'row')} over a full cache of "
                  f"{figures['floor_tokens']:,} tokens, {floor * 1000 / (figures['tokens'] - 1):.1f} ms each (median "
                  f"of {figures['floor_forwards']} timed after the sweep)")
            print(f"share of the floor: {figures['floor_share']:.3f} (the sweep's time over the floor's)")
    runs = ", ".join(f"{rate:.2f}" for rate in figures["generate_runs"])
    print(f"plain generate: {figures['generate_tokens_per_s']:.2f} tokens/s ({figures['new_tokens']} new tokens, "
          f"model.generate in fresh processes: {runs})")
    print(f"machine: load average {figures['load_before']:.2f} before, {figures['load_after']:.2f} after; "
          f"{figures['threads']} torch threads")
    width = max(len(c["label"]) for c in configurations)
    for c in configurations:
        shown = UNKNOWN if c["perplexity"] is None else repr(c["perplexity"])
        print(f"  {c['label']:<{width}}  perplexity {shown:<20}  {c['status']}")


def verdict(value: float | None, target: str) -> str:
    """Whether `value` meets `target` (">= 0.95", "< 33", "<= 2"), in a word: a figure rounded for print can read as
    its target (0.9498 prints as 0.950), so the bench says which side it is on."""
    if value is None:
        return "unknown"
    comparison, bound = target.split()
    return "met" if COMPARISONS[comparison](value, float(bound)) else "missed"


def print_gui_bench(figures: dict) -> None:
    from kvviz.present import ms, number

    print(f"{figures['model']}, {figures['strategy']}, {figures['new_tokens']} new tokens, median of "
          f"{len(figures['tokens_per_s_window_runs'])} interleaved runs; reference: {figures['reference']}; a "
          "ratio is the median of each run over the mean of the reference runs just before and after it")
    print(f"{'':<24} {'tokens/s':>9} {'ratio':>7}   target")
    targets = figures["targets"]
    print(f"{'model.generate':<24} {figures['tokens_per_s_generate']:>9.2f}")
    for label, key in (("kvviz headless", "headless"), ("kvviz window", "window")):
        ratio, target = figures[f"{key}_over_generate"], targets[f"{key}_over_generate"]
        print(f"{label:<24} {figures[f'tokens_per_s_{key}']:>9.2f} {number(ratio, 4):>7}   {target}: "
              f"{verdict(ratio, target)}")
    stalls = ", ".join(ms(value) for value in figures["worst_stall_ms_runs"])
    print(f"worst event-loop stall while generating: {ms(figures['worst_stall_ms'])} "
          f"(per run: {stalls}; target {targets['worst_stall_ms']} ms: "
          f"{verdict(figures['worst_stall_ms'], targets['worst_stall_ms'])})")
    growth = figures["redraw_long_over_short"]
    print(f"token view redraw: {ms(figures['redraw_ms_short'])} at {figures['short_tokens']} tokens, "
          f"{ms(figures['redraw_ms_long'])} at {figures['long_tokens']} ({figures['long_model']} model), ratio "
          f"{number(growth, 3)} (target {targets['redraw_long_over_short']}: "
          f"{verdict(growth, targets['redraw_long_over_short'])})")


def print_bench(figures: dict) -> None:
    from kvviz.present import UNKNOWN, number

    print(f"decode tokens/s, {figures['new_tokens']} new tokens, median of {figures['repeats']} interleaved runs; "
          f"reference: {figures['reference']}; a ratio is the median of each run over the mean of the reference runs "
          "just before and after it")
    width = max([len("strategy"), *map(len, figures["strategies"])])
    print(f"{'strategy':<{width}} {'generate':>9} {'kvviz':>9} {'ratio':>7}")
    for label, row in figures["strategies"].items():
        if "skipped" in row:
            print(f"{label:<{width}} skipped: {row['skipped']}")
            continue
        generate, ours = row["generate_tokens_per_s"], row["kvviz_tokens_per_s"]
        print(f"{label:<{width}} {generate:>9.2f} {ours:>9.2f} {row['ratio']:>7.3f}")
    bandwidth = figures["bandwidth_bytes_per_s"]
    shown = UNKNOWN if bandwidth is None else f"{number(bandwidth / 1e9)} GB/s"
    print(f"memory read bandwidth: {shown} (kept for the memory-bound floor)")
