"""SCBench's key-value retrieval (`scbench_kv`), written by kvviz from its recipe.

The recipe is SCBench's (Li et al., 2024, "SCBench: A KV Cache-Centric Analysis of Long-Context Methods";
github.com/microsoft/MInference, `scbench/`, MIT licence), itself InfiniteBench's `kv_retrieval`: a JSON object of
random UUID keys and UUID values, the instruction "Extract the value corresponding to the specified key in the JSON
object below.", and per turn one key asked ('Key: "..."' and "The value associated with the specified key is:"),
scored by whether the value occurs in the answer. SCBench draws its data from a dataset on the Hugging Face hub;
kvviz writes the object itself from the seed, as many pairs as fit the length asked. Its turns ask different keys
of the same object, as SCBench's multi-turn mode does.
"""

from __future__ import annotations

import random
import uuid

from kvviz.engine.tasks.ruler import joined
from kvviz.files.qa import QAItem, QATurn

INSTRUCTION = "Extract the value corresponding to the specified key in the JSON object below."
QUESTION = 'Key: "{key}"\nThe value associated with the specified key is:'


def random_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def key_value_item(rng: random.Random, size: int, turns: int) -> QAItem:
    """`size` key-value pairs (at least one per turn) written as JSON; turn i asks the value of its own key."""
    pairs = [(random_uuid(rng), random_uuid(rng)) for _ in range(max(size, turns))]
    asked = rng.sample(range(len(pairs)), turns)
    turn_of = {index: t for t, index in enumerate(asked)}
    head = f"{INSTRUCTION}\n\n{{"
    parts = [(f'"{key}": "{value}"', ("answer", turn_of[i]) if i in turn_of else None)
             for i, (key, value) in enumerate(pairs)]
    body, marks = joined(parts, ", ", len(head))  # what json.dumps writes for these plain strings
    questions = [QATurn(QUESTION.format(key=pairs[i][0]), [pairs[i][1]]) for i in asked]
    return QAItem("", "", head + body + "}", questions, marks)
