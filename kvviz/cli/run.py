"""`kvviz run`: generate headlessly through one strategy's cache, stream the text, print a summary, keep a trace."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from kvviz import interrupts
from kvviz.cli import common
from kvviz.errors import OptionError
from kvviz.files.trace import TraceJournal


def add_parser(subparsers) -> None:
    run = subparsers.add_parser("run", help="generate headlessly, print a summary and write a trace")
    common.add_model_args(run)
    common.add_strategy_args(run)
    common.add_generation_args(run)
    common.add_switch_arg(run)
    run.add_argument(
        "--reference",
        action="store_true",
        help="run a full-precision DynamicCache reference in lockstep and report KL and top-1 agreement",
    )
    run.add_argument("--trace", type=Path, help="write the trace here (default: kvviz-STRATEGY-TIME.json)")
    run.add_argument("--no-trace", action="store_true", help="do not write a trace file")
    run.add_argument("--json", action="store_true", help="print the summary and the generated text as JSON on stdout")
    run.add_argument("--pin", action="append", default=[], metavar="TEXT",
                     help="watch a stretch of the prompt (its first occurrence): each step records, per layer and KV "
                     "head, whether the cache still holds its tokens (repeatable)")
    run.add_argument("--quiet", action="store_true", help="do not stream the generated text")


def _trace_path(args, strategy: str) -> Path | None:
    """Where the run's trace goes, checked before any work so that a finished run is never lost to a bad path."""
    if args.no_trace:
        return None
    path = args.trace or Path(f"kvviz-{strategy}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    common.check_writable(path, "--trace")
    return path


def command(args) -> int:
    prompt = common.read_prompt(args)
    # the strategy first: its check imports torch alone, so that a misspelt name, or Ctrl-C while torch loads, ends
    # kvviz before the seconds of importing transformers
    choice = common.strategy_choice(args)
    switches = common.parse_switches(args.switch_at)
    settings = common.generation_settings(args)
    trace_path = _trace_path(args, choice.name)
    from kvviz.engine import decode, models

    loaded = models.load_model(args.model, dtype=args.dtype, device=args.device, progress=common.progress)
    common.check_switch_order(choice, switches, loaded.model)
    decoder = decode.Decoder(loaded, choice, settings, prompt, reference=args.reference, notify=common.notice)
    for text in args.pin:
        decoder.pin_text(text)
    stream = not (args.json or args.quiet)
    if not args.json:
        print(f"kvviz: {loaded.card['name']}, {choice.label()}, prompt {decoder.prompt_tokens} tokens", file=sys.stderr)
    if decoder.prompt_note:
        common.log(decoder.prompt_note)
    interrupted = refused = None
    last_progress = time.monotonic()
    kept = TraceJournal(trace_path, decoder.trace) if trace_path is not None else None  # survives a kill -9
    try:
        for step in decoder:
            if kept is not None:
                kept.update()
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
    if kept is not None:
        if kept.journal.problem:
            common.log(kept.journal.problem)
        try:
            kept.save()
        except OSError as exc:
            where = f"; what was measured is in {kept.journal.path}" if kept.journal.started else ""
            raise RuntimeError(f"cannot write the trace to {trace_path}: {exc.strerror or exc}{where}") from None
    summary = decoder.trace.summary()
    if args.json:
        out = {"model": loaded.card["name"], "strategy": decoder.trace.strategy, "prompt_tokens": decoder.prompt_tokens}
        out.update(summary, cancelled=decoder.trace.cancelled, compile_ms=decoder.trace.compile_ms,
                   warm_up_ms=decoder.trace.warm_up_ms, text=decoder.trace.text)
        out["trace"] = str(trace_path) if trace_path else None
        print(json.dumps(out, indent=2))
    else:
        print_summary(decoder.trace, summary, trace_path)
    if refused:
        raise refused
    return interrupts.exit_status(interrupted) if interrupted else 0


def print_summary(trace, summary, trace_path) -> None:
    """A run's summary as lines for a person: `kvviz run` at the end, `kvviz trace FILE` for a kept trace."""
    from kvviz.files.trace import Holding
    from kvviz.present import mib, ms, number, strategy_label

    rows = [
        ("model", str((trace.model or {}).get("name", "?"))),
        ("strategy", strategy_label(trace.strategy)),
        ("tokens", f"{trace.prompt_tokens} prompt + {summary['new_tokens']} new" + (" (cancelled)" * trace.cancelled)),
        ("prefill", ms(summary["prefill_ms"]) + (f", {mib(summary['prefill_peak_bytes'])} allocated at its peak"
                                                 if summary["prefill_peak_bytes"] is not None else "")),
        ("decode", f"{ms(summary['decode_ms_mean'])} mean, {ms(summary['decode_ms_p95'])} p95"),
        ("speed", f"{number(summary['decode_tokens_per_s'])} tokens/s"),
        ("limit", _memory_bound(summary)),
        ("cache", f"{mib(summary['final_cache_bytes'])} at the end, {mib(summary['peak_cache_bytes'])} peak"),
        ("policy", f"{mib(summary['final_policy_bytes'], 3)} at the end, {mib(summary['peak_policy_bytes'], 3)} peak"),
        ("RSS", f"{mib(summary['peak_rss_bytes'], 0)} peak"),
    ]
    if "mean_kl" in summary:
        first = summary["first_divergence"]
        first = "none" if first is None else f"at step {first}"
        agreement, kl = summary["top1_agreement"], summary["mean_kl"]
        rows.append(("fidelity", f"top-1 agreement {agreement:.3f}, mean KL {kl:.4f} nats, first divergence {first}"))
        rows.append(("reference", f"perplexity {summary['reference_perplexity']:.2f}; "
                     f"{ms(summary['reference_ms_mean'])} per step, not counted above"))
    for pin in summary.get("pins", ()):
        holding = Holding(pin["held"], pin["layers"], pin["heads"])
        rows.append(("pinned", f"{pin['label'] or 'tokens'} (tokens {pin['start']}-{pin['end'] - 1}): "
                     f"{holding.text()} at the end"))
    for switch in trace.switches:
        change = f"{switch.from_strategy} -> {strategy_label({'name': switch.to_strategy, 'options': switch.options})}"
        rows.append(("switch", f"before step {switch.step}: {change}"))
    if trace.compile_ms is not None:
        rows.append(("compile", f"{trace.compile_ms / 1000:.1f} s (not in the step times)"))
    if trace.warm_up_ms is not None:
        rows.append(("warm-up", f"{trace.warm_up_ms / 1000:.1f} s before the first step (not in the step times)"))
    if trace.error:
        rows.append(("ended", trace.error))
    if trace_path:
        rows.append(("trace", str(trace_path)))
    for key, value in rows:
        print(f"{key:>9}  {value}")


def _memory_bound(summary) -> str:
    """The memory-bound speed at the end of the run, and the share of it the run reached."""
    from kvviz.present import UNKNOWN

    limit, share, bandwidth = (summary.get(k) for k in ("memory_bound_tokens_per_s", "share_of_memory_bound",
                                                         "bandwidth_bytes_per_s"))
    if limit is None:
        return UNKNOWN
    reached = "" if share is None else f"; this run reached {share:.0%} of it"
    return f"{limit:.1f} tokens/s memory-bound (weights + cache read at {bandwidth / 1e9:.1f} GB/s){reached}"
