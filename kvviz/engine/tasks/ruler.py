"""RULER's synthetic retrieval tasks, written by kvviz from their recipes.

The recipes are RULER's (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?"; github.com/NVIDIA/RULER, Apache License 2.0): the task settings of `scripts/synthetic.yaml`, the
haystacks and needles of `scripts/data/synthetic/niah.py` and `variable_tracking.py`, and the templates and answer
prefixes of `scripts/data/synthetic/constants.py`. The code is kvviz's own. Where kvviz departs from RULER:

- keys are drawn from kvviz's own short word lists (`words.py`), not the wonderwords package's;
- the "essay" haystack is the Alice text kvviz ships (public domain), not Paul Graham's essays, cut into sentences
  at . ! and ? (RULER uses nltk's sentence tokenizer);
- variable tracking's one-shot example holds its chain among `EXAMPLE_NOISE` noise lines (RULER fills about 500
  tokens), so that the item's own haystack keeps most of the length asked for;
- an item may ask several questions of one context, one per turn (`turns`): each turn gets needles of its own
  (a key, or a chain), as SCBench asks several keys of one JSON object;
- an answer may take fewer tokens than RULER's 128 (the numbers follow the answer prefix at once).

Each writer takes a random generator, the haystack's size (noise lines, words of the essay, as RULER sizes it) and
the number of turns, and returns the item with its needles' character spans.
"""

from __future__ import annotations

import random
import re
import string

from kvviz.engine.tasks.words import ADJECTIVES, NOUNS
from kvviz.files import documents
from kvviz.files.qa import Needle, QAItem, QATurn

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
DEPTHS = tuple(round(100 * i / 39) for i in range(40))  # RULER's 40 depths, 0 to 100 % of the haystack's sentences
EXAMPLE_NOISE = 5  # noise lines around variable tracking's one-shot example

NEEDLE = "One of the special magic numbers for {key} is: {value}."
INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you "
         "about the numbers afterwards.")
QUESTION = "What are all the special magic numbers for {key} mentioned in the provided text?"
ANSWER_PREFIX = " The special magic numbers for {key} mentioned in the provided text are"

VT_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text."
VT_QUESTION = "Question: Find all variables that are assigned the value {value} in the text above."
VT_ANSWER_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {count} variables "
                    "are assigned the value {value}, they are: ")

Mark = tuple[str, int | None]  # a piece of text that is a needle: (role, turn)


def singular(text: str) -> str:
    """RULER's template for one value asked: "Some ... numbers are" becomes "A ... number is"."""
    for plural, one in (("Some", "A"), ("are all", "is"), ("are", "is"), ("numbers", "number")):
        text = text.replace(plural, one)
    return text


def joined(parts: list[tuple[str, Mark | None]], separator: str, offset: int) -> tuple[str, list[Needle]]:
    """The pieces joined by `separator`, and the needles among them as character spans counted from `offset`."""
    needles, at = [], offset
    for i, (piece, mark) in enumerate(parts):
        at += len(separator) if i else 0
        if mark is not None:
            needles.append(Needle(at, at + len(piece), *mark))
        at += len(piece)
    return separator.join(piece for piece, _ in parts), needles


def word_keys(rng: random.Random, count: int) -> list[str]:
    """`count` different adjective-noun keys."""
    keys: list[str] = []
    while len(keys) < count:
        key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
        if key not in keys:
            keys.append(key)
    return keys


def seven_digits(rng: random.Random) -> str:
    return str(rng.randint(10**6, 10**7 - 1))


def noise_haystack(rng: random.Random, lines: int, needles: list[tuple[str, Mark]]) -> list[tuple[str, Mark | None]]:
    """RULER's noise haystack: `lines` copies of the noise sentences, one per line, the needles put in at random
    lines (each at its own index, from the last); at least a line per needle."""
    lines = max(lines, len(needles))
    parts: list[tuple[str, Mark | None]] = [(NOISE, None)] * lines
    for index, needle in zip(sorted(rng.sample(range(lines), len(needles)), reverse=True), needles, strict=True):
        parts.insert(index, needle)
    return parts


def essay_words() -> list[str]:
    return re.sub(r"\s+", " ", documents.builtin("alice").text).strip().split(" ")


