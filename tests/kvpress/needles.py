"""Needle prompts as RULER's `niah_single_1` writes them (Hsieh et al., 2024, "RULER: What's the Real Context Size of
Your Long-Context Language Models?", Apache-2.0): the noise haystack repeated, one needle ("One of the special magic
numbers for {key} is: {value}.", an adjective-noun key, a 7-digit value) at a depth, RULER's question and answer prefix
at the end, read as raw text. Written from the recipe for the kvpress comparison; fixed (a seed, five depths), so that
kvviz and kvpress always read the same tokens. Scored as RULER's `string_match_all` scores one needle: the value
appears in the answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

HAYSTACK = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic numbers for {key} is: {value}."
TEMPLATE = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz "
            "you about the numbers afterwards.\n{context}\nWhat are all the special magic numbers for {key} mentioned "
            "in the provided text?")
ANSWER_PREFIX = " The special magic numbers for {key} mentioned in the provided text are"
KEYS = ("sore-dew", "plain-cloud", "ripe-lantern", "fuzzy-harbor", "quiet-parcel")  # adjective-noun, as RULER's
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
REPEATS = 40  # haystack sentences: about 1,080 tokens with the question on the default model's tokenizer
SEED = 34


@dataclass(frozen=True)
class Needle:
    name: str
    text: str
    value: str

    def answered(self, answer: str) -> bool:
        return self.value in answer


def needles() -> list[Needle]:
    rng = random.Random(SEED)
    items = []
    for key, depth in zip(KEYS, DEPTHS, strict=True):
        value = str(rng.randint(1_000_000, 9_999_999))
        sentences = [HAYSTACK] * REPEATS
        sentences.insert(round(depth * REPEATS), NEEDLE.format(key=key, value=value))
        text = TEMPLATE.format(context="\n".join(sentences), key=key) + ANSWER_PREFIX.format(key=key)
        items.append(Needle(f"needle-{round(depth * 100)}", text, value))
    return items
