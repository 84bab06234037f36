"""The memory a cache configuration needs at the user's target: a context length, a number of sequences and a
budget, from the cache's own size rule (`CachePredictor`), not from a formula of layers x heads x head_dim.

The rule is replayed as an evaluation reads a text (`evaluate.feed_sizes`): SnapKV half the text as its prompt, then
as many tokens per forward as `Strategy.feed_span` allows (a chunk where the cache keeps every token exactly, up to its
next quantization for a quantized one, else one). So every
layer kind counts as it allocates: full attention grows, a sliding window or an eviction budget stops growing,
a quantized cache packs all but its full-precision residual, a static cache reserves every slot up front, a
state-space layer keeps its fixed state; and a policy's own state (H2O's attention sums) is added. At the
length a sweep measured, the rule's figure is checked against the measured cache (`predicted_at_measured`).

Beside the cache, what serving a request needs (`first_token`): one request's prefill at its peak, measured at the
text's length and predicted at the target, and the process's peak serving every sequence. The budget bounds the caches
(as it always did) or, where the user says so, the whole process.
"""

from __future__ import annotations

from dataclasses import replace

from kvviz.engine.evaluate import feed_sizes, prompt_tokens
from kvviz.engine.first_token import Served, predict
from kvviz.engine.geometry import Geometry
from kvviz.engine.strategies import StrategyChoice, capacity_for, get
from kvviz.errors import OptionError
from kvviz.files.sweep import Question, TargetMemory

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
    if prompt:
        strategy.predict_prompt(predictor, choice.options, prompt)
    for size in feed_sizes(tokens - prompt, lambda fed: strategy.feed_span(choice.options, prompt + fed, chunk)):
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


def served_bytes(model, choice: StrategyChoice, tokens: int, chunk: int, served: Served) -> int | None:
    """The process serving one sequence of `tokens` tokens at its peak: the weights beside its prompt's prefill at its
    peak (`first_token.predict`) or, where more, its cache (None where either is unknown)."""
    peak = predict(model, choice, served.measured, tokens, served.speed).peak_bytes
    one = per_sequence(model, choice, tokens, chunk)
    if peak is None or one is None:
        return None
    weights = served.measured.weight_bytes
    return weights + max(peak - weights, one)


def longest_served(model, choice: StrategyChoice, budget: int, chunk: int, served: Served) -> tuple[int | None, str]:
    """The longest context one sequence can be served at within `budget` bytes of the process (`served_bytes`), and what
    stops it there: "budget" or "context" (None: not even one token)."""
    context = Geometry.of(model.config, model.dtype).context or 1 << 20

    def fits(tokens: int) -> bool:
        size = served_bytes(model, choice, tokens, chunk, served)
        return size is not None and size <= budget

    if fits(context):
        return context, "context"
    low, high = 0, context  # within the budget at low, over it at high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return (low or None), "budget"


def target_memory(model, choice: StrategyChoice, question: Question, chunk: int, measured_tokens: int | None,
                  served: Served | None = None) -> TargetMemory:
    """A configuration's memory at the question's context for its sequences, what fits in its budget, and the size
    rule's cache bytes after the `measured_tokens` tokens a sweep fed (None: none yet), to check against the cache
    measured there. With `served` (a request measured at the text's length), one request served at the context up to
    its first token (`first_token.predict`) and the process's peak; the budget then bounds what the question says it
    covers (the caches, or the process)."""
    context, sequences, budget = question.context, question.sequences, question.budget_bytes
    cache, policy = size_at(model, choice, context, chunk, sequences)
    one = per_sequence(model, choice, context, chunk)
    at = None if served is None else predict(model, choice, served.measured, context, served.speed)
    first = None if served is None else served_bytes(model, choice, context, chunk, served)
    # every sequence holding its cache, or all but one while one more's prompt is read, whichever is more
    process = None if first is None else first + (sequences - 1) * one
    fit, longest, limit = None, None, "none"
    if budget is not None and one is not None and question.budget_covers == "cache":
        fit = budget // one if one else None
        longest, limit = longest_context(model, choice, budget, chunk)
    elif budget is not None and first is not None:
        fit = None if not one else 0 if first > budget else 1 + (budget - first) // one
        longest, limit = longest_served(model, choice, budget, chunk, served)
    checked = size_at(model, choice, measured_tokens, chunk, slots=measured_tokens + 1)[0] if measured_tokens else None
    return TargetMemory(cache_bytes=cache, policy_bytes=policy, per_sequence_bytes=one, sequences_in_budget=fit,
                        longest_context=longest, longest_limit=limit, predicted_at_measured=checked, first_token=at,
                        process_bytes=process)