def essay_haystack(rng: random.Random, words: int, needles: list[tuple[str, Mark]]) -> list[tuple[str, Mark | None]]:
    """RULER's essay haystack: the essay's first `words` words (again from its start where it is shorter), cut into
    sentences, the needles put in at depths drawn from RULER's 40."""
    essay = essay_words()
    text = " ".join((essay * (words // len(essay) + 1))[:words])
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if s]
    cuts = [0, *sorted(int(len(sentences) * depth / 100) for depth in rng.sample(DEPTHS, len(needles))),
            len(sentences)]
    parts: list[tuple[str, Mark | None]] = []
    for i in range(1, len(cuts)):
        chunk = " ".join(sentences[cuts[i - 1] : cuts[i]])
        if chunk:
            parts.append((chunk, None))
        if i - 1 < len(needles):
            parts.append(needles[i - 1])
    return parts


def needle_item(rng: random.Random, size: int, turns: int, haystack: str, keys: int, values: int) -> QAItem:
    """RULER's needle in a haystack (`niah.py`): `keys` adjective-noun keys, each with `values` seven-digit values,
    among the haystack; one key asked per turn, the other keys distractors."""
    names = word_keys(rng, max(keys, turns))
    needles: list[tuple[str, Mark]] = []
    answers = []
    for k, key in enumerate(names):
        mark = ("answer", k) if k < turns else ("distractor", None)
        numbers = [seven_digits(rng) for _ in range(values)]
        answers.append(numbers)
        needles += [(NEEDLE.format(key=key, value=v), mark) for v in numbers]
    rng.shuffle(needles)
    fill = noise_haystack if haystack == "noise" else essay_haystack
    form = (lambda text: text) if values > 1 else singular  # RULER's wording for one value asked, or several
    intro = form(INTRO) + "\n"
    body, marks = joined(fill(rng, size, needles), "\n" if haystack == "noise" else " ", len(intro))
    asked = [QATurn(form(QUESTION).format(key=key), answers[k], form(ANSWER_PREFIX).format(key=key))
             for k, key in enumerate(names[:turns])]
    return QAItem("", "", intro + body, asked, marks)


def variable_names(rng: random.Random, count: int, letters: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in names:
            names.append(name)
    return names


def chains(rng: random.Random, count: int, hops: int, letters: int) -> list[tuple[str, list[str], list[str]]]:
    """`count` chains of variable assignment (`variable_tracking.py`): (value, its variables, the statements)."""
    names = variable_names(rng, count * (hops + 1), letters)
    values: list[str] = []
    while len(values) < count:
        value = str(rng.randint(10000, 99999))
        if value not in values:
            values.append(value)
    made = []
    for c, value in enumerate(values):
        chain = names[c * (hops + 1) : (c + 1) * (hops + 1)]
        statements = [f"VAR {chain[0]} = {value}"] + [f"VAR {chain[j + 1]} = VAR {chain[j]} " for j in range(hops)]
        made.append((value, chain, statements))
    return made


def noise_with_chains(rng: random.Random, lines: int, made, asked: bool) -> list[tuple[str, Mark | None]]:
    """Noise lines with each chain's statements put in, in order, at random lines (`variable_tracking.py`); at
    least a line per statement."""
    parts: list[tuple[str, Mark | None]] = [(NOISE, None)] * max(lines, *(len(s) for _, _, s in made))
    for c, (_, _, statements) in enumerate(made):
        for j, index in enumerate(sorted(rng.sample(range(len(parts)), len(statements)))):
            parts.insert(index + j, (statements[j], ("answer", c) if asked else None))
    return parts


def variable_tracking_item(rng: random.Random, size: int, turns: int, hops: int = 4) -> QAItem:
    """RULER's variable tracking (`vt`): chains of `hops` assignments among noise lines, one chain asked per turn;
    after a one-shot example with its answer, as RULER gives it."""
    (value, chain, _), *_ = example = chains(rng, 1, hops, 3)
    example_text, _ = joined(noise_with_chains(rng, EXAMPLE_NOISE, example, asked=False), "\n", 0)
    shown = (f"{VT_INTRO}\n\n{example_text}\n{VT_QUESTION.format(value=value)}"
             f"{VT_ANSWER_PREFIX.format(count=hops + 1, value=value)} {' '.join(chain)}\n")
    head = f"{shown}\n{VT_INTRO}\n\n"
    made = chains(rng, turns, hops, 5)
    body, marks = joined(noise_with_chains(rng, size, made, asked=True), "\n", len(head))
    asked = [QATurn(VT_QUESTION.format(value=v), names, VT_ANSWER_PREFIX.format(count=hops + 1, value=v))
             for v, names, _ in made]
    return QAItem("", "", head + body, asked, marks)
