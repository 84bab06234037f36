"""Damaged server sessions through the one reader: every change at a random place of a recorded session is
either refused by name (file, field, what was expected) or opens, prints and saves again without error."""

from __future__ import annotations

import json
import random
import re

import pytest

from kvviz.attach.client import RequestRecord, TokenTiming
from kvviz.attach.request_trace import record_trace
from kvviz.attach.session import SessionError, from_dict
from kvviz.cli.attach import show_session
from kvviz.files.formats import read_kept
from kvviz.files.jsonfile import KeptFileError
from tests.attach.test_session_cli import recorded_session
from tests.files.test_trace_fuzz import PYTHON_TEXT

WRONG = [None, True, -1, -1.5, 10**30, "x", "", [], {}, [1, 2], float("nan"), float("inf")]


def full_session() -> dict:
    """A recorded session with every optional part present: a request, a load, a prediction, notes."""
    session = recorded_session()
    session.requests = [
        RequestRecord("hi", 4, 1.0, [TokenTiming(0, "a", 0.1), TokenTiming(1, "b", 0.2)], "length", 3, 2, 0.3)
    ]
    session.load = {"requested": 4, "concurrency": 2, "sent": 4, "completed": 3, "failed": 1, "not_started": 0,
                    "wall_s": 1.5, "completion_tokens": 12, "ttft_median_s": 0.1, "errors": ["HTTP 500"]}
    session.prediction = {"model_dir": "/m", "dtype": "bfloat16", "dtype_from": "--dtype",
                          "predicted_bytes_per_token": 69120, "allocated_bytes_per_token": 69120.0, "ratio": 1.0}
    session.errors, session.events = [[1.0, "scrape failed"]], [[2.0, "restarted"]]
    return json.loads(json.dumps(session.to_dict()))


def _places(value, address=()):
    yield address
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _places(item, (*address, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _places(item, (*address, i))


def test_session_mutants_are_refused_by_name_or_open_print_and_save(tmp_path, capsys):
    base = full_session()
    places = [p for p in _places(base) if p and p[0] not in ("format", "version", "summary")]
    rng = random.Random(16)
    counts = {"refused": 0, "opened": 0}
    for n in range(400):
        data = json.loads(json.dumps(base))
        *parent, last = rng.choice(places)
        holder = data
        for key in parent:
            holder = holder[key]
        if isinstance(holder, dict) and rng.random() < 0.25:
            del holder[last]
        else:
            holder[last] = rng.choice(WRONG)
        path = tmp_path / f"s{n:03d}.json"
        path.write_text(json.dumps(data))
        try:
            session = read_kept(path)
        except KeptFileError as exc:
            message = str(exc)
            assert message.startswith(f"{path}: ") and ": expected " in message, message
            assert not PYTHON_TEXT.search(message), message
            counts["refused"] += 1
            continue
        counts["opened"] += 1
        session.points()
        show_session(session, session.url, session.model, as_json=False)  # what `kvviz attach FILE` prints
        show_session(session, session.url, session.model, as_json=True)
        for record in session.requests:  # what the window adds to its Runs table
            record_trace(session.url, session.model, record).summary()
        assert read_kept(session.save(tmp_path / "again.json")).summary() == session.summary()
    capsys.readouterr()
    print(f"session mutants: 400, {counts['refused']} refused, {counts['opened']} opened")
    assert counts["refused"] >= 200 and counts["opened"] >= 20, counts


def test_a_histogram_that_is_not_cumulative_is_named():
    data = full_session()
    buckets = data["snapshots"][1]["histograms"]["ttft"]["buckets"]
    buckets[3][0] = buckets[2][0] / 2  # bounds must grow
    where = "s.json: snapshots[1].histograms.ttft.buckets[3]: expected a bucket above the one before"
    with pytest.raises(SessionError, match=re.escape(where)):
        from_dict(data, source="s.json")
