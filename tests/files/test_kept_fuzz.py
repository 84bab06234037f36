"""At least 500 damaged copies of a real file of every kept format (trace, evaluation, sweep, conversation, server
session), read as kvviz reads a file: every one refused, by a message that names the file and the damaged field and
holds none of Python's own text; the real files themselves open and read back as they were written.

The copies are made and read in memory (`kvviz.files.formats.kept_from_text`); one of each format also goes through
`kvviz trace`, and one through a `kvviz trace` process, for the exit status and message the user sees."""

from __future__ import annotations

import json
import random
import re

import pytest

from kvviz.files.formats import file_format, kept_from_text
from kvviz.files.jsonfile import KeptFileError, decode_text, encode_json
from tests.commands import kvviz, kvviz_process
from tests.files.kept_mutants import mutants, real_files
from tests.files.test_trace_fuzz import PYTHON_TEXT

FORMATS = ("kvviz-trace", "kvviz-eval", "kvviz-sweep", "kvviz-conversation", "kvviz-attach")


@pytest.fixture(scope="module")
def kept(tiny_model):
    return real_files(tiny_model)


def read(content: bytes, source: str):
    """What File > Open and `kvviz trace` make of a file's bytes."""
    return kept_from_text(decode_text(content, source), source)


def named(message: str, where: str) -> bool:
    """Whether a refusal names the field at `where` (or a part of it: a list's item, an object's name)."""
    return re.search(f": {re.escape(where)}[.\\[:]", message) is not None


@pytest.mark.parametrize("name", FORMATS)
def test_the_real_file_opens_as_it_was_written(kept, name):
    data = kept[name]
    opened = file_format(name).parse(json.loads(json.dumps(data)), "real")
    assert json.loads(encode_json(opened.to_dict())) == data


@pytest.mark.parametrize("name", FORMATS)
def test_every_mutant_is_refused_by_name(kept, name):
    made = mutants(kept[name], random.Random(36))
    assert len(made) >= 500
    wrong, accepted = [], []
    for i, mutant in enumerate(made):
        source = f"m{i}.json"
        try:
            read(mutant.content, source)  # anything but KeptFileError escapes and fails the test
        except KeptFileError as exc:
            message = str(exc)
            if source not in message or PYTHON_TEXT.search(message) or not message.isascii():
                wrong.append(f"{mutant.name}: {message}")
            elif mutant.where is not None and not named(message, mutant.where):
                wrong.append(f"{mutant.name}: the message does not name {mutant.where}: {message}")
            continue
        accepted.append(mutant.name)
    print(f"\n{name}: {len(made)} mutants, {len(accepted)} accepted")
    assert not accepted, f"{len(accepted)} of {len(made)} accepted:\n" + "\n".join(accepted)
    assert not wrong, "\n".join(wrong)


def test_kvviz_trace_refuses_a_mutant_of_each_format_with_status_2(kept, tmp_path):
    for name in FORMATS:
        damaged = next(m for m in mutants(kept[name], random.Random(36), at_least=100) if m.where)
        path = tmp_path / f"{name}.json"
        path.write_bytes(damaged.content)
        ran = kvviz("trace", path)
        assert ran.returncode == 2 and not ran.stdout, (name, ran)
        assert named(ran.stderr, damaged.where) and str(path) in ran.stderr, ran.stderr
        assert not PYTHON_TEXT.search(ran.stderr), ran.stderr
    process = kvviz_process("trace", path)  # the last one again, as the user runs it
    assert process.returncode == 2 and named(process.stderr, damaged.where)
    assert "Traceback" not in process.stderr
