"""Questions asked of a text: the items a cache is scored on by whether the model still answers, and the answers.

An item is one context (the text the cache reads) and the questions asked of it, in order (`QATurn`: the
question, its reference answers, the answer prefix that starts the answer, the tokens the answer may take). Where
the answer lies in the context, the item says so (`Needle`: a span of the context's characters), so that kvviz can
say whether a cache still held it when the question came.

Items come from three places: the tasks kvviz writes itself (`kvviz.engine.tasks`), the user's own questions in a
JSONL file with kvpress's columns (`read_questions`), and a kept conversation, its messages asked again turn after
turn (`from_conversation`). An `AnswerRecord` is what one configuration answered to one question in one regime.

Plain data (stdlib only): the engine renders, feeds and answers; the sweep file keeps the records.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvviz.errors import OptionError
from kvviz.files.schema import Int, ListOf, Number, Record, Refusal, Text, describe, optional, path_text
from kvviz.files.scoring import METRICS

NEEDLE_ROLES = ("answer", "distractor")  # the text a question asks for, or text that looks like it and is not
REGIMES = ("query-agnostic", "query-aware", "decode-time", "multi-turn")
MAX_NEW_TOKENS = 4096  # the most tokens an answer may be given
MAX_FILE_BYTES = 256 * 2**20


def chosen(text: str, accepted, kind: str) -> list[str]:
    """Names from a comma-separated list (`--task a,b`, `--regime ...`), each among `accepted`, in order, once each.
    Raises OptionError naming the first unknown one and what is accepted."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in accepted]
    if unknown or not names:
        said = f"no {kind} named {unknown[0]!r}" if unknown else f"no {kind} named"
        raise OptionError(f"{said}; the {kind}s: {', '.join(accepted)}")
    return list(dict.fromkeys(names))


class QAFileError(ValueError):
    """A question file (or kept conversation) that cannot be used; the message names the file, the line and the
    field, and what would be accepted."""


@dataclass(frozen=True)
class Needle:
    """Where an answer (or a distractor) lies in an item's context: characters [start, end), and once the item is
    written for a model (`kvviz.engine.qa_prompt`), the tokens [start, end) the model reads them as."""

    start: int
    end: int
    role: str = "answer"  # one of NEEDLE_ROLES
    turn: int | None = None  # the question (by index) it answers; None: every question, or none (a distractor)
    tokens: tuple[int, int] | None = None  # token positions [start, end) in what the model reads; None: not written


@dataclass
class QATurn:
    """One question of an item, as kvpress's columns give it."""

    question: str
    answers: list[str]  # the reference answers, scored by `metric`
    answer_prefix: str = ""  # what the answer starts with, fed before the model answers
    max_new_tokens: int = 32  # the answer's tokens at most


@dataclass
class QAItem:
    name: str  # for people: "niah_single_1 #3", "questions.jsonl line 4"
    task: str  # the task it was written for, or "file" / "conversation"
    context: str
    turns: list[QATurn]
    needles: list[Needle] = field(default_factory=list)
    metric: str = "string_match_all"  # one of scoring.METRICS
    seed: int | None = None  # what a generated item was written from

    def needle_positions(self, turn: int) -> list[int]:
        """The token positions of the needles question `turn` asks for (its own, and those every question asks for),
        as placed by the rendering; empty where the item has none."""
        wanted = [n.tokens for n in self.needles if n.role == "answer" and n.turn in (turn, None) and n.tokens]
        return sorted({p for start, end in wanted for p in range(start, end)})

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for needle in data["needles"]:
            needle["tokens"] = list(needle["tokens"]) if needle["tokens"] else None
        return data


@dataclass
class AnswerRecord:
    """What one configuration answered to one question of one item, in one regime, and how it scored."""

    item: int  # the item's index in the sweep's items
    turn: int  # the question's index in the item
    regime: str  # one of REGIMES
    answer: str  # the generated text (the answer prefix not included)
    score: float | None  # 0 to 1, by the item's metric; None: not answered (see `error`)
    answer_tokens: int  # tokens generated
    prompt_tokens: int  # tokens the model had read when it began to answer (the positions numbered)
    tokens_held: int | None  # by the cache's first layer when the question came
    needle_held: int | None  # layer-heads holding every answer-needle token when the question came (None: no needle)
    layer_heads: int | None  # layer-heads that hold tokens at all (attention layers x KV heads)
    error: str | None = None  # why this configuration could not answer (its other answers stand)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_POSITIVE = Int(1, MAX_NEW_TOKENS, what="a number of new tokens")
ANSWER_RECORD = Record(
    {
        "item": Int(0, what="an item index"),
        "turn": Int(0, what="a question index"),
        "regime": Text(REGIMES),
        "answer": Text(),
        "score": Number(0, 1, null=True, what="a score"),
        "answer_tokens": Int(0, MAX_NEW_TOKENS, what="a number of tokens"),
        "prompt_tokens": Int(0, what="a number of tokens"),
        "tokens_held": Int(0, null=True, what="a number of tokens"),
        "needle_held": Int(0, null=True, what="a number of layer-heads"),
        "layer_heads": Int(0, null=True, what="a number of layer-heads"),
        "error": optional(Text(null=True)),
    },
    what="an answer record (an object)",
)
def _span(record: dict, where) -> None:
    tokens = record["tokens"]
    if record["start"] > record["end"] or (tokens is not None and (len(tokens) != 2 or tokens[0] > tokens[1])):
        raise Refusal(where, "a needle whose start is not after its end, and its tokens a pair [start, end]",
                      show_found=False)


