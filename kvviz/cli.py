"""The command line: headless runs, the strategy list, model cards and benchmarks.

Exit status: 0 success, 1 runtime failure, 2 usage or option error, 130 interrupted (Ctrl-C) and
143 terminated (SIGTERM), both after writing the partial trace. Errors print one paragraph;
``--debug`` adds the traceback. Only commands that run a model import torch: reading files,
listing strategies and attaching to a server start without it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

from kvviz import __version__, interrupts
from kvviz.attach_cli import add_attach_parser, cmd_attach
from kvviz.errors import ModelError, OptionError, UsageError
from kvviz.eval_cli import add_eval_parser, cmd_eval


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help="default, tiny, a model directory, a .gguf file or a hub id")
    parser.add_argument("--dtype", default="auto", help="auto (float32 on CPU), float32, bfloat16 or float16")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")


def _add_generation_args(parser: argparse.ArgumentParser) -> None:
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="the prompt text")
    prompt.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most (default 128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (1 = off)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    parser.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    parser.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvviz",
        description="See the key-value cache of a transformer language model while it generates. "
        "Without a command, opens the window.",
        epilog="window: kvviz [--model SPEC] [--theme dark|light] [--no-load] [--open TRACE ...] [--smoke-test]  "
        "(--smoke-test opens the window, runs 4 tokens on the tiny model and exits 0 on success)",
    )
    parser.add_argument("--version", action="version", version=f"kvviz {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="generate headlessly, print a summary and write a trace")
    _add_model_args(run)
    run.add_argument("--strategy", default="dynamic", help="cache strategy (see `kvviz strategies`)")
    run.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a strategy option (repeatable)"
    )
    _add_generation_args(run)
    run.add_argument(
        "--switch-at",
        action="append",
        default=[],
        metavar="STEP:STRATEGY[,KEY=VALUE...]",
        help="switch the live cache to another strategy before step STEP, e.g. 64:quantized,backend=hqq (repeatable)",
    )
    run.add_argument(
        "--reference",
        action="store_true",
        help="run a full-precision DynamicCache reference in lockstep and report KL and top-1 agreement",
    )
    run.add_argument("--trace", type=Path, help="write the trace here (default: kvviz-STRATEGY-TIME.json)")
    run.add_argument("--no-trace", action="store_true", help="do not write a trace file")
    run.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    run.add_argument("--quiet", action="store_true", help="do not stream the generated text")

    compare = sub.add_parser("compare", help="run one prompt through several strategies and write a report")
    _add_model_args(compare)
    compare.add_argument(
        "--strategies",
        default="dynamic,static,quantized,sink",
        help="comma-separated NAME or NAME:KEY=VALUE:KEY=VALUE, e.g. dynamic,quantized:backend=hqq:nbits=2",
    )
    _add_generation_args(compare)
    compare.add_argument("--no-reference", action="store_true", help="skip the fidelity reference (faster)")
    compare.add_argument("--out", type=Path, required=True, help="folder for traces, summary.csv and report.md")

    add_attach_parser(sub)
    add_eval_parser(sub)

    demo = sub.add_parser("demo", help="a scripted tour of the window, sized for a 1080p screen recording")
    demo.add_argument("--record", type=Path, default=None, help="record it to this MP4 (or GIF) file")
    demo.add_argument("--model", default="default", help="model for the tour (default: default)")
    demo.add_argument("--tokens", type=int, default=64, help="tokens per step of the tour (default 64)")

    strategies = sub.add_parser("strategies", help="list the cache strategies and their options")
    strategies.add_argument("--json", action="store_true", help="as JSON")

    model = sub.add_parser("model", help="load a model and print its card")
    _add_model_args(model)
    model.add_argument("--json", action="store_true", help="as JSON")
    model.add_argument(
        "--verify", action="store_true", help="hash the default model's converted copy in full; rebuild it if damaged"
    )

    trace = sub.add_parser("trace", help="check a trace file and print its summary")
    trace.add_argument("path", type=Path)
    trace.add_argument("--json", action="store_true", help="as JSON")

    bench = sub.add_parser("bench", help="measure the decoder's overhead against model.generate")
    _add_model_args(bench)
    bench.add_argument(
        "--strategies", default="dynamic,static,quantized,sliding,sink,none",
        help="comma-separated NAME or NAME:KEY=VALUE:KEY=VALUE, as for compare",
    )
    bench.add_argument("--new-tokens", type=int, default=128, help="tokens per measured run (default 128)")
    bench.add_argument("--repeats", type=int, default=3, help="interleaved repeats per strategy (default 3)")
    bench.add_argument("--out", type=Path, default=Path("bench.json"), help="write the figures here as JSON")
    bench.add_argument("--gui", action="store_true", help="measure the window instead (needs the Qt window)")
    return parser


# -- commands --------------------------------------------------------------------------------------


def _read_prompt(args) -> str:
    if args.prompt_file is not None:
        try:
            return args.prompt_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read the prompt file {args.prompt_file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise UsageError(f"the prompt file {args.prompt_file} is not UTF-8 text") from None
    if args.prompt is None:
        raise UsageError("give a prompt with --prompt TEXT or --prompt-file FILE")
    return args.prompt


def _settings(args):
    from kvviz.engine.decode import GenerationSettings

    return GenerationSettings(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        raw=args.raw,
        stop_at_eos=not args.ignore_eos,
    )


def _stderr_notice(message: str) -> None:
    if message:
        print(f"\nkvviz: {message}", file=sys.stderr, flush=True)


def _stderr_progress(message: str, fraction: float | None) -> None:
    pct = "" if fraction is None else f" [{fraction * 100:3.0f}%]"
    print(f"kvviz:{pct} {message}", file=sys.stderr, flush=True)


def parse_switches(specs: list[str]) -> dict[int, object]:
    """``["64:quantized,backend=hqq"]`` -> {64: StrategyChoice}; validated before any work."""
    from kvviz.engine import strategies

    switches = {}
    for spec in specs:
        step, sep, rest = spec.partition(":")
        if not sep or not step.strip().isdigit() or int(step) < 1 or not rest:
            raise UsageError(f"--switch-at expects STEP:STRATEGY[,KEY=VALUE...] with STEP >= 1, got {spec!r}")
        name, *pairs = rest.split(",")
        switches[int(step)] = strategies.choose(name.strip(), strategies.parse_assignments(pairs))
    return dict(sorted(switches.items()))


def _check_switch_order(first, switches, model) -> None:
    """Refuse, before the run, a switch that cannot convert whatever the cache holds (the rest: at the switch)."""
    from kvviz.engine.convert import refusal

    current = first
    for step, choice in switches.items():
        problem = refusal(current.name, choice, model, evicted=None)
        if problem:
            raise OptionError(f"--switch-at {step}: cannot switch from {current.name!r} to {choice.name!r}: {problem}")
        current = choice


def _trace_path(args, strategy: str) -> Path | None:
    """Where the run's trace goes, checked before any work so that a finished run is never lost to a bad path."""
    if args.no_trace:
        return None
    path = args.trace or Path(f"kvviz-{strategy}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"--trace {path} is a folder; give a file name such as {path / 'run.json'}")
    if not folder.is_dir():
        raise UsageError(f"cannot write the trace to {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"cannot write the trace to {path}: the folder {folder} is not writable")
    return path


def cmd_run(args) -> int:
    prompt = _read_prompt(args)
    from kvviz.engine import decode, models, strategies

    choice = strategies.choose(args.strategy, strategies.parse_assignments(args.set))
    switches = parse_switches(args.switch_at)
    settings = _settings(args)
    settings.check()
    trace_path = _trace_path(args, choice.name)
    loaded = models.load_model(args.model, dtype=args.dtype, device=args.device, progress=_stderr_progress)
    _check_switch_order(choice, switches, loaded.model)
    decoder = decode.Decoder(loaded, choice, settings, prompt, reference=args.reference, notify=_stderr_notice)
    stream = not (args.json or args.quiet)
    if not args.json:
        print(f"kvviz: {loaded.card['name']}, {choice.label()}, prompt {decoder.prompt_tokens} tokens", file=sys.stderr)
    interrupted = refused = None
    last_progress = time.monotonic()
    try:
        for step in decoder:
            if stream:
                sys.stdout.write(step.token)
                sys.stdout.flush()
            elif sys.stderr.isatty() and time.monotonic() - last_progress > 0.5:
                last_progress = time.monotonic()
                print(f"\rkvviz: {step.index + 1}/{settings.max_new_tokens} tokens", end="", file=sys.stderr)
            if step.index + 1 in switches:
                try:
                    decoder.request_switch(switches[step.index + 1])
                except OptionError as exc:  # refused by what the cache holds by now: the run stops, its trace kept
                    refused = OptionError(f"--switch-at {step.index + 1}: {exc}")
                    decoder.trace.error = str(refused)
                    break
    except KeyboardInterrupt as exc:
        decoder.trace.cancelled = True
        interrupted = exc
    if stream:
        print()
    if trace_path is not None:
        try:
            decoder.trace.save(trace_path)
        except OSError as exc:
            raise RuntimeError(f"cannot write the trace to {trace_path}: {exc.strerror or exc}") from None
    summary = decoder.trace.summary()
    if args.json:
        out = {"model": loaded.card["name"], "strategy": decoder.trace.strategy, "prompt_tokens": decoder.prompt_tokens}
        out.update(summary, cancelled=decoder.trace.cancelled, compile_ms=decoder.trace.compile_ms,
                   warm_up_ms=decoder.trace.warm_up_ms)
        out["trace"] = str(trace_path) if trace_path else None
        print(json.dumps(out, indent=2))
    else:
        _print_summary(decoder.trace, summary, trace_path)
    if refused:
        raise refused
    return interrupts.exit_status(interrupted) if interrupted else 0


def _print_summary(trace, summary, trace_path) -> None:
    from kvviz.present import mib, ms, number

    rows = [
        ("strategy", f"{trace.strategy['name']} {trace.strategy['options'] or ''}".strip()),
        ("tokens", f"{trace.prompt_tokens} prompt + {summary['new_tokens']} new" + (" (cancelled)" * trace.cancelled)),
        ("prefill", ms(summary["prefill_ms"])),
        ("decode", f"{ms(summary['decode_ms_mean'])} mean, {ms(summary['decode_ms_p95'])} p95"),
        ("speed", f"{number(summary['decode_tokens_per_s'])} tokens/s"),
        ("limit", _memory_bound(summary)),
        ("cache", f"{mib(summary['final_cache_bytes'])} at the end, {mib(summary['peak_cache_bytes'])} peak"),
        ("policy", f"{mib(summary['final_policy_bytes'], 3)} at the end, {mib(summary['peak_policy_bytes'], 3)} peak"),
        ("RSS", f"{mib(summary['peak_rss_bytes'])} peak"),
    ]
    if "mean_kl" in summary:
        first = summary["first_divergence"]
        first = "none" if first is None else f"at step {first}"
        agreement, kl = summary["top1_agreement"], summary["mean_kl"]
        rows.append(("fidelity", f"top-1 agreement {agreement:.3f}, mean KL {kl:.4f} nats, first divergence {first}"))
        rows.append(("reference", f"perplexity {summary['reference_perplexity']:.2f}; "
                     f"{ms(summary['reference_ms_mean'])} per step, not counted above"))
    for switch in trace.switches:
        change = f"{switch.from_strategy} -> {switch.to_strategy} {switch.options}"
        rows.append(("switch", f"before step {switch.step}: {change}"))
    if trace.compile_ms is not None:
        rows.append(("compile", f"{trace.compile_ms / 1000:.1f} s (not in the step times)"))
    if trace.warm_up_ms is not None:
        rows.append(("warm-up", f"{trace.warm_up_ms / 1000:.1f} s before the first step (not in the step times)"))
    if trace_path:
        rows.append(("trace", str(trace_path)))
    for key, value in rows:
        print(f"{key:>9}  {value}")


def _memory_bound(summary) -> str:
    """The memory-bound speed at the end of the run, and the share of it the run reached."""
    limit, share, bandwidth = (summary.get(k) for k in ("memory_bound_tokens_per_s", "share_of_memory_bound",
                                                         "bandwidth_bytes_per_s"))
    if limit is None:
        return "-"
    reached = "" if share is None else f"; this run reached {share:.0%} of it"
    return f"{limit:.1f} tokens/s memory-bound (weights + cache read at {bandwidth / 1e9:.1f} GB/s){reached}"


def cmd_compare(args) -> int:
    from kvviz.compare import compare, parse_strategy_list

    prompt = _read_prompt(args)
    choices = parse_strategy_list([s for s in args.strategies.split(",") if s.strip()])
    settings = _settings(args)
    settings.check()
    path = compare(
        args.model, choices, settings, prompt, args.out, reference=not args.no_reference,
        dtype=args.dtype, device=args.device, log=_stderr_progress,
    )
    print(f"kvviz: wrote {path}, {args.out / 'summary.csv'} and one trace per strategy", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from kvviz.qt.demo import run_demo

    if args.record is not None and args.record.suffix.lower() not in (".mp4", ".gif"):
        raise UsageError(f"--record writes .mp4 or .gif files, not {args.record.name!r}")
    return run_demo(args.record, model=args.model, tokens=args.tokens)


def cmd_strategies(args) -> int:
    from kvviz.engine import strategies

    listing = [s.to_dict() for s in strategies.all_strategies()]
    if args.json:
        print(json.dumps(listing, indent=2))
        return 0
    for s in listing:
        state = "" if s["available"] else f"  [unavailable: {s['reason']}]"
        print(f"{s['name']:<17} {s['description']}{state}\n{'':<19}follows {s['reference']}")
        for o in s["options"]:
            print(f"{'':<19}{o['name']}={o['default']}  {o['help']}")
    return 0


def cmd_model(args) -> int:
    from kvviz.engine import model_cache, models
    from kvviz.present import model_card_rows

    if args.verify:
        if args.model != "default":
            raise UsageError(f"--verify checks the converted copy of the default model; --model {args.model} has none")
        print(model_cache.verify_default_model(_stderr_progress), file=sys.stderr if args.json else sys.stdout)
    loaded = models.load_model(args.model, dtype=args.dtype, device=args.device, progress=_stderr_progress)
    if args.json:
        print(json.dumps(loaded.card, indent=2))
        return 0
    for key, value in model_card_rows(loaded.card):
        print(f"{key:>14}  {value}")
    return 0


def cmd_trace(args) -> int:
    """Check any kept file (a trace, an evaluation, a server session) and print its summary."""
    from kvviz.attach.session import Session
    from kvviz.attach_cli import show_session
    from kvviz.eval_cli import show_eval_run
    from kvviz.evaluation import EvalRun
    from kvviz.formats import read_kept
    from kvviz.jsonfile import KeptFileError

    try:
        kept = read_kept(args.path)
    except KeptFileError as exc:
        raise UsageError(str(exc)) from None
    if isinstance(kept, EvalRun):
        show_eval_run(kept, args.path, args.json)
    elif isinstance(kept, Session):
        show_session(kept, kept.url, kept.model, args.json)
    elif args.json:
        print(json.dumps(kept.summary(), indent=2))
    else:
        _print_summary(kept, kept.summary(), args.path)
    return 0


def cmd_bench(args) -> int:
    if args.gui:
        try:
            from kvviz.qt.bench import run_gui_bench
        except ImportError as exc:
            raise RuntimeError(f"the window benchmark is not available: {exc}") from None
        figures = run_gui_bench(
            model=args.model, new_tokens=args.new_tokens, repeats=args.repeats,
            progress=lambda message: _stderr_progress(message, None),
        )
        _print_gui_bench(figures)
    else:
        from kvviz.compare import parse_strategy_list
        from kvviz.engine.bench import run_bench

        choices = parse_strategy_list([s for s in args.strategies.split(",") if s.strip()])
        figures = run_bench(
            args.model, choices, args.new_tokens, args.repeats, dtype=args.dtype, device=args.device,
            log=_stderr_progress,
        )
        _print_bench(figures)
    args.out.write_text(json.dumps(figures, indent=2))
    print(f"kvviz: wrote {args.out}", file=sys.stderr)
    return 0


def _print_gui_bench(figures: dict) -> None:
    from kvviz.present import ms, number

    print(f"{figures['model']}, {figures['strategy']}, {figures['new_tokens']} new tokens, median of "
          f"{len(figures['tokens_per_s_generate_runs'])} interleaved runs; reference: {figures['reference']}")
    print(f"{'':<24} {'tokens/s':>9} {'ratio':>7}   target")
    targets = figures["targets"]
    print(f"{'model.generate':<24} {figures['tokens_per_s_generate']:>9.2f}")
    for label, key in (("kvviz headless", "headless"), ("kvviz window", "window")):
        print(f"{label:<24} {figures[f'tokens_per_s_{key}']:>9.2f} {number(figures[f'{key}_over_generate'], 3):>7}   "
              f"{targets[f'{key}_over_generate']}")
    stalls = ", ".join(ms(value) for value in figures["worst_stall_ms_runs"])
    print(f"worst event-loop stall while generating: {ms(figures['worst_stall_ms'])} "
          f"(per run: {stalls}; target {targets['worst_stall_ms']} ms)")
    print(f"token view redraw: {ms(figures['redraw_ms_short'])} at {figures['short_tokens']} tokens, "
          f"{ms(figures['redraw_ms_long'])} at {figures['long_tokens']} ({figures['long_model']} model), ratio "
          f"{number(figures['redraw_long_over_short'], 3)} (target {targets['redraw_long_over_short']})")


def _print_bench(figures: dict) -> None:
    print(f"decode tokens/s, {figures['new_tokens']} new tokens, median of {figures['repeats']} interleaved runs; "
          f"reference: {figures['reference']}")
    width = max([len("strategy"), *map(len, figures["strategies"])])
    print(f"{'strategy':<{width}} {'generate':>9} {'kvviz':>9} {'ratio':>7}")
    for label, row in figures["strategies"].items():
        if "skipped" in row:
            print(f"{label:<{width}} skipped: {row['skipped']}")
            continue
        generate, ours = row["generate_tokens_per_s"], row["kvviz_tokens_per_s"]
        print(f"{label:<{width}} {generate:>9.2f} {ours:>9.2f} {row['ratio']:>7.3f}")
    bandwidth = figures["bandwidth_bytes_per_s"]
    print(f"memory read bandwidth: {'-' if bandwidth is None else f'{bandwidth / 1e9:.1f} GB/s'} (kept for the "
          "memory-bound floor)")


COMMANDS = {
    "run": cmd_run,
    "compare": cmd_compare,
    "strategies": cmd_strategies,
    "model": cmd_model,
    "trace": cmd_trace,
    "bench": cmd_bench,
    "attach": cmd_attach,
    "eval": cmd_eval,
    "demo": cmd_demo,
}


def _tolerant_output() -> None:
    """Characters the terminal's encoding cannot show are replaced, never fatal (the run and its trace matter more)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")


def main(argv: list[str] | None = None) -> int:
    _tolerant_output()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        interrupts.catch()
        return COMMANDS[args.command](args)
    except (UsageError, OptionError) as exc:
        _report(args, exc)
        return 2
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except Exception as exc:
        if isinstance(exc, (ModelError, RuntimeError, OSError)):
            _report(args, exc)
        else:  # a failure inside torch/transformers: still one readable paragraph
            _report(args, f"{type(exc).__name__}: {exc} (run with --debug for the traceback)", exc)
        return 1


def _interrupted(interrupt: KeyboardInterrupt) -> int:
    status = interrupts.exit_status(interrupt)
    print("kvviz: interrupted" if status == 130 else "kvviz: terminated", file=sys.stderr)
    return status


def _report(args, message, exc: BaseException | None = None) -> None:
    exc = exc or message
    if args.debug:
        traceback.print_exception(exc)
    print(f"kvviz: error: {message}", file=sys.stderr)
