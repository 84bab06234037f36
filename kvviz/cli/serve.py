"""`kvviz serve`: many requests through transformers' continuous batching and its paged cache (kvviz.engine.serve),
a row per request and the pool's figures."""

from __future__ import annotations

import json
from pathlib import Path

from kvviz.cli import common
from kvviz.errors import UsageError

DEFAULT_REQUESTS = 8
PROMPT_COLUMN = 36  # characters of a prompt shown in the table


def add_parser(subparsers) -> None:
    serve = subparsers.add_parser(
        "serve", help="serve many requests at once through transformers' continuous batching and its paged cache: "
        "time to first token and per output token, preemptions and the pool's blocks",
        description="Requests go through transformers' own continuous batching (model.init_continuous_batching): "
        "a scheduler batches them over a pool of blocks of the paged cache, shares blocks by prefix, and preempts "
        "requests when the pool runs out. Greedy; each answer ends at the end-of-sequence token.")
    common.add_model_args(serve)
    given = serve.add_mutually_exclusive_group()
    given.add_argument("--prompts", type=Path, metavar="FILE", help="one prompt per line (UTF-8 text)")
    given.add_argument("--requests", type=int, metavar="N", help=f"N requests drawn from a built-in text (default "
                       f"{DEFAULT_REQUESTS} when --prompts is not given)")
    serve.add_argument("--raw", action="store_true", help="send each prompt as is, without the chat template")
    serve.add_argument("--max-new-tokens", type=int, default=64, help="tokens each answer may have (default 64)")
    serve.add_argument("--shared-prefix", type=Path, metavar="FILE", help="a text put before every prompt")
    serve.add_argument("--rate", type=float, metavar="R", help="requests per second, Poisson-spaced (default: all "
                       "at once)")
    serve.add_argument("--seed", type=int, default=0, help="seed of the arrivals' spacing (default 0)")
    serve.add_argument("--page-size", type=int, metavar="TOKENS", help="tokens per block (default: transformers' "
                       "256)")
    serve.add_argument("--blocks", type=int, metavar="N", help="the pool's size in blocks (default: sized from "
                       "free memory, as transformers sizes it: on CPU 60 %% of it, less the attention masks)")
    serve.add_argument("--max-batch-tokens", type=int, metavar="N", help="query tokens per step (default: "
                       "transformers' choice)")
    serve.add_argument("--concurrency", type=int, metavar="N", help="requests per batch at most (default: "
                       "transformers' choice)")
    serve.add_argument("--scheduler", default="fifo", help="fifo (the default) or prefill_first")
    serve.add_argument("--no-prefix-sharing", action="store_true", help="never share blocks between requests "
                       "that begin alike")
    serve.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    serve.add_argument("--trace", type=Path, metavar="FILE", help="keep the run here (a kvviz-serve file: every "
                       "request and step, the pool's blocks at each step), journaled while it serves; `kvviz trace` "
                       "and the window open it")


def command(args) -> int:
    from kvviz import interrupts
    from kvviz.engine import models
    from kvviz.engine.serve import builtin_prompts, encoded, serve
    from kvviz.files.serve_trace import ServeSettings

    settings = ServeSettings(max_new_tokens=args.max_new_tokens, page_size=args.page_size, blocks=args.blocks,
                             max_batch_tokens=args.max_batch_tokens, concurrency=args.concurrency,
                             scheduler=args.scheduler, prefix_sharing=not args.no_prefix_sharing, rate=args.rate,
                             seed=args.seed)
    settings.check()
    if args.requests is not None and args.requests < 1:
        raise UsageError(f"--requests must be at least 1, got {args.requests}")
    if args.trace is not None:
        common.check_writable(args.trace, "--trace")
    texts = _lines(args.prompts) if args.prompts is not None else builtin_prompts(args.requests or DEFAULT_REQUESTS)
    prefix = _read(args.shared_prefix, "--shared-prefix") if args.shared_prefix is not None else ""
    loaded = models.load_model(args.model, dtype=args.dtype, device=args.device, progress=common.progress)
    prompts = encoded(loaded.tokenizer, texts, prefix, args.raw)
    if not args.json:
        common.log(f"serving {len(prompts)} requests through transformers' continuous batching")
    kept = Kept(args.trace)
    try:
        run = serve(loaded, prompts, settings, on_start=kept.start, on_step=kept.step)
    except KeyboardInterrupt as interrupt:  # what was measured is kept and shown
        if kept.run is None:
            raise
        kept.save()
        print("\n".join(table(kept.run)))
        return interrupts.said(interrupt)
    except Exception:
        kept.save()
        raise
    kept.save()
    print(json.dumps(figures(run) | {"shared_prefix": prefix}, indent=2) if args.json else "\n".join(table(run)))
    return 0


