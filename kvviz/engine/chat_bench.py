"""`kvviz chat-bench`: the conversation targets, measured on scripted chats.

Two scripted conversations built from the shipped Alice in Wonderland text (so that every machine runs the same):

- reuse: turns whose messages are passages of the book (about 150 tokens each, so that the history passes 1,500
  tokens by turn 10) through a dynamic cache; after every turn a full prefill of the whole history into a fresh
  cache is measured (`Conversation.reprefill`), beside the turn's time to first token with the cache kept.
- bounded: a long chat of short messages through each bounded strategy; the cache's measured bytes at every step
  of turns 10 to the last against the bytes of the strategy's budget, and the decode speed of turn 5 against the
  last turn's.

Replies stop at the end-of-sequence token as a chat's do (their lengths are the model's), greedy.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from kvviz.engine.conversation import Conversation
from kvviz.engine.decode import GenerationSettings
from kvviz.engine.models import LoadedModel
from kvviz.engine.strategies import StrategyChoice
from kvviz.files.documents import builtin

PASSAGE_CHARS = 640  # about 150 tokens of the book per message in the reuse chat


def _paragraphs() -> list[str]:
    text = builtin("alice").text
    return [re.sub(r"\s+", " ", p).strip() for p in text.split("\n\n") if len(p.split()) > 12]


def reuse_messages(turns: int) -> list[str]:
    """Messages that each quote a passage of the book and ask about it."""
    passages, current = [], ""
    for paragraph in _paragraphs():
        current = f"{current} {paragraph}".strip()
        if len(current) >= PASSAGE_CHARS:
            passages.append(current[:PASSAGE_CHARS].rsplit(" ", 1)[0])
            current = ""
        if len(passages) == turns:
            break
    return [f"Here is a passage from a book:\n\n{p}\n\nWhat happens in it, in two sentences?" for p in passages]


def short_messages(turns: int) -> list[str]:
    """Short messages: a sentence of the book and a question."""
    sentences = [s.strip() for p in _paragraphs() for s in re.split(r"(?<=[.!?])\s+", p) if 6 <= len(s.split()) <= 30]
    return [f'"{sentences[i % len(sentences)]}" Who says or does this?' for i in range(turns)]


def _chat(loaded: LoadedModel, choice: StrategyChoice, messages: list[str], new_tokens: int, reprefill: bool,
          log: Callable[[str], None]) -> Conversation:
    conversation = Conversation(loaded, choice, GenerationSettings(max_new_tokens=new_tokens))
    started = time.perf_counter()
    for i, message in enumerate(messages):
        turn = conversation.send(message)
        for _ in turn:
            pass
        if reprefill:
            conversation.reprefill(turn)
        record = turn.record
        log(f"{choice.label()}: turn {i + 1}/{len(messages)}, {record.end:,} tokens in context, "
            f"{time.perf_counter() - started:.0f} s")
    return conversation


def reuse(loaded: LoadedModel, choice: StrategyChoice, turns: int, new_tokens: int, log) -> dict:
    conversation = _chat(loaded, choice, reuse_messages(turns), new_tokens, True, log)
    rows = [{"turn": t.index + 1, "history_tokens": t.prompt_end, "fed": t.recomputed, "ttft_ms": t.ttft_ms,
             "reprefill_ms": t.reprefill_ms, "logit_diff": t.reprefill_logit_diff, "note": t.note}
            for t in conversation.trace.turns]
    last = rows[-1]
    return {"strategy": choice.label(), "turns": rows, "last_turn": last["turn"],
            "history_tokens": last["history_tokens"], "ttft_ms": last["ttft_ms"], "reprefill_ms": last["reprefill_ms"],
            "ttft_share_of_reprefill": last["ttft_ms"] / last["reprefill_ms"]}


def bounded(loaded: LoadedModel, choice: StrategyChoice, budget_tokens: int, turns: int, new_tokens: int,
            log, early_turn: int, flat_from: int) -> dict:
    """early_turn: the turn whose decode speed the last turn's is compared with; flat_from: the cache's bytes are
    compared with the budget's from this turn on (both 1-based)."""
    conversation = _chat(loaded, choice, short_messages(turns), new_tokens, False, log)
    trace = conversation.trace
    budget_bytes = budget_tokens * conversation.run.geometry.kv_bytes_per_token
    late = [s.cache_bytes for s in trace.steps if s.turn >= flat_from - 1 and s.cache_bytes is not None]
    early, last = trace.turns[early_turn - 1], trace.turns[-1]
    return {
        "strategy": choice.label(),
        "turns": len(trace.turns),
        "early_turn": early_turn,
        "flat_from": flat_from,
        "tokens_in_context": last.end,
        "budget_bytes": budget_bytes,
        "min_bytes": min(late),
        "max_bytes": max(late),
        "largest_deviation": max(abs(b - budget_bytes) for b in late) / budget_bytes,
        "early_tokens_per_s": early.decode_tokens_per_s,
        "last_tokens_per_s": last.decode_tokens_per_s,
        "speed_ratio": (last.decode_tokens_per_s / early.decode_tokens_per_s
                        if last.decode_tokens_per_s and early.decode_tokens_per_s else None),
        "refilled_turns": sum(1 for t in trace.turns if t.note and "prefilled again" in t.note),
        "evicted": sum(t.evicted for t in trace.turns),
    }
