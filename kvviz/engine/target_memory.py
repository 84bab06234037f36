"""The memory a cache configuration needs at the user's target: a context length, a number of sequences and a
budget, from the cache's own size rule (`CachePredictor`), not from a formula of layers x heads x head_dim.

The rule is replayed as an evaluation reads a text (`evaluate.feed_sizes`): SnapKV half the text as its prompt, then
as many tokens per forward as `Strategy.feed_span` allows (a chunk where the cache keeps every token exactly, up to its
next quantization for a quantized one, else one). So every
layer kind counts as it allocates: full attention grows, a sliding window or an eviction budget stops growing,
a quantized cache packs all but its full-precision residual, a static cache reserves every slot up front, a
state-space layer keeps its fixed state; and a policy's own state (H2O's attention sums) is added. At the
length a sweep measured, the rule's figure is checked against the measured cache (`predicted_at_measured`).
"""

from __future__ import annotations

from dataclasses import replace

from kvviz.engine.evaluate import feed_sizes, prompt_tokens
from kvviz.engine.geometry import Geometry
from kvviz.engine.strategies import StrategyChoice, capacity_for, get
from kvviz.errors import OptionError
from kvviz.files.sweep import TargetMemory

STREAMS = 10**9  # tokens: a length no context reaches, to ask whether a strategy numbers positions past any context


def size_at(model, choice: StrategyChoice, tokens: int, chunk: int, sequences: int = 1,
            slots: int | None = None) -> tuple[int | None, int]:
    """(cache bytes, policy bytes) after `sequences` sequences have each been read for `tokens` tokens; cache
    bytes are None where a state's size has no formula. `chunk`: the tokens per forward of a cache that keeps
    every token exactly (1 where the model takes one at a time); `slots`: what a static cache reserves (default
    `tokens`; an evaluation reserves one more, for the text's last token, which it only predicts)."""
    strategy = get(choice.name)
    geometry = replace(Geometry.of(model.config, model.dtype), batch=sequences)
    predictor = strategy.predictor(choice.options, geometry, capacity_for(choice, slots or tokens))
    try:
        prompt = prompt_tokens(choice, tokens + 1)  # an evaluation of n + 1 tokens feeds n
    except OptionError:  # so short a text that SnapKV keeps it whole: fed token by token, it never evicts
        prompt = 0
    for size in feed_sizes(tokens, lambda fed: strategy.feed_span(choice.options, fed, chunk), prompt):
        for forward in strategy.feed_forwards(size):
            predictor.feed(forward)
    return predictor.cache_bytes(), predictor.policy_bytes()


def per_sequence(model, choice: StrategyChoice, tokens: int, chunk: int) -> int | None:
    cache, policy = size_at(model, choice, tokens, chunk)
    return None if cache is None else cache + policy


def longest_context(model, choice: StrategyChoice, budget: int, chunk: int) -> tuple[int | None, str]:
    """The longest context one sequence reaches within `budget` bytes, and what stops it there: "budget", "context"
    (the model numbers no more positions) or "none" (the cache stops growing below the budget and numbers
    positions past any context: attention sinks; the length is then None)."""
    context = Geometry.of(model.config, model.dtype).context
    streams = context is None or get(choice.name).positions_needed(choice.options, STREAMS) <= context
    reach = context or STREAMS
    if streams:
        reach = min(reach, 1 << 20)  # past this, a cache that grows would already have shown it
    if (per_sequence(model, choice, reach, chunk) or 0) <= budget:
        return (None, "none") if streams else (reach, "context")
    low, high = 0, reach  # within the budget at low, over it at high
    while high - low > 1:
        middle = (low + high) // 2
        size = per_sequence(model, choice, middle, chunk)
        low, high = (middle, high) if size is not None and size <= budget else (low, middle)
    return low, "budget"


def target_memory(model, choice: StrategyChoice, context: int, sequences: int, budget: int | None, chunk: int,
                  measured_tokens: int | None) -> TargetMemory:
    """A configuration's memory at `context` tokens for `sequences` sequences, what fits in `budget` bytes (None:
    no budget given), and the size rule's cache bytes after the `measured_tokens` tokens a sweep fed (None: none
    yet), to check against the cache measured there."""
    cache, policy = size_at(model, choice, context, chunk, sequences)
    one = per_sequence(model, choice, context, chunk)
    fit, longest, limit = None, None, "none"
    if budget is not None and one is not None:
        fit = budget // one if one else None
        longest, limit = longest_context(model, choice, budget, chunk)
    checked = size_at(model, choice, measured_tokens, chunk, slots=measured_tokens + 1)[0] if measured_tokens else None
    return TargetMemory(cache_bytes=cache, policy_bytes=policy, per_sequence_bytes=one, sequences_in_budget=fit,
                        longest_context=longest, longest_limit=limit, predicted_at_measured=checked)
