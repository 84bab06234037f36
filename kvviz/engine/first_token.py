"""What serving one request costs up to its first token: the process's peak memory and the time to first token, as
the user's code would meet them, measured at one prompt length and predicted at another.

The measurement: a fresh cache of the configuration reads a prompt as a prefill (`CacheRun.prefill`: one forward, or
chunks of prefill_chunk with the policy acting after each), the cache's own work after it included (KVzip's reading
again, SnapKV's scores), the last position's logits only (as `generate` asks for them), and the first token is picked.
Its time is the time to first token; every allocation it makes is counted (`allocations`), and its peak, on top of the
model's own weights and buffers, is the process's peak memory for that request.

The prediction at another length t: the weights as they are; the cache after the prefill by the strategy's own size
rule (the prefill's forwards replayed, as `target_memory` replays a reading); and what the prefill holds beside them at
its peak (activations, logits, a policy's scores) scaled from the measurement by the shape of its widest forward
(`activation_bytes`): its tokens through the model's widest layer, the keys and values of what it attends to
expanded to every query head, where the attention implementation materializes them (eager) its scores and
probabilities, quadratic in the tokens, and what a cache holds only until it has chosen (KVzip). The time scales by
the forwards' arithmetic (`prefill_seconds`): every weight twice per token, and attention per pair of a query and the
key it reads, each at the speed this machine does it at that length (`machine.arithmetic_speed`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from kvviz.engine import allocations, machine, measure
from kvviz.engine.attention_scores import QUERY_CHUNK
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.geometry import Geometry, text_config
from kvviz.engine.models import LoadedModel
from kvviz.engine.strategies import StrategyChoice, capacity_for, get
from kvviz.engine.strategies.base import Forward
from kvviz.files.first_token import FirstToken, FirstTokenAt

QUADRATIC_ATTENTION = ("eager",)  # attention implementations that hold a forward's [heads, queries, keys] scores


@dataclass(frozen=True)
class Served:
    """A request measured at one length (`measure_first_token`) and this machine's arithmetic at that length
    (`arithmetic`): what `predict` needs for any other."""

    measured: FirstToken
    speed: machine.ArithmeticSpeed


def measure_first_token(loaded: LoadedModel, choice: StrategyChoice, ids: list[int]) -> FirstToken:
    """Serve one request of prompt `ids` through a fresh cache of `choice` up to its first token (see the module
    docstring); the strategy's one-time preparation (kernel builds) first, apart. Raises OptionError where the
    configuration cannot run here."""
    model = loaded.model
    prompt = torch.tensor([ids], device=model.device)
    weights = measure.model_bytes(model)
    run = CacheRun(model, choice, capacity_for(choice, len(ids) + 1), tokenizer=loaded.tokenizer)
    run.warm_up(lambda message: None)
    del run  # built to warm up: the counted request builds its own, as the user's code would
    with torch.inference_mode(), allocations.counting(model.device) as counted:
        started = time.perf_counter()
        run = CacheRun(model, choice, capacity_for(choice, len(ids) + 1), tokenizer=loaded.tokenizer)
        logits = run.prefill(prompt)
        token = int(logits[0, -1].argmax())
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        ttft_ms = (time.perf_counter() - started) * 1000.0
    cache = sum(layer.total_bytes for layer in run.measure(slots=False)) + run.policy_bytes()
    return FirstToken(tokens=len(ids), token_id=token, peak_bytes=weights + counted.peak_bytes, weight_bytes=weights,
                      cache_bytes=cache, ttft_ms=ttft_ms, attention=attention_implementation(model))


def attention_implementation(model) -> str:
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


def prefill_shape(model, choice: StrategyChoice, tokens: int) -> list[Forward]:
    """The forwards that serve a prompt of `tokens` tokens through `choice`'s cache: the prefill's (what the cache holds
    before a chunk is at most what it keeps of a prompt, `Strategy.prompt_capacity`; every query's scores held where
    the attention implementation materializes them; where the policy scores every query, `Strategy.scores_every_query`,
    every pair scored again, `attention_scores.QUERY_CHUNK` queries' held at a time), then those the cache runs of its
    own after it (`Strategy.after_prefill_forwards`: KVzip's reading again)."""
    strategy = get(choice.name)
    capacity = strategy.prompt_capacity(choice.options)
    quadratic = attention_implementation(model) in QUADRATIC_ATTENTION
    scoring = strategy.scores_every_query(choice.options)
    shape, fed = [], 0
    for size in strategy.prompt_forwards(choice.options, tokens):
        past = fed if capacity is None else min(fed, capacity)
        pairs = size * (past + (size + 1) // 2)  # causal: each token reads what is held and its own chunk up to it
        # eager attention holds every query's scores; a policy scoring every query holds a chunk of queries' at once
        rows = size if quadratic else min(size, QUERY_CHUNK) if scoring else 0
        shape.append(Forward(size, past, score_rows=rows, score_keys=past + size, extra_pairs=pairs if scoring else 0))
        fed += size
    return shape + strategy.after_prefill_forwards(choice.options, tokens)


def widths(model) -> tuple[int, int]:
    """The model's hidden size and its widest layer's (the MLP's intermediate size; four times the hidden size where the
    config does not say)."""
    config = text_config(model.config)
    geometry = Geometry.of(model.config, model.dtype)
    hidden = getattr(config, "hidden_size", None) or geometry.num_attention_heads * geometry.head_dim
    return hidden, getattr(config, "intermediate_size", None) or 4 * hidden


def activation_bytes(model, forward: Forward) -> int:
    """What `forward` holds at its widest beside the weights and the cache the prompt leaves, from the model's shapes
    (a scale, not a count: `predict` takes ratios of it): each token fed through the widest layer (the MLP's two
    intermediate activations and their product, and four of the hidden size), the held keys and values expanded to
    every query head, the scores and probabilities of each fed token over the keys they are materialized for, and
    the tokens held that the cache drops once the prompt is served."""
    geometry = Geometry.of(model.config, model.dtype)
    hidden, wide = widths(model)
    element = geometry.element
    per_token = element * (3 * wide + 4 * hidden)
    per_past_key = 2 * geometry.num_attention_heads * geometry.head_dim * element
    per_score = 2 * geometry.num_attention_heads * element
    return (forward.fed * per_token + forward.past * per_past_key + forward.score_rows * forward.score_keys * per_score
            + forward.unkept * geometry.kv_bytes_per_token)


def arithmetic(model, tokens: int) -> machine.ArithmeticSpeed:
    """This machine's speed in the model's projections and attention, at a prompt of `tokens` tokens."""
    geometry = Geometry.of(model.config, model.dtype)
    hidden, wide = widths(model)
    return machine.arithmetic_speed(model.device, model.dtype, tokens, hidden, wide, geometry.num_attention_heads,
                                    geometry.kv_heads, geometry.head_dim)


def prefill_seconds(model, choice: StrategyChoice, tokens: int, speed: machine.ArithmeticSpeed) -> float:
    """The arithmetic of the forwards serving a prompt of `tokens` tokens (`prefill_shape`), in seconds at `speed`:
    every weight but the input embedding's (a lookup) twice per token fed (a multiply and an add), and per query-key
    pair read, four per head dimension of every attention layer (scores, then values), as much again per pair a
    policy scores beside the attention (H2O's sums, KVzip's reading again)."""
    geometry = Geometry.of(model.config, model.dtype)
    weights = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    pair = 4 * geometry.num_attention_heads * geometry.head_dim * geometry.num_layers
    return sum(2.0 * weights * f.fed * speed.linear_s
               + pair * (f.fed * (f.past + (f.fed + 1) / 2) + f.extra_pairs) * speed.attention_s
               for f in prefill_shape(model, choice, tokens))


def prefill_cache_bytes(model, choice: StrategyChoice, tokens: int) -> int | None:
    """The cache and its policy's bytes after a prefill of `tokens` tokens, by the strategy's size rule (None where a
    state's size has no formula)."""
    strategy = get(choice.name)
    geometry = Geometry.of(model.config, model.dtype)
    predictor = strategy.predictor(choice.options, geometry, capacity_for(choice, tokens + 1))
    strategy.predict_prompt(predictor, choice.options, tokens)
    cache = predictor.cache_bytes()
    return None if cache is None else cache + predictor.policy_bytes()


def widest(model, choice: StrategyChoice, tokens: int) -> int:
    return max((activation_bytes(model, forward) for forward in prefill_shape(model, choice, tokens)), default=0)


def predict(model, choice: StrategyChoice, measured: FirstToken, tokens: int,
            speed: machine.ArithmeticSpeed) -> FirstTokenAt:
    """The peak memory and time to first token of a prompt of `tokens` tokens, from `measured` at its own length (see
    the module docstring), the time scaled by the arithmetic at `speed` (`arithmetic`); the measurement itself where
    the lengths are equal."""
    if tokens == measured.tokens:
        return FirstTokenAt(tokens, measured.peak_bytes, measured.ttft_ms, predicted=False)
    cache_then = prefill_cache_bytes(model, choice, measured.tokens)
    cache_now = prefill_cache_bytes(model, choice, tokens)
    peak = None
    if measured.peak_bytes is not None and cache_then is not None and cache_now is not None:
        beside = max(0, measured.peak_bytes - measured.weight_bytes - cache_then)
        scale = widest(model, choice, tokens) / widest(model, choice, measured.tokens)
        peak = measured.weight_bytes + cache_now + round(beside * scale)
    scale = prefill_seconds(model, choice, tokens, speed) / prefill_seconds(model, choice, measured.tokens, speed)
    return FirstTokenAt(tokens, peak, measured.ttft_ms * scale, predicted=True)