class Kept:
    """`--trace`: the run journaled while it serves (`ServeJournal`), then saved."""

    def __init__(self, path: Path | None):
        self.path = path
        self.run = None
        self.journal = None

    def start(self, run) -> None:
        from kvviz.files.serve_trace import ServeJournal

        self.run = run
        if self.path is not None:
            self.journal = ServeJournal(self.path, run)
            self.journal.update()

    def step(self, run) -> None:
        if self.journal is not None:
            self.journal.step()

    def save(self) -> None:
        if self.journal is None:
            return
        self.run.save(self.path)
        self.journal.remove()
        common.log(f"wrote {self.path}")


def _read(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {flag} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{flag} {path} is not UTF-8 text") from None


def _lines(path: Path) -> list[str]:
    lines = [line.strip() for line in _read(path, "--prompts").splitlines() if line.strip()]
    if not lines:
        raise UsageError(f"--prompts {path} holds no prompt: give one prompt per line")
    return lines


def show_serve_run(run, path: Path, as_json: bool) -> None:
    """`kvviz trace` of a kvviz-serve file."""
    if as_json:
        print(json.dumps(figures(run), indent=2))
        return
    state = "cancelled" if run.cancelled else "finished"
    print(f"{path}: kvviz serve on {run.model.get('name') or 'a model'}, {len(run.requests)} requests, {state}"
          + (f" ({run.error})" if run.error else ""))
    print("\n".join(table(run)))


def figures(run) -> dict:
    """What --json prints: a row per request, and the pool."""
    return {
        "requests": [{"id": r.id, "prompt": r.prompt, "text": r.text, "prompt_tokens": r.prompt_tokens,
                      "output_tokens": len(r.token_times), "finished": r.finished, "arrival_s": r.arrival,
                      "ttft_ms": r.ttft_ms, "tpot_ms": r.tpot_ms, "preemptions": r.preemptions,
                      "peak_blocks": r.peak_blocks, "prefix_tokens": r.prefix_tokens} for r in run.requests],
        "page_size": run.page_size, "blocks": run.blocks, "sized_from_memory": run.sized_from_memory,
        "max_batch_tokens": run.max_batch_tokens, "scheduler": run.settings.scheduler,
        "prefix_sharing": run.settings.prefix_sharing,
        "groups": [{"name": g.name, "layers": g.layers, "bytes_per_block": g.bytes_per_block, "blocks": g.blocks}
                   for g in run.groups],
        "bytes_per_block": run.bytes_per_block, "pool_bytes": run.pool_bytes, "peak_blocks": run.peak_blocks,
        "peak_bytes": run.peak_bytes, "reused_blocks": run.reused_blocks, "preemptions": run.preemptions,
        "steps": len(run.steps), "output_tokens": run.output_tokens, "tokens_per_s": run.tokens_per_s,
    }


def table(run) -> list[str]:
    from kvviz.present import UNKNOWN, ms, number, shortened, size

    lines = [f"{'request':<8} {'prompt':<{PROMPT_COLUMN}} {'in':>6} {'out':>5} {'TTFT':>10} {'per token':>10} "
             f"{'preempted':>9} {'peak blocks':>11} {'prefix':>7}"]
    for r in run.requests:
        prompt = shortened(" ".join(r.prompt.split()), PROMPT_COLUMN)
        out = f"{len(r.token_times)}" + ("" if r.finished else "*")
        lines.append(f"{r.id:<8} {prompt:<{PROMPT_COLUMN}} {r.prompt_tokens:>6,} {out:>5} {ms(r.ttft_ms):>10} "
                     f"{ms(r.tpot_ms):>10} {r.preemptions:>9} {r.peak_blocks:>11} {r.prefix_tokens:>7,}")
    sizing = "sized from free memory by transformers" if run.sized_from_memory else "as asked"
    groups = "; ".join(f"{g.name} {g.layers} layers, {size(g.bytes_per_block)} a block" for g in run.groups)
    rate = run.tokens_per_s
    lines += [
        "",
        f"pool: {run.blocks:,} blocks of {run.page_size} tokens ({sizing}), {size(run.bytes_per_block)} a block "
        f"({groups}); {size(run.pool_bytes)} in all",
        f"peak: {run.peak_blocks:,} blocks held at once, {size(run.peak_bytes)}; {run.reused_blocks:,} blocks "
        f"reused by prefix; {run.preemptions} preemptions",
        f"{run.output_tokens:,} tokens in {len(run.steps):,} steps, "
        f"{UNKNOWN if rate is None else number(rate, 1)} tokens/s; scheduler {run.settings.scheduler}, prefix "
        f"sharing {'on' if run.settings.prefix_sharing else 'off'}, at most {run.max_batch_tokens:,} tokens a step",
        "in: prompt tokens (a shared prefix included); out: tokens answered (* unfinished); TTFT from the "
        "request's arrival; prefix: prompt tokens found in the pool's blocks",
    ]
    return lines