_NEEDLE = Record(
    {"start": Int(0, what="a character offset"), "end": Int(0, what="a character offset"),
     "role": optional(Text(NEEDLE_ROLES), "answer"), "turn": optional(Int(0, null=True)),
     "tokens": optional(ListOf(Int(0, what="a token position"), null=True))},
    rules=(_span,),
    what="a needle (an object with start and end)",
)
_TURN = Record(
    {"question": Text(nonempty=True), "answers": ListOf(Text(nonempty=True)), "answer_prefix": optional(Text(), ""),
     "max_new_tokens": _POSITIVE},
    what="a question (an object)",
)
ITEM_RECORD = Record(
    {"name": Text(), "task": Text(nonempty=True), "context": Text(), "turns": ListOf(_TURN),
     "needles": optional(ListOf(_NEEDLE), []), "metric": optional(Text(METRICS), "string_match_all"),
     "seed": optional(Int(0, null=True))},
    what="an item (an object with its context and questions)",
)


def build_item(data: dict) -> QAItem:
    """An item from its checked record (`ITEM_RECORD`)."""
    needles = [Needle(**dict(n, tokens=tuple(n["tokens"]) if n["tokens"] else None)) for n in data["needles"]]
    return QAItem(data["name"], data["task"], data["context"], [QATurn(**t) for t in data["turns"]], needles,
                  data["metric"], data["seed"])


# -- the user's own questions: kvpress's columns, one question per line -------------------------------------

_LINE = Record(
    {
        "context": Text(nonempty=True),
        "question": Text(nonempty=True),
        "answers": ListOf(Text(nonempty=True)),
        "answer_prefix": optional(Text(), ""),
        "max_new_tokens": optional(_POSITIVE),
    },
    what="an object with context, question and answers",
)
COLUMNS = ("context (text)", "question (text)", "answers (a list of texts)",
           "answer_prefix (text, optional)", f"max_new_tokens (1 to {MAX_NEW_TOKENS}, optional)")


def read_questions(path: str | os.PathLike, max_new_tokens: int = 32) -> list[QAItem]:
    """The items of a JSONL question file: one JSON object per line with kvpress's columns (`COLUMNS`); blank lines
    are skipped. Lines with the same context are one item, their questions asked in the file's order. A question
    without `max_new_tokens` gets `max_new_tokens`. Raises QAFileError naming the line and the field."""
    path = Path(path)
    text = _read_text(path)
    items: dict[str, QAItem] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise QAFileError(f"{path} line {number} is not JSON ({exc.msg} at character {exc.colno}); each line "
                              f"is one object with {', '.join(COLUMNS)}") from None
        try:
            row = _LINE.check(data, None)
            if not row["answers"]:
                raise Refusal((None, "answers"), "a list of at least one reference answer", data["answers"])
        except Refusal as refusal:
            field_name = path_text(refusal.where)
            found = f", found {describe(refusal.found)}" if refusal.show_found else ""
            where = "" if field_name == "the top level" else f" field {field_name}:"
            raise QAFileError(f"{path} line {number}:{where} expected {refusal.expected}{found}") from None
        turn = QATurn(row["question"], row["answers"], row["answer_prefix"], row["max_new_tokens"] or max_new_tokens)
        item = items.get(row["context"])
        if item is None:
            items[row["context"]] = QAItem(f"{path.name} line {number}", "file", row["context"], [turn])
        else:
            item.turns.append(turn)
    if not items:
        raise QAFileError(f"{path} holds no questions; give one JSON object per line with {', '.join(COLUMNS)}")
    return list(items.values())


def _read_text(path: Path) -> str:
    if path.is_dir():
        raise QAFileError(f"{path} is a folder; give a JSONL file of questions")
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise QAFileError(f"{path} is larger than {MAX_FILE_BYTES // 2**20} MiB; give a smaller question file")
        raw = path.read_bytes()
    except OSError as exc:
        raise QAFileError(f"cannot read the question file {path}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise QAFileError(f"{path} is not UTF-8 text (undecodable byte at offset {exc.start}); save it as UTF-8") \
            from None


# -- a kept conversation, asked again -----------------------------------------------------------------------


def is_conversation(path: str | os.PathLike) -> bool:
    """Whether the file is a kept conversation (one JSON object of the kvviz-conversation format), not a JSONL file."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b'"kvviz-conversation"' in head and head.lstrip().startswith(b"{") and not path.suffix == ".jsonl"


def read_asked(path: str | os.PathLike) -> list[QAItem]:
    """The user's questions from a file (`kvviz choose --qa`, the window's question file): a JSONL file with kvpress's
    columns, or a kept conversation, its messages asked again turn after turn. Raises QAFileError."""
    return [from_conversation(path)] if is_conversation(path) else read_questions(path)


def from_conversation(path: str | os.PathLike) -> QAItem:
    """A kept conversation (`kvviz chat --trace`, a kvviz-conversation file) as one item: its system prompt is the
    context, each user message a question, and the reply the conversation kept its reference answer (scored like
    any other: the kept reply must come again). Each answer may take as many tokens as the kept reply spanned in
    the conversation's history (its template's tokens included). Raises QAFileError."""
    from kvviz.files.conversation import FILE_FORMAT
    from kvviz.files.jsonfile import KeptFileError

    try:
        conversation = FILE_FORMAT.read(path)
    except KeptFileError as exc:
        raise QAFileError(str(exc)) from None
    turns = []
    messages = conversation.messages
    for message, reply in zip(messages, messages[1:], strict=False):
        if message.role == "user" and reply.role == "assistant" and reply.content.strip():
            tokens = max(1, min(MAX_NEW_TOKENS, reply.end - reply.start))
            turns.append(QATurn(message.content, [reply.content.strip()], "", tokens))
    if not turns:
        raise QAFileError(f"{path} is a conversation without a user message answered; give one with at least one "
                          "finished turn")
    return QAItem(Path(path).name, "conversation", conversation.system, turns)

