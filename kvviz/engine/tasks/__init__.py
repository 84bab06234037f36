"""The tasks kvviz writes itself: retrieval items a cache is scored on, reproducible from a seed, at the token
length asked, on the model's own tokenizer.

A task is a recipe (`Recipe`): a writer that makes an item from a random generator, a haystack size and a number
of turns. `generate` writes item i of a task from its own generator, seeded by the task's name, the seed and i (so
item 3 is the same whether 5 or 10 are asked), with the largest haystack whose whole reading fits the length: the
context, every question with its answer prefix, and every answer's tokens at most, as the model will read them
(counted by the caller, who knows the rendering: chat template or raw text). The recipes and where they come from
are in `ruler` and `scbench`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvviz.engine.tasks import ruler, scbench
from kvviz.errors import OptionError
from kvviz.files.qa import QAItem, chosen

MAX_SIZE = 10**6  # haystack units no item needs (a million noise lines is far past any model's context)


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str  # what it asks, in one line
    source: str  # where the recipe comes from
    write: Callable[[random.Random, int, int], QAItem]  # (generator, haystack size, turns) -> item
    max_new_tokens: int  # the answer's tokens at most
    smallest: int = 1  # the smallest haystack size


TASKS: dict[str, Recipe] = {r.name: r for r in (
    Recipe("niah_single_1", "one 7-digit magic number for an adjective-noun key among noise lines",
           "RULER niah_single_1 (NVIDIA, Apache-2.0)",
           lambda rng, size, turns: ruler.needle_item(rng, size, turns, "noise", keys=1, values=1), 24),
    Recipe("niah_multikey_1", "one key's number asked among three other keys' numbers (distractors) in an essay",
           "RULER niah_multikey_1 (NVIDIA, Apache-2.0); the essay is kvviz's Alice text",
           lambda rng, size, turns: ruler.needle_item(rng, size, turns, "essay", keys=4, values=1), 24, smallest=10),
    Recipe("niah_multivalue", "all four numbers of one key, in an essay",
           "RULER niah_multivalue (NVIDIA, Apache-2.0); the essay is kvviz's Alice text",
           lambda rng, size, turns: ruler.needle_item(rng, size, turns, "essay", keys=1, values=4), 64, smallest=10),
    Recipe("vt", "every variable of a chain of four assignments among noise lines, after a one-shot example",
           "RULER vt, variable tracking (NVIDIA, Apache-2.0)", ruler.variable_tracking_item, 30),
    Recipe("scbench_kv", "the UUID value of a UUID key in a JSON object of random pairs",
           "SCBench scbench_kv (Microsoft, MIT), after InfiniteBench kv_retrieval", scbench.key_value_item, 64),
)}


def task_names(text: str) -> list[str]:
    """`--task NAME[,NAME]`, checked; raises OptionError naming the tasks there are."""
    return chosen(text, TASKS, "task")


def write(recipe: Recipe, seed: int, index: int, size: int, turns: int) -> QAItem:
    """Item `index` of the recipe at this haystack size: the same for the same seed, index, size and turns."""
    item = recipe.write(random.Random(f"kvviz:{recipe.name}:{seed}:{index}"), size, turns)
    turns_given = [replace(turn, max_new_tokens=recipe.max_new_tokens) for turn in item.turns]
    return replace(item, name=f"{recipe.name} #{index + 1}", task=recipe.name, turns=turns_given, seed=seed)


def generate(names: list[str], count: int, length: int, seed: int, turns: int,
             tokens: Callable[[QAItem], int]) -> list[QAItem]:
    """`count` items of each task named, each as long as fits `length` tokens by `tokens(item)` (the tokens the
    model reads and writes for the whole item). Raises OptionError when even the smallest item is longer."""
    if count < 1:
        raise OptionError(f"the number of items must be at least 1, not {count}")
    if turns < 1:
        raise OptionError(f"the number of turns must be at least 1, not {turns}")
    return [fit(TASKS[name], seed, i, length, turns, tokens) for name in names for i in range(count)]


def fit(recipe: Recipe, seed: int, index: int, length: int, turns: int, tokens: Callable[[QAItem], int]) -> QAItem:
    """The item with the largest haystack that fits `length` tokens (found by doubling, then halving the gap)."""
    low = recipe.smallest
    item = write(recipe, seed, index, low, turns)
    need = tokens(item)
    if need > length:
        raise OptionError(f"{recipe.name} needs at least {need:,} tokens with {turns} question(s) on this model "
                          f"(its smallest haystack, questions and answers); ask for a length of at least {need:,}")
    high = low * 2
    while tokens(write(recipe, seed, index, high, turns)) <= length:  # low fits, high does not
        low, high = high, high * 2
        if high > MAX_SIZE:
            raise OptionError(f"a length of {length:,} tokens is more than a {recipe.name} item is written for")
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if tokens(write(recipe, seed, index, middle, turns)) <= length else (low, middle)
    return write(recipe, seed, index, low, turns)
