"""`kvviz bench`: kvviz's decode speed against plain `model.generate` in a clean process.

The reference is what a user's own code gets: `model.generate` in a fresh Python interpreter started
with the user's environment (nothing kvviz sets), the same model, dtype, prompt, number of new
tokens, cache class and torch thread count. kvviz's headless decoder runs in a fresh process too
(`kvviz.engine.timed_run`), and the window's figure (`kvviz bench --gui`) is set against the same
reference. Runs are interleaved (generate, kvviz, generate, kvviz, ...) so that drift in machine
load hits both; the medians are compared. Decode rates leave the prefill out.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable

from kvviz.errors import ModelError

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
CHILD_TIMEOUT_S = 900  # the first quantized run builds quanto's kernels (about a minute)


def timed_run(side: str, model: str, strategy: str, options: dict, new_tokens: int, dtype: str = "auto",
              device: str = "auto", prompt: str = PROMPT) -> dict:
    """One decode in a fresh process (side "generate" or "kvviz"); returns its figures."""
    request = {"side": side, "model": model, "dtype": dtype, "device": device, "strategy": strategy,
               "options": options, "prompt": prompt, "new_tokens": new_tokens}
    result = subprocess.run([sys.executable, "-m", "kvviz.engine.timed_run", json.dumps(request)],
                            capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=dict(os.environ))
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(f"the {side} process for {strategy!r} failed: {last}")
    return json.loads(result.stdout.strip().splitlines()[-1])


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
        for r in range(repeats):
            log(f"{choice.label()}: repeat {r + 1}/{repeats}", None)
            for side, rates in (("generate", generate), ("kvviz", ours)):
                figures = timed_run(side, model_spec, choice.name, choice.options, new_tokens, dtype, device)
                rates.append(figures["tokens_per_s"])
                threads.add(figures["threads"])
        results[choice.label()] = {
            "generate_tokens_per_s": statistics.median(generate),
            "kvviz_tokens_per_s": statistics.median(ours),
            "ratio": statistics.median(ours) / statistics.median(generate),
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
