"""KVzip (Kim et al., 2025, "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction"): keep what the
model needs to repeat the context, whatever the question will be.

After the prompt's own forward (its first token predicted from the whole prompt), the model is asked to repeat the
prompt ("Repeat the previous context exactly.", posed as a chat turn where the tokenizer has a chat template, as
kvpress poses it), in chunks of `repeat_chunk` tokens, each a forward of its own through the cache. A key's score is
the most attention any query of the repeating tokens pays it (over the query heads of its KV head), the softmax taken
over the first `sink_tokens` keys, the chunk being repeated and the repeating tokens themselves; those forwards' keys
are dropped again. Then the lowest scores of all layers and KV heads together are dropped, `budget` per layer and KV
head on average (`layerwise=true`: of each layer's own), the first `sink_tokens` always kept: KV heads and layers keep
different numbers of tokens, stored end to end (`EvictionLayer`'s ragged storage). The reading again is the scoring
cost (`scoring_ms`); decoded tokens are appended.

As kvpress's KVzipPress, whose defaults these are. kvpress takes the first tokens of the prompt to be the chat
template's header whenever the tokenizer has a template, and does not score them; kvviz does so only where the prompt
starts with that header (a raw prompt is scored whole).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from kvviz.engine.scorers import Schedule, ScheduleState, Scorer
from kvviz.engine.strategies.base import Forward, Option
from kvviz.engine.strategies.eviction import BudgetPredictor, EvictionStrategy, budget_option

FIRST_ASK = "\n\nRepeat the previous context exactly."
NEXT_ASK = "\n\nRepeat the part of the previous context exactly, starting with"
OVERLAP = 8  # tokens of the chunk before, given to start each later chunk's repetition (kvpress's)
REPEAT_EXTRA = 24  # about the tokens a repetition feeds besides its chunk: the ask, the template's suffix, the overlap


@dataclass(frozen=True)
class NoSchedule(Schedule):
    """The layers never compress by themselves: the reading again does, once, for all of them."""

    def compress_to(self, state, index, held, new, seen):
        return None


class ReadingAgain(Scorer):
    """Collects, while the context is read again, the most attention each context key receives."""

    def __init__(self, sinks: int):
        self.sinks = sinks
        self.every_feed = False  # True during a forward that reads the context again
        self.scores: torch.Tensor | None = None  # [batch, kv_heads, context]
        self.span = (0, 0)  # the context positions the current forward repeats

    def observe(self, layer, query, key, mask, scaling):
        start, end = self.span
        batch, heads, new, dim = query.shape
        kv_heads = key.shape[1]
        sink = min(self.sinks, start)
        keys = torch.cat([key[:, :, :sink], key[:, :, start:end], key[:, :, -new:]], dim=2)  # [batch, kv, n, dim]
        queries = query.reshape(batch, kv_heads, heads // kv_heads * new, dim)
        logits = (queries @ keys.transpose(-1, -2) / dim**0.5).view(batch, kv_heads, heads // kv_heads, new, -1)
        hidden = torch.ones((new, new), dtype=torch.bool, device=query.device).triu(diagonal=1)
        logits[..., -new:] = logits[..., -new:].masked_fill(hidden, torch.finfo(logits.dtype).min)
        received = logits.softmax(dim=-1)[..., sink : sink + end - start].amax(dim=(2, 3))
        self.scores[..., start:end] = received


class KVzip(EvictionStrategy):
    name = "kvzip"
    description = "KVzip: keep what the model attends to when asked to repeat the context (query-agnostic)"
    reference = ("KVzip (Kim et al., 2025), as kvpress's KVzipPress (4 sinks, chunks of 2,048, one budget for all "
                 "layers and KV heads); the repetition's forwards are timed as scoring")
    compresses_prompt = True
    needs_tokenizer = True
    options = (
        budget_option(),
        Option("sink_tokens", "int", 4, "first tokens always kept", minimum=0),
        Option("layerwise", "bool", False, "every layer keeps the budget (its KV heads share it); false: all layers "
               "and KV heads share one budget, as kvpress"),
        Option("repeat_chunk", "int", 2048, "context tokens repeated per forward", minimum=1),
    )
    scorer = ReadingAgain

    def check_options(self, options):
        if options["sink_tokens"] >= options["budget"]:
            return (f"option 'sink_tokens' of strategy 'kvzip' ({options['sink_tokens']}) must be smaller than "
                    f"'budget' ({options['budget']})")
        return None

    def prefill_chunk_problem(self, options):
        return ("kvzip scores a whole prompt by having the model read it again after its prefill, so it cannot "
                "compress between chunks of it: chunks would lower only the prompt's own forward, while the cache "
                "holds every token until the reading again, which repeat_chunk already reads a chunk at a time; set "
                "repeat_chunk instead")

    def after_prefill_forwards(self, options, tokens):
        if tokens <= options["budget"]:
            return []
        forwards = []
        for start in range(0, tokens, options["repeat_chunk"]):
            fed = min(options["repeat_chunk"], tokens - start) + REPEAT_EXTRA
            scored = options["sink_tokens"] + 2 * fed  # the sinks, the chunk repeated and the repetition
            # those scores held at once; the whole prompt held until the choice
            forwards.append(Forward(fed, tokens, score_rows=fed, score_keys=scored, extra_pairs=fed * scored,
                                    unkept=tokens - options["budget"]))
        return forwards

    def schedule(self, options, geometry):
        return NoSchedule(options["budget"])

    def make_scorer(self, index, options, model):
        return ReadingAgain(options["sink_tokens"])

    def predictor(self, options, geometry, capacity):
        # the prompt is cut to the budget per layer and KV head on average: the same total as every layer keeping it
        return BudgetPredictor(geometry, Schedule(options["budget"]), adaptive=True)

    def prompt_kept(self, options) -> str:
        return (f"its first {options['sink_tokens']} tokens and {options['budget']:,} per layer and KV head on "
                "average, those the model attends to most when it repeats the prompt")

    def switch_from_problem(self, options):
        return ("'kvzip' keeps a different number of tokens in each KV head and layer, which no other cache can take "
                "over; start a new run")

    def switch_to_problem(self, options):
        return ("kvzip scores a prompt by having the model read it again, and a switch moves only keys and values; "
                "start a new run")

    def after_forward(self, run, input_ids: torch.Tensor) -> None:
        from kvviz.engine.eviction_layers import EvictionLayer

        layers = [layer for layer in run.cache.layers if isinstance(layer, EvictionLayer)]
        if not layers or not layers[0].state.prompt:
            return
        for layer in layers:
            layer.state = ScheduleState(prompt=False)  # the prompt is dealt with: decoding appends
        options = run.choice.options
        tokens = input_ids.shape[-1]
        if tokens <= options["budget"]:
            return
        before = [layer.scoring_ms for layer in layers]
        started = time.perf_counter()
        read_again(run, layers, input_ids, options)
        keep_best(layers, options, tokens)
        # each layer also timed its own observing during the reading: the reading is counted once, as a whole
        for layer, spent in zip(layers, before, strict=True):
            layer.scoring_ms = spent
        layers[0].scoring_ms += (time.perf_counter() - started) * 1000.0


def chat_pieces(tokenizer) -> tuple[list[int], list[int]]:
    """The chat template's header before a user message and what follows it to the start of the answer, as kvpress
    finds them; ([], newline) without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return [], tokenizer.encode("\n", add_special_tokens=False)
    dummy = "dummy context"
    separator = "\n" + "#" * len(dummy)
    text = tokenizer.apply_chat_template([{"role": "user", "content": dummy + separator}], add_generation_prompt=True,
                                         tokenize=False, enable_thinking=False)
    before, suffix = text.split(separator)
    header = before.split(dummy)[0]
    return tokenizer.encode(header, add_special_tokens=False), tokenizer.encode(suffix, add_special_tokens=False)


