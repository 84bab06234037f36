"""Damaged journals of the new kinds (a sweep's, a conversation's), read as File ▸ Open and `kvviz trace` read them:
each is refused with a message that holds none of Python's own text, or read as the partial record it still is;
never a traceback. Every value of every line is given, in turn at one place per field, a value of the wrong kind
(`kept_mutants.WRONG`), and the journals are cut at random bytes."""

from __future__ import annotations

import copy
import json
import random

import pytest

from kvviz.files.formats import kept_from_text
from kvviz.files.jsonfile import KeptFileError
from tests.files.kept_mutants import WRONG, field_of, keys_of, kind_of, leaves
from tests.files.test_trace_fuzz import PYTHON_TEXT


@pytest.fixture(scope="module")
def journals(tiny_model, tmp_path_factory):
    """The text of a real sweep's journal (two configurations finished) and a real chat's (two turns)."""
    from kvviz.engine import evaluate, strategies, sweep, sweep_resume
    from kvviz.engine.conversation import Conversation
    from kvviz.engine.decode import GenerationSettings
    from kvviz.files import documents
    from kvviz.files.conversation import ConversationJournal
    from kvviz.files.sweep import SweepJournal

    folder = tmp_path_factory.mktemp("journals")
    choices = [strategies.choose("sliding", {"window": 6}), strategies.choose("h2o", {"budget": 6})]
    ids, record, _ = evaluate.prepare(tiny_model, documents.builtin("alice"), sweep.with_reference(choices), 16)
    question = sweep.ask(tiny_model.model, context=1024, budget="2MiB")
    run = sweep.SweepRun(tiny_model, choices, ids, record, question, rows=2, floor_forwards=0)
    swept = SweepJournal(folder / "sweep.json", run.sweep, sweep_resume.resume_key(run, "2MiB"))
    for config in run:
        swept.finished(run.sweep.configurations.index(config), run.elapsed_s)
    chat = Conversation(tiny_model, strategies.choose("sink", {"sink_tokens": 2, "window": 16}),
                        GenerationSettings(max_new_tokens=3))
    chatted = ConversationJournal(folder / "chat.json", chat.trace)
    for text in ("Hello there", "Tell me more"):
        list(chat.send(text))
        chatted.update()
    return {"sweep": swept.journal.path.read_text(), "conversation": chatted.journal.path.read_text()}


def damaged(text: str, rng: random.Random) -> list[tuple[str, str]]:
    """(what was done, the journal's text) for each damage."""
    lines = [json.loads(line) for line in text.splitlines()]
    made = []
    for number, line in enumerate(lines):
        by_field: dict[tuple, list] = {}
        for where, value in leaves(line):
            by_field.setdefault(field_of(where), []).append((where, value))
        for places in by_field.values():
            where, value = rng.choice(places)
            for wrong in WRONG[kind_of(value)]:
                copied = copy.deepcopy(line)
                *parents, last = keys_of(where)
                holder = copied
                for key in parents:
                    holder = holder[key]
                holder[last] = wrong
                again = [*lines[:number], copied, *lines[number + 1 :]]
                made.append((f"line {number + 1} {keys_of(where)} as {wrong!r:.20}",
                             "".join(json.dumps(v, separators=(",", ":")) + "\n" for v in again)))
    for offset in sorted(rng.sample(range(1, len(text)), 40)):
        made.append((f"cut at {offset}", text[:offset]))
    return made


@pytest.mark.parametrize("kind", ["sweep", "conversation"])
def test_a_damaged_journal_is_refused_in_words_or_read_as_what_it_still_holds(journals, kind):
    assert kept_from_text(journals[kind], "real.journal") is not None
    # the damaged copies are written as a journal is (compact JSON lines): undamaged, one reads back the same
    lines = journals[kind].splitlines(keepends=True)
    assert "".join(json.dumps(json.loads(line), separators=(",", ":")) + "\n" for line in lines) == journals[kind]
    made = damaged(journals[kind], random.Random(36))
    wrong, refused = [], 0
    for name, text in made:
        try:
            kept_from_text(text, "m.journal")  # anything but KeptFileError escapes and fails the test
        except KeptFileError as exc:
            refused += 1
            if PYTHON_TEXT.search(str(exc)) or "m.journal" not in str(exc):
                wrong.append(f"{name}: {exc}")
        else:
            if not name.startswith("cut"):  # a journal cut after its header is what a kill leaves: it reads
                wrong.append(f"{name}: accepted")
    print(f"{kind} journal: {refused} of {len(made)} damaged copies refused, the rest cut short and read as the "
          "partial record they hold")
    assert not wrong, "\n".join(wrong[:10])
    assert len(made) >= 500
