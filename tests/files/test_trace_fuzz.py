"""Hundreds of damaged traces through the one reader: each refused by name (file, field, what was expected),
never by a Python exception's own text; nonsense refused; every valid variant still opens and saves."""

from __future__ import annotations

import json
import re

import pytest

from kvviz.files.formats import read_kept
from kvviz.files.jsonfile import KeptFileError
from kvviz.files.trace import Trace, load
from tests.files.trace_mutants import base_traces, mutants

# What a catch-all would show: a Python exception's class name or its stock phrases.
PYTHON_TEXT = re.compile(
    r"\b[A-Z][A-Za-z]*(Error|Exception|Warning|Interrupt)\b|Traceback|unsupported operand|not subscriptable"
    r"|object has no attribute|invalid literal|unexpected keyword|positional argument|Errno"
)


@pytest.fixture(scope="module")
def corpus(tiny_model, tmp_path_factory):
    return mutants(base_traces(tiny_model), tmp_path_factory.mktemp("mutants"))


def _open(path):
    try:
        return "accept", read_kept(path)
    except KeptFileError as exc:
        return "refuse", str(exc)


def test_every_mutant_is_refused_by_name_or_opens(corpus, tmp_path):
    assert len(corpus) >= 500
    wrong, counts = [], {"refuse": 0, "accept": 0}
    for mutant in corpus:
        outcome, result = _open(mutant.path)  # anything but KeptFileError escapes and fails the test
        counts[outcome] += 1
        if outcome != mutant.expect:
            shown = result if outcome == "refuse" else f"a {type(result).__name__}"
            wrong.append(f"{mutant.name}: expected to {mutant.expect}, got {outcome}: {shown}")
            continue
        if outcome == "refuse":
            message = result
            if str(mutant.path) not in message:
                wrong.append(f"{mutant.name}: the message does not name the file: {message}")
            if PYTHON_TEXT.search(message):
                wrong.append(f"{mutant.name}: Python's own text reached the message: {message}")
            if mutant.where is not None and f": {mutant.where}: expected " not in message:
                wrong.append(f"{mutant.name}: the message does not name {mutant.where}: {message}")
            if not message.isascii():
                wrong.append(f"{mutant.name}: the message is not plain ASCII: {message}")
        else:
            assert isinstance(result, Trace)
            if mutant.name.endswith("-as-is"):  # a real trace reads back exactly as it was written
                assert result.to_dict() == json.loads(mutant.path.read_text()), mutant.name
            result.summary()
            again = load(result.save(tmp_path / "again.json"))  # what opens also saves and opens again
            assert again.to_dict() == result.to_dict(), mutant.name
    print(f"\nfuzz corpus: {len(corpus)} mutants, {counts['refuse']} refused, {counts['accept']} accepted")
    assert not wrong, "\n".join(wrong)
    assert counts["accept"] >= 50 and counts["refuse"] >= 450


def test_the_corpus_covers_what_issue_16_found(corpus):
    names = " ".join(m.name for m in corpus)
    for kind in ("-drop-", "-type-", "-num-", "-neg-", "-cut-at-", "utf16", "latin1", "deep-lists", "a-folder",
                 "symlink-loop", "fifo", "over-the-size-limit", "billion-positions", "switches-true", "ragged-layers",
                 "storage-a-list", "served-unknowns"):
        assert kind in names, kind
