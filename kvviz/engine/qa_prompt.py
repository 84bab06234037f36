"""How a question item becomes the tokens the model reads: raw text or the chat template, the context apart from each
question, and where the item's needles fall among the context's tokens.

With `raw`, the model reads ``context + "\\n" + question + answer_prefix`` as plain text (the tokenizer's own
special tokens, a BOS, where it adds them). Otherwise the context and the question form the user turn of the
model's chat template and the answer prefix starts the assistant turn. A later question of a conversation
(the multi-turn regime) follows the answer before it: raw, on a new line; with the template, after the
assistant turn is closed and a new user turn opened.

The pieces are tokenized apart, as kvpress does (its pipeline tokenizes the context and each question apart), so
that the context's tokens are the same whichever question follows them: the cache reads the context once, before
any question.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvviz.errors import OptionError
from kvviz.files.qa import QAItem
from kvviz.files.sweep import Asked
from kvviz.files.trace import Pin

_SENTINELS = ("kvvizfirstuserturn", "kvvizassistantturn", "kvvizseconduserturn")


@dataclass(frozen=True)
class ChatGlue:
    """The chat template's text around the turns: before the first user message (`head`, a default system prompt
    included), from the end of a user message to the start of the assistant's (`to_answer`), and from the end of the
    assistant's to the start of the next user message (`to_question`)."""

    head: str
    to_answer: str
    to_question: str


def chat_glue(tokenizer) -> ChatGlue:
    """The template's glue, read from renderings of sentinel messages. Raises OptionError when the template does not
    write a conversation as its turns one after another (then --raw is the way)."""
    first, answer, second = _SENTINELS
    one = tokenizer.apply_chat_template([{"role": "user", "content": first}], add_generation_prompt=True,
                                        tokenize=False)
    three = tokenizer.apply_chat_template(
        [{"role": "user", "content": first}, {"role": "assistant", "content": answer},
         {"role": "user", "content": second}], add_generation_prompt=True, tokenize=False)
    if one.count(first) != 1 or three.count(second) != 1 or not three.endswith(second + one.split(first)[1]):
        raise OptionError("this model's chat template does not write a user turn and the assistant's in a form kvviz "
                          "can split into context, question and answer; use --raw")
    head, to_answer = one.split(first)
    lead = head + first + to_answer + answer
    if not three.startswith(lead):
        raise OptionError("this model's chat template writes earlier turns differently once a conversation goes on; "
                          "use --raw")
    return ChatGlue(head, to_answer, three[len(lead) : three.index(second)])


class Rendering:
    """How items are written for one tokenizer: raw text, or its chat template."""

    def __init__(self, tokenizer, raw: bool):
        self.tokenizer = tokenizer
        self.chat = chat_glue(tokenizer) if not raw and getattr(tokenizer, "chat_template", None) else None

    @property
    def raw(self) -> bool:
        return self.chat is None

    def encode(self, text: str, special: bool = False) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special, verbose=False)["input_ids"])

    def context(self, item: QAItem) -> list[int]:
        """The context's tokens, the template's opening first."""
        return self._context(item)[0]

    def placed(self, item: QAItem) -> QAItem:
        """The item with each needle's token positions as the model reads the context: the tokens whose characters
        overlap the needle's."""
        lead = "" if self.raw else self.chat.head
        _, offsets = self._context(item)
        needles = []
        for needle in item.needles:
            start, end = needle.start + len(lead), needle.end + len(lead)
            tokens = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
            needles.append(replace(needle, tokens=(tokens[0], tokens[-1] + 1) if tokens else None))
        return replace(item, needles=needles)

    def _context(self, item: QAItem) -> tuple[list[int], list[tuple[int, int]]]:
        """The context's tokens and each token's characters [start, end) in the template's opening + the context."""
        text = ("" if self.raw else self.chat.head) + item.context
        encoded = self.tokenizer(text, add_special_tokens=self.raw, return_offsets_mapping=True, verbose=False)
        return list(encoded["input_ids"]), [tuple(span) for span in encoded["offset_mapping"]]

    def question(self, item: QAItem, turn: int, follows_answer: bool = False) -> list[int]:
        """Question `turn` as read right after the context, or (`follows_answer`) after the previous answer, up to
        the end of its answer prefix."""
        asked = item.turns[turn]
        if self.raw:
            before = "\n" if item.context or follows_answer else ""
            return self.encode(before + asked.question + asked.answer_prefix)
        before = self.chat.to_question if follows_answer else ("\n" if item.context else "")
        return self.encode(before + asked.question + self.chat.to_answer + asked.answer_prefix)

    def prompt(self, item: QAItem, turn: int = 0) -> tuple[list[int], list[Pin]]:
        """Question `turn` as one prompt (the context, then the question to the end of its answer prefix) and the
        needles it asks for as pinned spans of it: what a run of the item shows (`Decoder`'s `prompt_ids`, `pins`)."""
        placed = self.placed(item)
        pins = [Pin(*needle.tokens, item.context[needle.start : needle.end]) for needle in placed.needles
                if needle.role == "answer" and needle.turn in (turn, None) and needle.tokens]
        return self.context(item) + self.question(item, turn), pins

    def tokens(self, item: QAItem) -> int:
        """The tokens a multi-turn reading of the whole item takes at most: the context, every question after the
        answer before it, and every answer's tokens."""
        total = len(self.context(item))
        for turn, asked in enumerate(item.turns):
            total += len(self.question(item, turn, follows_answer=turn > 0)) + asked.max_new_tokens
        return total


def plain_prompt(item: QAItem, turn: int = 0) -> tuple[str, list[str]]:
    """Question `turn` of an item as one plain prompt (``context + "\\n" + question + answer_prefix``, the raw
    reading) and the text of each needle it asks for: what a user runs and pins by hand (the window's task item,
    `kvviz run --pin`)."""
    asked = item.turns[turn]
    needles = [item.context[n.start : n.end] for n in item.needles if n.role == "answer" and n.turn in (turn, None)]
    return item.context + "\n" + asked.question + asked.answer_prefix, needles


def asked(tokenizer, regimes: list[str], raw: bool, questions: list[QAItem] | None = None, source: str | None = None,
          task: str | None = None, items: int = 5, length: int = 1000, seed: int = 0, turns: int = 1) -> Asked:
    """The questions a sweep asks (`kvviz choose --qa/--task`, the window's Choose), written for this tokenizer: the
    user's `questions` (from the file named `source`), or `items` items of each task of `task` ("NAME[,NAME]") at
    `length` tokens. Raises OptionError for an unknown task or a length too short."""
    from kvviz.engine import tasks

    rendering = Rendering(tokenizer, raw)
    if questions is not None:
        return Asked(source or "questions", regimes, rendering.raw, questions)
    names = tasks.task_names(task or "")
    written = tasks.generate(names, items, length, seed, turns, rendering.tokens)
    return Asked(f"tasks {', '.join(names)}", regimes, rendering.raw, written, seed, length)


def longest_reading(asked: Asked, tokenizer) -> int:
    """The most tokens an item's reading takes: what the default grid's budgets are fractions of."""
    rendering = Rendering(tokenizer, asked.raw)
    return max(rendering.tokens(item) for item in asked.items)