def read_again(run, layers, input_ids: torch.Tensor, options: dict) -> None:
    """The context read again in chunks, each layer's scorer collecting the attention its keys receive."""
    from kvviz.engine.forward import model_forward  # transformers: not imported where strategies are only listed
    tokenizer = run.tokenizer
    header, suffix = chat_pieces(tokenizer)
    ids = input_ids[0].tolist()
    start = len(header) if header and ids[: len(header)] == header else 0
    context = input_ids[:, start:]
    chunks = list(context.split(options["repeat_chunk"], dim=-1))
    suffix_ids = torch.tensor([suffix], device=input_ids.device)
    tokens = input_ids.shape[-1]
    for layer in layers:
        layer.scorer.scores = torch.zeros((*layer.keys.shape[:2], tokens), dtype=layer.keys.dtype,
                                          device=layer.device)
        layer.scorer.every_feed = True
    try:
        for i, chunk in enumerate(chunks):
            ask = tokenizer.encode(FIRST_ASK if i == 0 else NEXT_ASK, add_special_tokens=False)
            ask_ids = torch.tensor([ask], device=input_ids.device)
            if i:
                ask_ids = torch.cat([ask_ids, chunks[i - 1][:, -OVERLAP:]], dim=-1)
            repeat = torch.cat([ask_ids, suffix_ids, chunk], dim=-1)
            for layer in layers:
                layer.scorer.span = (start, start + chunk.shape[-1])
            positions = torch.arange(tokens, tokens + repeat.shape[-1], device=input_ids.device)[None]
            model_forward(run.model, repeat, run.cache, positions)
            for layer in layers:
                layer.drop_newest(repeat.shape[-1])
            start += chunk.shape[-1]
    finally:
        for layer in layers:
            layer.scorer.every_feed = False


def keep_best(layers, options: dict, tokens: int) -> None:
    """Drop the lowest scores of all layers and KV heads together (`layerwise`: of each layer), the sinks kept."""
    scores = torch.stack([layer.scorer.scores for layer in layers])  # [layers, batch, kv_heads, tokens]
    scores[..., : options["sink_tokens"]] = scores.amax() + 1.0
    n_layers, batch, kv_heads, _ = scores.shape
    per_layer = batch * kv_heads * (tokens - options["budget"])
    if options["layerwise"]:
        dropped = [per_layer] * n_layers
    else:
        worst = (-scores.reshape(-1)).topk(per_layer * n_layers).indices
        dropped = torch.bincount(worst // (batch * kv_heads * tokens), minlength=n_layers).tolist()
    for layer, layer_scores, count in zip(layers, scores, dropped, strict=True):
        worst = (-layer_scores.reshape(batch, -1)).topk(count, dim=1).indices
        kept = torch.ones((batch, kv_heads * tokens), dtype=torch.bool, device=layer.device).scatter(1, worst, False)
        layer.keep_ragged(kept.view(batch, kv_heads, tokens))
        layer.scorer.scores = None
