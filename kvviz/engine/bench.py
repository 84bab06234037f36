"""Decoder overhead: decode tokens/s of kvviz's instrumented loop against `model.generate`.

Both sides use the same model, the same cache strategy (the same cache class, freshly built),
the same prompt and the same number of new tokens, with greedy decoding past EOS. Runs are
interleaved (generate, kvviz, generate, kvviz, ...) so that drift in machine load hits both.
Decode time is measured from the first new token to the last, so the prefill is left out.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from transformers.generation.streamers import BaseStreamer

from kvviz.engine import decode, models, strategies

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


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


def _decode_rate(times: list[float]) -> float:
    """Tokens/s between the first and the last new token."""
    return (len(times) - 1) / (times[-1] - times[0])


def _generate_rate(loaded, choice, settings, prompt_ids, new_tokens) -> float:
    model = loaded.model
    strategy = strategies.get(choice.name)
    capacity = strategies.capacity_for(choice, len(prompt_ids) + new_tokens)
    cache = strategy.make_cache(model, choice.options, capacity)
    clock = _TokenClock()
    kwargs = {"use_cache": False} if cache is None else {"cache": cache}
    ids = torch.tensor([prompt_ids], device=model.device)
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            streamer=clock,
            pad_token_id=loaded.tokenizer.eos_token_id,
            **kwargs,
        )
    return _decode_rate(clock.times)


def _kvviz_rate(loaded, choice, settings, prompt) -> float:
    decoder = decode.Decoder(loaded, choice, settings, prompt)
    times = []
    for _ in decoder:
        times.append(time.perf_counter())
    return _decode_rate(times)


def run_bench(
    model_spec: str,
    names: list[str],
    new_tokens: int,
    repeats: int,
    dtype: str = "auto",
    device: str = "auto",
    log: Callable[[str, float | None], None] = lambda message, fraction: None,
) -> dict:
    loaded = models.load_model(model_spec, dtype=dtype, device=device, progress=log)
    settings = decode.GenerationSettings(max_new_tokens=new_tokens, raw=True, stop_at_eos=False)
    prompt_ids = decode.encode_prompt(loaded.tokenizer, PROMPT, raw=True)
    results = {}
    for name in names:
        choice = strategies.choose(name)
        ok, reason = strategies.get(name).available()
        if not ok:
            results[name] = {"skipped": reason}
            continue
        # one untimed pass of each warms up kernels (and quanto's JIT build)
        _generate_rate(loaded, choice, settings, prompt_ids, 4)
        _kvviz_rate(loaded, choice, decode.GenerationSettings(max_new_tokens=4, raw=True, stop_at_eos=False), PROMPT)
        gen, ours = [], []
        for r in range(repeats):
            log(f"{name}: repeat {r + 1}/{repeats}", None)
            gen.append(_generate_rate(loaded, choice, settings, prompt_ids, new_tokens))
            ours.append(_kvviz_rate(loaded, choice, settings, PROMPT))
        results[name] = {
            "generate_tokens_per_s": statistics.median(gen),
            "kvviz_tokens_per_s": statistics.median(ours),
            "ratio": statistics.median(ours) / statistics.median(gen),
            "generate_runs": gen,
            "kvviz_runs": ours,
        }
    return {
        "model": loaded.card["name"],
        "new_tokens": new_tokens,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "strategies": results,
    }
