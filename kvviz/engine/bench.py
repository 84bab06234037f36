"""`kvviz bench`: kvviz's decode speed against plain `model.generate` in a clean process, and how long kvviz's
readings of a text take (a sweep, `kvviz eval`) beside it.

The reference is what a user's own code gets: `model.generate` in a fresh Python interpreter started
with the user's environment (nothing kvviz sets), the same model, dtype, prompt, number of new
tokens, cache class and torch thread count. kvviz's headless decoder runs in a fresh process too
(`kvviz.engine.timed_run`), and the window's figure (`kvviz bench --gui`) is set against the same
reference. Runs are interleaved (generate, kvviz, generate, kvviz, ..., generate): each kvviz run sits between
two reference runs, and a ratio is the median over the repeats of each run over the mean of its two
(`bracketed_ratio`), which cancels the machine's drift of several per cent within minutes. Decode rates leave
the prefill out.

A reading (`reading_bench`) runs in this process, between plain generate's runs (half before, half after, so
that a drift in the machine's load shows), with the machine's load average before and after. A sweep's time is
set against its compute-bound floor, timed in the same run (`sweep.floor_forward_ms`); every configuration's
perplexity is given in full, to compare runs of different code.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from kvviz.errors import ModelError

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
CHILD_TIMEOUT_S = 900  # the first quantized run builds quanto's kernels (about a minute)
PROGRESS_S = 30.0  # a reading says how far it is this often


def timed_run(side: str, model: str, strategy: str, options: dict, new_tokens: int, dtype: str = "auto",
              device: str = "auto", prompt: str = PROMPT, **more) -> dict:
    """One decode in a fresh process (side "generate" or "kvviz"; with `more`, the first-token sides' text, tokens
    and second length); returns its figures."""
    request = {"side": side, "model": model, "dtype": dtype, "device": device, "strategy": strategy,
               "options": options, "prompt": prompt, "new_tokens": new_tokens, **more}
    return fresh_process("kvviz.engine.timed_run", request, f"the {side} process for {strategy!r}")


def fresh_process(module: str, request: dict, what: str) -> dict:
    """`python -m module` in a fresh interpreter with the user's environment, `request` on its stdin (a text is
    longer than an argument may be); the JSON of its last line."""
    result = subprocess.run([sys.executable, "-m", module], input=json.dumps(request),
                            capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=dict(os.environ))
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(f"{what} failed: {last}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def bracketed_ratio(rates: list[float], reference: list[float]) -> float:
    """The median over the repeats of each run's rate over the mean of the reference runs on either side of it
    (`reference` has one run more than `rates`: run i sits between reference runs i and i + 1)."""
    brackets = [(before + after) / 2.0 for before, after in itertools.pairwise(reference)]
    return statistics.median(rate / bracket for rate, bracket in zip(rates, brackets, strict=True))


def reference_rate(model: str, new_tokens: int, repeats: int, **kwargs) -> list[float]:
    """Plain model.generate (DynamicCache) in clean processes: `repeats` decode rates."""
    return [timed_run("generate", model, "dynamic", {}, new_tokens, **kwargs)["tokens_per_s"] for _ in range(repeats)]


def run_bench(
    model_spec: str,
    choices: list,
    new_tokens: int,
    repeats: int,
    dtype: str = "auto",
    device: str = "auto",
    log: Callable[[str, float | None], None] = lambda message, fraction: None,
) -> dict:
    """`choices`: validated StrategyChoice objects. Returns the figures (printed and written by the CLI)."""
    import torch

    from kvviz.engine import machine, strategies
    from kvviz.engine.models import resolve_device

    results = {}
    for choice in choices:
        ok, reason = strategies.get(choice.name).available()
        if not ok:
            results[choice.label()] = {"skipped": reason}
            continue
        generate, ours, threads = [], [], set()
        sides = [("generate", generate), ("kvviz", ours)] * repeats + [("generate", generate)]
        for run, (side, rates) in enumerate(sides):
            log(f"{choice.label()}: {side} {run // 2 + 1}/{repeats + (side == 'generate')}", None)
            figures = timed_run(side, model_spec, choice.name, choice.options, new_tokens, dtype, device)
            rates.append(figures["tokens_per_s"])
            threads.add(figures["threads"])
        results[choice.label()] = {
            "generate_tokens_per_s": statistics.median(generate),
            "kvviz_tokens_per_s": statistics.median(ours),
            "ratio": bracketed_ratio(ours, generate),
            "generate_runs": generate,
            "kvviz_runs": ours,
            "threads": sorted(threads),
        }
    log("measuring the memory read bandwidth", None)
    # the device the runs used: --device auto is CUDA where there is one
    bandwidth = machine.memory_bandwidth(torch.device(resolve_device(device)), force=True)
    return {
        "model": model_spec,
        "new_tokens": new_tokens,
        "repeats": repeats,
        "reference": "model.generate in a fresh process with the user's environment",
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "bandwidth_bytes_per_s": bandwidth,
        "strategies": results,
    }


def reading_bench(model_spec: str, document, tokens: int, choices: list | None, sweep: bool, rows: int | None,
                  floor_forwards: int, repeats: int, new_tokens: int, dtype: str = "auto", device: str = "auto",
                  log: Callable[[str, float | None], None] = lambda message, fraction: None) -> dict:
    """Time the reading of `tokens` tokens of `document` as `kvviz choose` does (`sweep`: through `choices`, or the
    default grid where None, with the exact cache added) or as `kvviz eval` does (the strategies that can, together),
    with plain generate's decode rate in fresh processes beside it. Returns the figures."""
    import torch

    from kvviz.engine import evaluate, evaluate_many, models
    from kvviz.engine import sweep as sweeps

    said = [time.monotonic()]

    def progress(done: int, total: int) -> None:  # how far the reading is, every PROGRESS_S seconds
        if time.monotonic() - said[0] >= PROGRESS_S:
            said[0] = time.monotonic()
            log("predictions made", done / total)

    before = os.getloadavg()[0]
    log(f"plain generate, {new_tokens} new tokens, fresh processes (before)", None)
    rates = reference_rate(model_spec, new_tokens, (repeats + 1) // 2, dtype=dtype, device=device)
    loaded = models.load_model(model_spec, dtype=dtype, device=device)
    if choices is None:
        choices, _ = sweeps.default_grid(loaded.model, tokens)
    ids, record, _ = evaluate.prepare(loaded, document, sweeps.with_reference(choices) if sweep else choices, tokens)
    log(f"reading {len(ids):,} tokens of {document.name}", None)
    figures: dict = {}
    if sweep:
        run = sweeps.SweepRun(loaded, choices, ids, record, sweeps.ask(loaded.model), rows=rows or sweeps.ROWS,
                              floor_forwards=floor_forwards)
        run.on_progress = lambda: progress(*run.progress())
        for _ in run:
            pass
        speed = run.sweep.speed
        wall_s = speed.wall_s
        results = [c.run for c in run.sweep.configurations]
        figures.update(floor_s=speed.floor_s, floor_rows=speed.floor_rows, floor_forwards=floor_forwards,
                       floor_tokens=len(ids) // 2, floor_share=speed.floor_share)
    else:
        evaluations = [evaluate.Evaluation(loaded, choice, ids, record) for choice in choices]
        started = time.perf_counter()
        total = sum(e.predictions for e in evaluations)
        for _ in evaluate_many.evaluate_all(evaluations, together=True):
            progress(sum(len(e.result.records) for e in evaluations), total)
        wall_s = time.perf_counter() - started
        results = [e.result for e in evaluations]
    log(f"plain generate, {new_tokens} new tokens, fresh processes (after)", None)
    rates += reference_rate(model_spec, new_tokens, repeats // 2, dtype=dtype, device=device)
    figures.update(
        reading="sweep" if sweep else "eval", model=model_spec, document=document.name, tokens=len(ids),
        wall_s=wall_s, generate_tokens_per_s=statistics.median(rates), generate_runs=rates, new_tokens=new_tokens,
        threads=torch.get_num_threads(), load_before=before, load_after=os.getloadavg()[0],
        configurations=[{"label": r.label(), "status": r.status, "perplexity": r.summary()["perplexity"],
                         "method": r.method} for r in results],
    )
    return figures


def first_token_bench(model_spec: str, choices: list, text: str, tokens: int, second: int, repeats: int,
                      dtype: str = "auto", device: str = "auto",
                      log: Callable[[str, float | None], None] = lambda message, fraction: None) -> dict:
    """One request of `text`'s first `tokens` tokens served up to its first token, per configuration: plain
    `model.generate` in fresh processes, interleaved with kvviz's own measurement in fresh processes (each with its
    prediction at `second` tokens beside a measurement there). A cache with work of its own after the prefill (KVzip's
    reading again) has no generate side: generate does not run it. Returns the figures."""
    from kvviz.engine import strategies
    from kvviz.engine.strategies import Strategy

    results = {}
    for choice in choices:
        strategy = strategies.get(choice.name)
        ok, reason = strategy.available()
        if not ok:
            results[choice.label()] = {"skipped": reason}
            continue
        plain = type(strategy).after_forward is Strategy.after_forward  # generate runs all the cache does
        runs: dict[str, list[dict]] = {"generate-first": [], "kvviz-first": []}
        sides = (["generate-first", "kvviz-first"] if plain else ["kvviz-first"]) * repeats
        for side in sides + (["generate-first"] if plain else []):
            log(f"{choice.label()}: {side} {len(runs[side]) + 1}", None)
            runs[side].append(timed_run(side, model_spec, choice.name, choice.options, 1, dtype, device,
                                        text=text, tokens=tokens, second=second))
        ours, theirs = runs["kvviz-first"], runs["generate-first"]
        second_runs = [r["second"] for r in ours]
        results[choice.label()] = {
            "tokens": ours[0]["tokens"],
            "kvviz_peak_bytes": ours[0]["peak_bytes"],  # counted: the same in every run
            "generate_peak_bytes": theirs[0]["peak_bytes"] if theirs else None,
            "weight_bytes": ours[0]["weight_bytes"],
            "cache_bytes": ours[0]["cache_bytes"],
            "kvviz_ttft_ms": statistics.median(r["ttft_ms"] for r in ours),
            "generate_ttft_ms": statistics.median(r["ttft_ms"] for r in theirs) if theirs else None,
            "same_first_token": all(r["token_id"] == ours[0]["token_id"] for r in ours + theirs),
            "kvviz_ttft_runs": [r["ttft_ms"] for r in ours],
            "generate_ttft_runs": [r["ttft_ms"] for r in theirs],
            "second": {"tokens": second, "peak_bytes": second_runs[0]["peak_bytes"],
                       "predicted_peak_bytes": second_runs[0]["predicted_peak_bytes"],
                       "ttft_ms": statistics.median(r["ttft_ms"] for r in second_runs),
                       "predicted_ttft_ms": statistics.median(r["predicted_ttft_ms"] for r in second_runs)},
        }
    return {"model": model_spec, "tokens": tokens, "second": second, "repeats": repeats,
            "reference": "model.generate(max_new_tokens=1) in a fresh process with the user's environment, every "
                         "allocation counted by torch's profiler", "strategies": results}


def serve_bench(model_spec: str, requests: int, new_tokens: int, repeats: int, levels: list[int], page_size: int,
                blocks: int, max_batch_tokens: int, dtype: str = "auto", device: str = "auto",
                log: Callable[[str, float | None], None] = lambda message, fraction: None) -> dict:
    """`requests` requests drawn from the built-in text, served in fresh processes (`kvviz.engine.timed_serve`):
    kvviz serve's interleaved with transformers' own generate_batch of the same requests and pool (kvviz's overhead:
    the median over the repeats of each kvviz run's throughput over its two neighbours'), then kvviz serve at each
    concurrency of `levels` between plain generate of one request after another, before and after. Returns the
    figures."""
    request = {"model": model_spec, "dtype": dtype, "device": device, "requests": requests, "new_tokens": new_tokens,
               "page_size": page_size, "blocks": blocks, "max_batch_tokens": max_batch_tokens}

    def served(side: str, concurrency: int | None = None) -> dict:
        log(f"{side}" + ("" if concurrency is None else f", concurrency {concurrency}"), None)
        return fresh_process("kvviz.engine.timed_serve", request | {"side": side, "concurrency": concurrency},
                             f"the {side} serving process")

    runs: dict[str, list[dict]] = {"generate-batch": [], "kvviz": []}
    for side in ["generate-batch", "kvviz"] * repeats + ["generate-batch"]:
        runs[side].append(served(side))
    each = [served("generate-each")]
    levels_runs = {level: served("kvviz", level) for level in levels}
    each.append(served("generate-each"))
    answers = [r["answers"] for group in (*runs.values(), each, levels_runs.values()) for r in group]
    return {
        "model": model_spec, "requests": requests, "new_tokens": new_tokens, "repeats": repeats,
        "page_size": page_size, "blocks": blocks, "max_batch_tokens": max_batch_tokens,
        "reference": "model.generate_batch (transformers' continuous batching) and model.generate, each in a fresh "
                     "process with the user's environment",
        "generate_batch_tokens_per_s": [r["tokens_per_s"] for r in runs["generate-batch"]],
        "kvviz_tokens_per_s": [r["tokens_per_s"] for r in runs["kvviz"]],
        "ratio": bracketed_ratio([r["tokens_per_s"] for r in runs["kvviz"]],
                                 [r["tokens_per_s"] for r in runs["generate-batch"]]),
        "generate_each_tokens_per_s": [r["tokens_per_s"] for r in each],
        "concurrency": {str(level): r["tokens_per_s"] for level, r in levels_runs.items()},
        "same_answers": all(a == answers[0] for a in answers),
        "threads": sorted({r["threads"] for group in (*runs.values(), each) for r in group}),
    }
