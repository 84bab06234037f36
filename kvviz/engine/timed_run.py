"""One timed decode in a fresh Python process: the two sides of `kvviz bench`.

    python -m kvviz.engine.timed_run '{"side": "generate" | "kvviz", "model": ..., "dtype": ..., "device": ...,
                                       "strategy": ..., "options": {...}, "prompt": ..., "new_tokens": N}'

prints one JSON line: the decode rate (tokens/s between the first and the last new token, so the
prefill is left out), the torch thread count and the environment's OMP settings. Side "generate" is
plain `model.generate` with the strategy's cache, as a user's own script would run it; side "kvviz"
is kvviz's instrumented decoder as a default `kvviz run` uses it: its trace journaled step by step in
the working folder (then removed). Each runs a short warm-up first (kernels, quanto's first build),
and each side gets a process of its own, started from the user's environment, so neither inherits
the other's state.
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

from kvviz.engine import decode, models, strategies
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


def main(request: dict) -> dict:
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
    print(json.dumps(main(json.loads(sys.argv[1]))))
