"""`kvviz bench`: kvviz's decode speed against plain `model.generate` in a fresh process; `--gui` for the window."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvviz.cli import common


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="measure the decoder's overhead against model.generate")
    common.add_model_args(bench)
    bench.add_argument(
        "--strategies", default="dynamic,static,quantized,sliding,sink,none",
        help="comma-separated NAME or NAME:KEY=VALUE:KEY=VALUE, as for compare "
        "(default: dynamic,static,quantized,sliding,sink,none)",
    )
    bench.add_argument("--new-tokens", type=int, default=128, help="tokens per measured run (default 128)")
    bench.add_argument("--repeats", type=int, default=3, help="interleaved repeats per strategy (default 3)")
    bench.add_argument("--out", type=Path, default=Path("bench.json"), help="write the figures here as JSON "
                       "(default: bench.json)")
    bench.add_argument("--gui", action="store_true", help="measure the window instead (needs the Qt window)")


def command(args) -> int:
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
    else:
        from kvviz.engine.bench import run_bench

        choices = common.strategy_list(args.strategies)
        figures = run_bench(
            args.model, choices, args.new_tokens, args.repeats, dtype=args.dtype, device=args.device,
            log=common.progress,
        )
        print_bench(figures)
    args.out.write_text(json.dumps(figures, indent=2))
    print(f"kvviz: wrote {args.out}", file=sys.stderr)
    return 0


def print_gui_bench(figures: dict) -> None:
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


def print_bench(figures: dict) -> None:
    from kvviz.present import UNKNOWN, number

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
    shown = UNKNOWN if bandwidth is None else f"{number(bandwidth / 1e9)} GB/s"
    print(f"memory read bandwidth: {shown} (kept for the memory-bound floor)")
