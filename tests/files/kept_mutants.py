"""Damaged copies of real kept files of every format, made in memory, deterministically.

`real_files(model)` makes one real file of each format kvviz keeps: a trace, an evaluation, a sweep and a
conversation on the tiny model, and a recorded server session. `mutants(data, rng)` makes at least `at_least`
damaged copies of one of them, as file contents:

- every field in turn given a value of the wrong kind: a number a text, a list, an object, NaN and 10^400; a text a
  number, a list and an object; true/false a number, a text and a list; a null a list and an object; an empty list
  or object a text and the other kind. Each field of the format (a path with its list indices left out, such as
  ``steps[].layers[].keys_bytes``) is damaged once at a random place, then again at other random places until
  there are enough;
- the text cut short at random offsets;
- junk at random offsets: a control character (refused inside a JSON string as outside), a byte that is not
  UTF-8, or text after the end of the JSON.

Every one of them is damage a reader must refuse. `Mutant.where` is the field path the refusal must name (None for
damage to the file as a whole, and to its "format" and "version", which are refused by name).
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from typing import Any

from kvviz.files.schema import path_text

HUGE = 10**400  # json writes its 401 digits; a float cannot hold it
WRONG = {
    "number": ["x", [1], {"a": 1}, float("nan"), HUGE],
    "text": [12345, ["x"], {"a": "x"}],
    "flag": [1, "true", [True]],
    "null": [[1], {"a": 1}],
    "empty list": ["x", {"a": 1}],
    "empty object": ["x", [1]],
}
JUNK = (b"\x01", b"\xff", b"\x00")


@dataclass
class Mutant:
    name: str  # what was done, e.g. 'steps[3].wall_ms as "x"'
    content: bytes  # the damaged file
    where: str | None  # the field path a refusal must name


def real_files(model) -> dict[str, dict]:
    """One real file of each format, as the JSON kvviz saves (format name -> parsed JSON)."""
    from kvviz.engine import evaluate, strategies, sweep
    from kvviz.engine.conversation import Conversation
    from kvviz.engine.decode import GenerationSettings
    from kvviz.files import documents
    from kvviz.files.jsonfile import encode_json
    from tests.attach.test_session_fuzz import full_session
    from tests.files.trace_mutants import base_traces

    choices = [strategies.choose("sink", {"sink_tokens": 2, "window": 8})]
    ids, record, _ = evaluate.prepare(model, documents.builtin("alice"), sweep.with_reference(choices), 16)
    evaluation = evaluate.Evaluation(model, strategies.choose("h2o", {"budget": 8}), ids, record)
    list(evaluation)
    question = sweep.ask(model.model, context=1024, sequences=2, budget="2MiB", tolerance="kl=0.01")
    swept = sweep.SweepRun(model, choices, ids, record, question, rows=2)
    list(swept)
    chat = Conversation(model, strategies.choose("sink", {"sink_tokens": 2, "window": 16}),
                        GenerationSettings(max_new_tokens=3))
    for text in ("Hello there", "Tell me more"):
        list(chat.send(text))
    kept = {"kvviz-trace": base_traces(model)[0], "kvviz-eval": evaluation.result.to_dict(),
            "kvviz-sweep": swept.sweep.to_dict(), "kvviz-conversation": chat.trace.to_dict(),
            "kvviz-attach": full_session()}
    return {name: json.loads(encode_json(data)) for name, data in kept.items()}


def leaves(value: Any, where=None):
    """(place, value) of every value that holds no other: numbers, texts, flags, nulls, empty lists and objects.
    A place is the schema's (`kvviz.files.schema.at`): None at the top, else (parent, key)."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, (where, key))
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            yield from leaves(item, (where, i))
    else:
        yield where, value


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "flag"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "text"
    return "empty list" if isinstance(value, list) else "empty object"


def field_of(where) -> tuple:
    """The field a place is of: its keys, with list indices left out."""
    keys = []
    while where is not None:
        where, key = where
        keys.append("[]" if isinstance(key, int) else key)
    return tuple(reversed(keys))


def keys_of(where) -> list:
    keys = []
    while where is not None:
        where, key = where
        keys.append(key)
    return keys[::-1]


def mutants(data: dict, rng: random.Random, at_least: int = 500, cuts: int = 30, junk: int = 30) -> list[Mutant]:
    by_field: dict[tuple, list] = {}
    for where, value in leaves(data):
        by_field.setdefault(field_of(where), []).append((where, value))
    made: list[Mutant] = []
    wanted = at_least - cuts - junk
    rounds = 0
    while len(made) < wanted and rounds < 50:
        for places in by_field.values():
            if rounds and len(made) >= wanted:
                break
            where, value = rng.choice(places)
            for wrong in WRONG[kind_of(value)]:
                made.append(_replaced(data, where, wrong))
        rounds += 1
    text = json.dumps(data).encode("utf-8")
    for offset in sorted(rng.sample(range(1, len(text)), cuts)):
        made.append(Mutant(f"cut at byte {offset:,}", text[:offset], None))
    for n in range(junk):
        offset = rng.randrange(len(text) + 1)
        piece = JUNK[n % len(JUNK)] if n % 4 else b' {"more": 1}'
        if not n % 4:
            offset = len(text)
        made.append(Mutant(f"junk {piece!r} at byte {offset:,}", text[:offset] + piece + text[offset:], None))
    return made


def _replaced(data: dict, where, wrong: Any) -> Mutant:
    damaged = copy.deepcopy(data)
    *parents, last = keys_of(where)
    holder = damaged
    for key in parents:
        holder = holder[key]
    holder[last] = wrong
    path = path_text(where)
    shown = "10^400" if wrong is HUGE else json.dumps(wrong)
    named = None if field_of(where) in (("format",), ("version",)) else path
    return Mutant(f"{path} as {shown}", json.dumps(damaged).encode("utf-8"), named)
