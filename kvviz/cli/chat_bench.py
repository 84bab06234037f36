"""`kvviz chat-bench`: the conversation targets on scripted chats (kvviz.engine.chat_bench), printed and kept."""

from __future__ import annotations

import json
from pathlib import Path

from kvviz.cli import common
from kvviz.errors import UsageError

TTFT_TARGET = 0.2  # time to first token with the cache kept, at most this share of a full re-prefill
BYTES_TARGET = 0.01  # cache bytes within this share of the budget's bytes over turns 10 to the last
SPEED_TARGET = 0.10  # the last turn's decode speed within this share of the early turn's
HISTORY_TARGET = 1500  # tokens of history the reuse chat should reach by its last turn
EARLY_TURN = 5  # the long chat's turn whose decode speed its last turn's is compared with
FLAT_FROM = 10  # the long chat's bytes are compared with the budget from this turn on


def add_parser(subparsers) -> None:
    bench = subparsers.add_parser("chat-bench", help="measure the conversation targets: reuse against a full "
                                  "re-prefill, and bounded caches over a long chat")
    common.add_model_args(bench)
    bench.add_argument("--reuse-turns", type=int, default=10, help="turns of the reuse chat (default 10)")
    bench.add_argument("--reuse-new-tokens", type=int, default=64, help="tokens each reply of the reuse chat may "
                       "have (default 64)")
    bench.add_argument("--bounded", default="sink:sink_tokens=4:window=252,h2o:budget=256",
                       help="bounded strategies for the long chat, comma-separated (default: "
                       "sink:sink_tokens=4:window=252,h2o:budget=256)")
    bench.add_argument("--bounded-turns", type=int, default=50, help="turns of the long chat (default 50)")
    bench.add_argument("--bounded-new-tokens", type=int, default=32, help="tokens each reply of the long chat may "
                       "have (default 32)")
    bench.add_argument("--early-turn", type=int, default=EARLY_TURN, help="the long chat's turn whose decode speed "
                       f"its last turn's is compared with (default {EARLY_TURN})")
    bench.add_argument("--flat-from", type=int, default=FLAT_FROM, help="the long chat's cache bytes are compared "
                       f"with the budget from this turn to the last (default {FLAT_FROM})")
    bench.add_argument("--out", type=Path, help="write the figures here as JSON")


def command(args) -> int:
    from kvviz.engine import chat_bench, models
    from kvviz.engine.strategies import get, parse_spec

    bounded = common.strategy_list(args.bounded)
    for choice in bounded:
        if get(choice.name).prompt_capacity(choice.options) is None:
            raise UsageError(f"--bounded: {choice.label()} keeps every token; give strategies with a budget "
                             "(sink, sliding, h2o, tova, snapkv, knorm)")
    if args.reuse_turns < 1 or min(args.early_turn, args.flat_from) < 1:
        raise UsageError("--reuse-turns, --early-turn and --flat-from must be at least 1")
    if args.bounded_turns < max(args.early_turn, args.flat_from):
        raise UsageError(f"--bounded-turns must be at least --early-turn ({args.early_turn}) and --flat-from "
                         f"({args.flat_from})")
    if args.out is not None:
        common.check_writable(args.out, "--out")
    loaded = models.load_model(args.model, dtype=args.dtype, device=args.device, progress=common.progress)
    log = common.log
    figures = {"model": loaded.card["name"],
               "reuse": chat_bench.reuse(loaded, parse_spec("dynamic"), args.reuse_turns, args.reuse_new_tokens, log),
               "bounded": [chat_bench.bounded(loaded, c, get(c.name).prompt_capacity(c.options), args.bounded_turns,
                                              args.bounded_new_tokens, log, args.early_turn, args.flat_from)
                           for c in bounded]}
    print_figures(figures)
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2), encoding="utf-8")
        common.log(f"wrote {args.out}")
    return 0


def _met(ok: bool | None) -> str:
    return "–" if ok is None else "met" if ok else "NOT met"


def print_figures(figures: dict) -> None:
    from kvviz.present import mib, ms, number, percent

    reuse = figures["reuse"]
    print(f"{figures['model']}: reuse across turns ({reuse['strategy']})")
    print(f"  {'turn':>4}  {'history':>8}  {'fed':>5}  {'first token':>11}  {'full re-prefill':>15}  "
          f"{'max |dlogit|':>12}")
    for row in reuse["turns"]:
        print(f"  {row['turn']:>4}  {row['history_tokens']:>8,}  {row['fed']:>5,}  {ms(row['ttft_ms']):>11}  "
              f"{ms(row['reprefill_ms']):>15}  {row['logit_diff']:>12.2g}")
    share = reuse["ttft_share_of_reprefill"]
    print(f"  turn {reuse['last_turn']}: history {reuse['history_tokens']:,} tokens (target >= {HISTORY_TARGET:,}: "
          f"{_met(reuse['history_tokens'] >= HISTORY_TARGET)}); first token {ms(reuse['ttft_ms'])} with the cache "
          f"kept, {ms(reuse['reprefill_ms'])} re-prefilled: {percent(share, 1)} (target <= {percent(TTFT_TARGET)}: "
          f"{_met(share <= TTFT_TARGET)})")
    for row in figures["bounded"]:
        ratio = row["speed_ratio"]
        print(f"{figures['model']}: {row['strategy']} over {row['turns']} turns ({row['tokens_in_context']:,} tokens "
              f"in context, {row['evicted']:,} evicted, {row['refilled_turns']} turns prefilled again)")
        print(f"  cache over turns {row['flat_from']}-{row['turns']}: {mib(row['min_bytes'])} to "
              f"{mib(row['max_bytes'])}, budget {mib(row['budget_bytes'])}; largest deviation "
              f"{percent(row['largest_deviation'], 2)} (target <= {percent(BYTES_TARGET)}: "
              f"{_met(row['largest_deviation'] <= BYTES_TARGET)})")
        print(f"  decode: turn {row['early_turn']} {number(row['early_tokens_per_s'])} tokens/s, turn {row['turns']} "
              f"{number(row['last_tokens_per_s'])} tokens/s, ratio {number(ratio, 3)} (target within "
              f"{percent(SPEED_TARGET)}: {_met(None if ratio is None else abs(ratio - 1) <= SPEED_TARGET)})")
