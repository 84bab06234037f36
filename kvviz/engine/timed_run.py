"""One timed decode (or one request served up to its first token) in a fresh Python process: the two sides of
`kvviz bench` (and of `kvviz bench --first-token`).

    echo '{"side": "generate" | "kvviz", "model": ..., "dtype": ..., "device": ..., "strategy": ...,
           "options": {...}, "prompt": ..., "new_tokens": N}' | python -m kvviz.engine.timed_run

prints one JSON line: the decode rate (tokens/s between the first and the last new token, so the
prefill is left out), the torch thread count and the environment's OMP settings. Side "generate" is
plain `model.generate` with the strategy's cache, as a user's own script would run it; side "kvviz"
is kvviz's instrumented decoder as a default `kvviz run` uses it: its trace journaled step by step in
the working folder (then removed). Each runs a short warm-up first (kernels, quanto's first build),
and each side gets a process of its own, started from the user's environment, so neither inherits
the other's state. Sides "generate-first" and "kvviz-first" serve one request of a text's first tokens up to its
first token (`--first-token`): plain `model.generate(max_new_tokens=1)` with every allocation counted, against kvviz's
own measurement, which also predicts another length from it beside a measurement there.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers.generation.streamers import BaseStreamer

from kvviz.engine import allocations, decode, first_token, measure, models, strategies
from kvviz.engine.evaluate import tokenize
from kvviz.files.trace import TraceJournal

WARM_UP_TOKENS = 8


class _TokenClock(BaseStreamer):
    """Timestamps every token generate() emits; the first put() is the prompt."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.calls = 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls > 1:
            self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def decode_rate(times: list[float]) -> float:
    """Tokens/s between the first and the last new token."""
    return (len(times) - 1) / (times[-1] - times[0])


def generate_times(loaded, choice, prompt_ids: list[int], new_tokens: int) -> list[float]:
    model = loaded.model
    capacity = strategies.capacity_for(choice, len(prompt_ids) + new_tokens)
    cache = strategies.get(choice.name).make_cache(model, choice.options, capacity)
    clock = _TokenClock()
    kwargs = {"use_cache": False} if cache is None else {"cache": cache}
    ids = torch.tensor([prompt_ids], device=model.device)
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, streamer=clock, pad_token_id=loaded.tokenizer.eos_token_id, **kwargs)
    return clock.times


def kvviz_times(loaded, choice, prompt: str, new_tokens: int) -> list[float]:
    settings = decode.GenerationSettings(max_new_tokens=new_tokens, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(loaded, choice, settings, prompt)
    times = []
    # where `kvviz run` writes its trace by default (and `kvviz bench` its figures): the same disk's writes
    with tempfile.TemporaryDirectory(prefix=".kvviz-bench-", dir=os.getcwd()) as folder:
        kept = TraceJournal(Path(folder) / "run.json", decoder.trace)
        for _ in decoder:
            # A torch.compile run compiles between its first two records (timed apart in trace.compile_ms); this
            # clock leaves it out, as generate's compile falls in its warm-up run. Counted, it made the rate 1.8
            # tokens/s.
            times.append(time.perf_counter() - (decoder.trace.compile_ms or 0.0) / 1000.0)
            kept.update()  # in the next step's time, as in `kvviz run`
        kept.journal.remove()
    return times


def generate_first_token(loaded, choice, prompt_ids: list[int]) -> dict:
    """One request served by plain `model.generate` up to its first token (the strategy's cache, its prompt read in
    chunks where it says, as generate(prefill_chunk_size=N) reads it), every allocation counted as
    `first_token.measure_first_token` counts kvviz's (`allocations`): its peak beside the model's own bytes, and its
    time to first token."""
    model = loaded.model
    ids = torch.tensor([prompt_ids], device=model.device)
    chunk = choice.options.get("prefill_chunk") or None
    strategy = strategies.get(choice.name)
    with torch.inference_mode(), allocations.counting(model.device) as counted:
        started = time.perf_counter()
        cache = strategy.make_cache(model, choice.options, strategies.capacity_for(choice, len(prompt_ids) + 1))
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=1, cache=cache,
                             prefill_chunk_size=chunk, pad_token_id=loaded.tokenizer.eos_token_id)
        ttft_ms = (time.perf_counter() - started) * 1000.0
    return {"peak_bytes": measure.model_bytes(model) + counted.peak_bytes, "ttft_ms": ttft_ms,
            "token_id": int(out[0, -1])}


def kvviz_first_token(loaded, choice, prompt_ids: list[int], second: int) -> dict:
    """kvviz's own measurement of one request (`first_token.measure_first_token`), and its prediction at `second`
    tokens beside a measurement there."""
    measured = first_token.measure_first_token(loaded, choice, prompt_ids)
    there = first_token.measure_first_token(loaded, choice, prompt_ids[:second])
    predicted = first_token.predict(loaded.model, choice, measured, second,
                                    first_token.arithmetic(loaded.model, len(prompt_ids)))
    return {"peak_bytes": measured.peak_bytes, "ttft_ms": measured.ttft_ms, "token_id": measured.token_id,
            "weight_bytes": measured.weight_bytes, "cache_bytes": measured.cache_bytes,
            "second": {"tokens": second, "peak_bytes": there.peak_bytes, "ttft_ms": there.ttft_ms,
                       "predicted_peak_bytes": predicted.peak_bytes, "predicted_ttft_ms": predicted.ttft_ms}}


def first_token_main(request: dict) -> dict:
    """A side of `kvviz bench --first-token`: one request of the text's first `tokens` tokens, after a warm-up request
    of a few tokens (kernels, the allocator's first pages)."""
    loaded = models.load_model(request["model"], dtype=request["dtype"], device=request["device"])
    choice = strategies.choose(request["strategy"], request.get("options") or {})
    ids, _ = tokenize(loaded.tokenizer, request["text"], request["tokens"])
    if request["side"] == "generate-first":
        generate_first_token(loaded, choice, ids[:WARM_UP_TOKENS * 4])
        result = generate_first_token(loaded, choice, ids)
    else:
        first_token.measure_first_token(loaded, choice, ids[:WARM_UP_TOKENS * 4])
        result = kvviz_first_token(loaded, choice, ids, request["second"])
    return {"side": request["side"], "tokens": len(ids), "threads": torch.get_num_threads(), **result}


def main(request: dict) -> dict:
    if request["side"].endswith("-first"):
        return first_token_main(request)
    loaded = models.load_model(request["model"], dtype=request["dtype"], device=request["device"])
    choice = strategies.choose(request["strategy"], request.get("options") or {})
    prompt = request["prompt"]
    if request["side"] == "generate":
        prompt_ids = decode.encode_prompt(loaded.tokenizer, prompt, raw=True)
        run = lambda n: generate_times(loaded, choice, prompt_ids, n)  # noqa: E731
    else:
        run = lambda n: kvviz_times(loaded, choice, prompt, n)  # noqa: E731
    run(WARM_UP_TOKENS)
    times = run(request["new_tokens"])
    return {
        "side": request["side"],
        "tokens_per_s": decode_rate(times),
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.stdin.read()))))  # on stdin: a text is longer than an argument may be
