"""A conversation kept as a file: its turns, their token ranges and roles, and what each turn cost.

Plain data (stdlib + numpy): `kvviz.engine.conversation` produces these records, `kvviz chat`, `kvviz trace` and
the window read them. A conversation trace is JSON:

    {"format": "kvviz-conversation", "version": 1, "model": {...}, "strategy": {"name", "options"},
     "system": str, "template": str, "settings": {...}, "capacity": int, "prefix": {...} | null,
     "messages": [{"role", "content", "turn", "start", "end"}], "turns": [{...}], "steps": [{...}],
     "cancelled": bool, "error": str | null, "summary": {...}}

Token ranges count the tokens of the templated history, from 0; `end` is exclusive. A message's range is the
one it had when its turn ran (an edited or regenerated turn keeps its own). Steps are the generated tokens of
every turn, in order, with the figures the plots draw (per-layer records stay in `kvviz run`'s traces).

While a chat runs, each finished turn is journaled beside the file it becomes (`ConversationJournal`,
`kvviz.files.journal`): a killed chat loses at most the turn in progress, and its journal opens (File ▸ Open,
`kvviz trace`) as the conversation so far.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvviz.files.file_format import FileFormat
from kvviz.files.journal import Journal, ended_without_saving, journal_path
from kvviz.files.jsonfile import KeptFileError, write_json
from kvviz.files.schema import (
    MAX_BYTES,
    Flag,
    Int,
    Json,
    ListOf,
    Number,
    Record,
    Refusal,
    Text,
    at,
    optional,
)
from kvviz.files.trace_schema import MAX_MS, MAX_POSITIONS, MODEL_CARD, SETTINGS, STRATEGY

FORMAT = "kvviz-conversation"
VERSION = 1
ROLES = ("system", "user", "assistant")
TURN_KINDS = ("send", "regenerate", "edit")  # a new message; the last answer again; an earlier message changed


@dataclass
class MessageRecord:
    role: str  # one of ROLES
    content: str
    turn: int | None  # the turn that added it (None: the system prompt)
    start: int  # its tokens in the templated history: [start, end)
    end: int


@dataclass
class TurnRecord:
    """One user message and the reply to it, and what the turn cost."""

    index: int
    chat: int  # 0 for the first chat, one more for each new chat started from the cached prefix
    kind: str  # one of TURN_KINDS
    strategy: dict[str, Any]  # {"name", "options"} when the turn ended
    start: int  # tokens in context before the user's message (its first token)
    prompt_end: int  # tokens in context when generation began: the whole templated history
    end: int  # tokens in context at the turn's end (prompt_end + new tokens)
    kept: int  # tokens of the history the cache already held and kept
    recomputed: int  # tokens of the history fed at this turn's prefill (prompt_end - kept)
    new_tokens: int
    ttft_ms: float | None  # time to first token: the prefill of the `recomputed` tokens and the first pick
    decode_tokens_per_s: float | None  # None: fewer than two new tokens
    cache_bytes: int | None  # measured at the turn's end
    policy_bytes: int | None
    tokens_held: int | None  # by the cache at the turn's end (its first layer)
    evicted: int  # tokens the cache dropped during the turn (measured: held against seen)
    reprefill_ms: float | None = None  # a full prefill of the whole history into a fresh cache, measured on request
    reprefill_logit_diff: float | None = None  # largest |logit| difference of that prefill against the kept cache
    prefix_copy_bytes: int | None = None  # a new chat's deep copy of the cached prefix, measured
    note: str | None = None  # what the turn did to the cache that a user should know (crops, refills, eviction)
    cancelled: bool = False


@dataclass
class ConversationStep:
    """One generated token of a turn."""

    turn: int
    phase: str  # "prefill" (the turn's first token) or "decode"
    position: int  # tokens in context when the token was picked
    token: str
    wall_ms: float
    cache_bytes: int | None
    predicted_cache_bytes: int | None
    policy_bytes: int | None
    tokens_held: int | None
    strategy: str


@dataclass
class PrefixRecord:
    """The cached prefix new chats start from (the system prompt and the template's opening)."""

    tokens: int
    cache_bytes: int
    prefill_ms: float


@dataclass
class ConversationTrace:
    model: dict[str, Any]
    strategy: dict[str, Any]  # the strategy the conversation started with
    system: str = ""
    template: str = ""  # how turns were written: "chat template" or the plain format used instead
    settings: dict[str, Any] = field(default_factory=dict)
    capacity: int = 0  # token slots a preallocating cache reserves for the conversation
    prefix: PrefixRecord | None = None
    messages: list[MessageRecord] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    steps: list[ConversationStep] = field(default_factory=list)
    cancelled: bool = False
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        done = [t for t in self.turns if not t.cancelled]
        ttft = [t.ttft_ms for t in done if t.ttft_ms is not None]
        reprefill = [t.reprefill_ms for t in done if t.reprefill_ms is not None]
        return {
            "turns": len(self.turns),
            "chats": 1 + max((t.chat for t in self.turns), default=0),
            "tokens_in_context": self.turns[-1].end if self.turns else 0,
            "new_tokens": sum(t.new_tokens for t in self.turns),
            "ttft_ms_mean": float(np.mean(ttft)) if ttft else None,
            "reprefill_ms_mean": float(np.mean(reprefill)) if reprefill else None,
            "final_cache_bytes": self.turns[-1].cache_bytes if self.turns else None,
            "peak_cache_bytes": max((t.cache_bytes for t in self.turns if t.cache_bytes is not None), default=None),
            "evicted": sum(t.evicted for t in self.turns),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "strategy": self.strategy,
            "system": self.system,
            "template": self.template,
            "settings": self.settings,
            "capacity": self.capacity,
            "prefix": asdict(self.prefix) if self.prefix else None,
            "messages": [asdict(m) for m in self.messages],
            "turns": [asdict(t) for t in self.turns],
            "steps": [vars(s) for s in self.steps],
            "cancelled": self.cancelled,
            "error": self.error,
            "summary": self.summary(),
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically and completely, even when Ctrl-C comes during the save (`kvviz.files.jsonfile`)."""
        return write_json(path, self.to_dict)


# -- the journal of a conversation while it runs ------------------------------------------------------------

_GROWING = ("messages", "turns", "steps")  # the lists a turn adds to


class ConversationJournal:
    """A conversation kept as it goes (`kvviz.files.journal`), beside the file it becomes: `update()` after each
    finished turn (fsynced), `remove()` once the conversation's file is written. The header is the conversation's
    model, strategy and settings; each line holds what the turns since the last line added to the messages, turns
    and steps, and the system prompt, template, capacity and prefix as they stand (a line ``{"from": counts}``
    says where its lists' items begin). Should a list have lost items (an edit), the journal starts again, whole."""

    def __init__(self, path: str | os.PathLike, trace: ConversationTrace):
        self.path = Path(path)
        self.trace = trace
        self.journal = Journal(journal_path(self.path), FORMAT)
        self._written = dict.fromkeys(_GROWING, 0)

    def update(self) -> None:
        data = self.trace.to_dict()
        if any(len(data[name]) < count for name, count in self._written.items()):
            self._written = dict.fromkeys(_GROWING, 0)
            self.journal.close()
            self.journal.started = False
        line = {"from": dict(self._written), **{name: data[name][self._written[name]:] for name in _GROWING},
                **{name: data[name] for name in _STATE}}
        self._written = {name: len(data[name]) for name in _GROWING}
        if not self.journal.started:
            self.journal.start({"format": FORMAT, "version": VERSION, "model": data["model"],
                                "strategy": data["strategy"], "settings": data["settings"]}, [line])
        else:
            self.journal.extend([line])
        self.journal.sync()

    def remove(self) -> None:
        """The conversation's file is written: the journal goes."""
        self.journal.remove()


def _from_journal(header: dict, lines: list, source: str) -> ConversationTrace:
    """The conversation a killed process's journal holds (`ConversationJournal`): its finished turns, said cancelled
    and why in its error."""
    data: dict[str, Any] = {key: header.get(key) for key in ("format", "version", "model", "strategy", "settings")}
    data.update({name: [] for name in _GROWING})
    states = []  # each line's, all checked (the last one stands)
    for number, line in enumerate(lines, start=2):
        starts = line.get("from") if isinstance(line, dict) else None
        if not isinstance(starts, dict) or not all(isinstance(line.get(name), list) for name in _GROWING) \
                or any(starts.get(name) != len(data[name]) for name in _GROWING):
            raise ConversationFileError(f"{source}: line {number:,} of the journal is not the turns that follow line "
                                        f"{number - 1:,} (an object with {', '.join(_GROWING)} and where they begin)")
        for name in _GROWING:
            data[name] += line[name]
        states.append({name: line.get(name) for name in _STATE})
        data.update(states[-1])
    data.update(cancelled=True, error=ended_without_saving(len(data["turns"]), None, "turn"),
                journal={"states": states})
    return FILE_FORMAT.parse(data, source)


class ConversationFileError(KeptFileError):
    """A file is not a readable kvviz conversation; the message says what is wrong and where."""


def load(path: str | os.PathLike) -> ConversationTrace:
    return FILE_FORMAT.read(path)


def from_dict(data: Any, source: str = "conversation") -> ConversationTrace:
    return FILE_FORMAT.parse(data, source)


_BYTES_OR_UNKNOWN = Int(0, MAX_BYTES, null=True, what="a byte count")
_POSITIONS = Int(0, MAX_POSITIONS, what="a number of tokens")
_MS_OR_UNKNOWN = Number(0, MAX_MS, null=True, what="a time in ms")


def _ranges_in_order(record: dict, where) -> None:
    if record["start"] > record["end"]:
        raise Refusal(at(where, "end"), f"at least start ({record['start']:,})", record["end"])


def _turn_adds_up(turn: dict, where) -> None:
    if not turn["start"] <= turn["prompt_end"] <= turn["end"]:
        raise Refusal(at(where, "prompt_end"), f"from start ({turn['start']:,}) to end ({turn['end']:,})",
                      turn["prompt_end"])
    if turn["kept"] + turn["recomputed"] != turn["prompt_end"]:
        raise Refusal(at(where, "recomputed"), f"prompt_end - kept ({turn['prompt_end'] - turn['kept']:,})",
                      turn["recomputed"])
    if turn["end"] - turn["prompt_end"] != turn["new_tokens"]:
        raise Refusal(at(where, "new_tokens"), f"end - prompt_end ({turn['end'] - turn['prompt_end']:,})",
                      turn["new_tokens"])


_MESSAGE = Record(
    {"role": Text(ROLES), "content": Text(), "turn": Int(0, null=True), "start": _POSITIONS, "end": _POSITIONS},
    rules=(_ranges_in_order,),
    what="a message (an object with role, content, turn, start, end)",
)

_TURN = Record(
    {
        "index": Int(0),
        "chat": Int(0),
        "kind": Text(TURN_KINDS),
        "strategy": STRATEGY,
        "start": _POSITIONS,
        "prompt_end": _POSITIONS,
        "end": _POSITIONS,
        "kept": _POSITIONS,
        "recomputed": _POSITIONS,
        "new_tokens": _POSITIONS,
        "ttft_ms": _MS_OR_UNKNOWN,
        "decode_tokens_per_s": Number(0, null=True, what="tokens per second"),
        "cache_bytes": _BYTES_OR_UNKNOWN,
        "policy_bytes": _BYTES_OR_UNKNOWN,
        "tokens_held": Int(0, MAX_POSITIONS, null=True, what="a number of tokens"),
        "evicted": _POSITIONS,
        "reprefill_ms": optional(_MS_OR_UNKNOWN),
        "reprefill_logit_diff": optional(Number(0, null=True, what="a logit difference")),
        "prefix_copy_bytes": optional(_BYTES_OR_UNKNOWN),
        "note": optional(Text(null=True)),
        "cancelled": optional(Flag(), False),
    },
    rules=(_turn_adds_up,),
    what="a turn record (an object)",
)

_STEP = Record(
    {
        "turn": Int(0),
        "phase": Text(("prefill", "decode")),
        "position": _POSITIONS,
        "token": Text(),
        "wall_ms": Number(0, MAX_MS, what="a time in ms"),
        "cache_bytes": _BYTES_OR_UNKNOWN,
        "predicted_cache_bytes": _BYTES_OR_UNKNOWN,
        "policy_bytes": _BYTES_OR_UNKNOWN,
        "tokens_held": Int(0, MAX_POSITIONS, null=True, what="a number of tokens"),
        "strategy": Text(nonempty=True),
    },
    what="a step record (an object)",
)


def _turns_and_steps_agree(data: dict, where) -> None:
    """Turns numbered 0, 1, ... in order; every step and message names a turn there is."""
    for i, turn in enumerate(data["turns"]):
        if turn["index"] != i:
            raise Refusal(at(where, "turns", i, "index"), f"{i} (turns are numbered 0, 1, 2, ... in order)",
                          turn["index"])
    count = len(data["turns"])
    for name in ("steps", "messages"):
        for i, item in enumerate(data[name]):
            if item["turn"] is not None and item["turn"] >= count:
                raise Refusal(at(where, name, i, "turn"), f"a turn of the file (0 to {count - 1})", item["turn"])


_STATE_FIELDS = {
    "system": optional(Text(), ""),
    "template": optional(Text(), ""),
    "capacity": optional(_POSITIONS, 0),
    "prefix": optional(Record({"tokens": _POSITIONS, "cache_bytes": Int(0, MAX_BYTES),
                               "prefill_ms": Number(0, MAX_MS)}, null=True, what="the cached prefix")),
}
_STATE = tuple(_STATE_FIELDS)  # what a turn (or a new chat) may set again: each journal line holds it
_CONVERSATION = Record(
    {
        "model": MODEL_CARD,
        "strategy": STRATEGY,
        "settings": optional(SETTINGS, {}),
        **_STATE_FIELDS,
        # a journal's (`ConversationJournal`): what each of its lines set, as it did; absent from a conversation file
        "journal": optional(Record({"states": ListOf(Record(_STATE_FIELDS, what="a journal line's state"))},
                                   null=True, what="the journal's lines (an object)")),
        "messages": ListOf(_MESSAGE),
        "turns": ListOf(_TURN),
        "steps": ListOf(_STEP),
        "cancelled": optional(Flag(), False),
        "error": optional(Text(null=True)),
        "summary": optional(Json(depth=2)),  # what the turns give: checked against them (`FileFormat.summary`)
    },
    rules=(_turns_and_steps_agree,),
)


def _build(data: dict) -> ConversationTrace:
    return ConversationTrace(
        model=data["model"],
        strategy=data["strategy"],
        system=data["system"],
        template=data["template"],
        settings=data["settings"],
        capacity=data["capacity"],
        prefix=PrefixRecord(**data["prefix"]) if data["prefix"] else None,
        messages=[MessageRecord(**m) for m in data["messages"]],
        turns=[TurnRecord(**t) for t in data["turns"]],
        steps=[ConversationStep(**s) for s in data["steps"]],
        cancelled=data["cancelled"],
        error=data["error"],
    )


FILE_FORMAT = FileFormat(name=FORMAT, version=VERSION, kind="kvviz conversation", schema=_CONVERSATION,
                         build=_build, error=ConversationFileError, summary=ConversationTrace.summary,
                         from_journal=_from_journal)
