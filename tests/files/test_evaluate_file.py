"""The kvviz-eval file format, its summary and summary CSV, and the documents an evaluation reads."""

import csv
import json
import math
import re

import pytest

from kvviz import resources
from kvviz.files import documents, evaluation, evaluation_csv
from kvviz.files.evaluation import EvalFileError, EvalRun, TokenRecord


def sample_run(n=12, first_eviction=None, **changes) -> EvalRun:
    records = [
        TokenRecord(position=p, token_id=100 + p, nll=0.5 + p / 10, cache_bytes=1000 * (p + 1) if p % 4 == 3 else None,
                    predicted_cache_bytes=1000 * (p + 1) if p % 4 == 3 else None,
                    tokens_held=p + 1 if p % 4 == 3 else None, wall_ms=2.0)
        for p in range(n)
    ]
    run = EvalRun(
        model={"name": "m", "dtype": "float32"},
        strategy={"name": "sliding", "options": {"window": 8}},
        document={"name": "alice", "source": "builtin:alice", "title": None, "author": None, "tokens": n + 1,
                  "first_token_id": 99, "cut": None},
        method={"mode": "chunked", "chunk": 4},
        records=records,
        first_eviction=first_eviction,
    )
    for key, value in changes.items():
        setattr(run, key, value)
    return run


def strict_json(text: str):
    def refuse(constant):
        raise AssertionError(f"not valid JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_round_trip_as_strict_json(tmp_path):
    run = sample_run(cancelled=True, error="RuntimeError: boom")
    path = run.save(tmp_path / "e.json")
    data = strict_json(path.read_text())
    assert data["format"] == "kvviz-eval" and data["version"] == 1
    assert set(data["records"]) == set(evaluation.COLUMNS)
    assert data["records"]["cache_bytes"][:4] == [None, None, None, 4000]
    again = evaluation.load(path)
    assert again.to_dict() == run.to_dict()
    assert not list(tmp_path.glob("*.part"))


def test_summary_segments():
    run = sample_run(n=12, first_eviction=5)
    s = run.summary()
    nll = [0.5 + p / 10 for p in range(12)]
    assert s["tokens"] == 12
    assert s["perplexity"] == pytest.approx(math.exp(sum(nll) / 12))
    assert s["second_half_perplexity"] == pytest.approx(math.exp(sum(nll[6:]) / 6))
    assert [(q["first"], q["last"]) for q in s["quarters"]] == [(0, 2), (3, 5), (6, 8), (9, 11)]
    assert s["quarters"][1]["perplexity"] == pytest.approx(math.exp(sum(nll[3:6]) / 3))
    assert s["before_eviction_perplexity"] == pytest.approx(math.exp(sum(nll[:5]) / 5))
    assert s["after_eviction_perplexity"] == pytest.approx(math.exp(sum(nll[5:]) / 7))
    assert s["final_cache_bytes"] == 12000 and s["peak_cache_bytes"] == 12000 and s["final_tokens_held"] == 12
    assert s["wall_s"] == pytest.approx(0.024) and s["tokens_per_s"] == pytest.approx(500)


def test_summary_of_nothing_measured_is_unknown_not_zero():
    s = sample_run(n=0, first_eviction=None).summary()
    assert s["tokens"] == 0 and s["quarters"] == []
    for key in ("perplexity", "mean_nll", "final_cache_bytes", "peak_cache_bytes", "tokens_per_s",
                "before_eviction_perplexity"):
        assert s[key] is None, key


def test_summary_csv(tmp_path):
    runs = [sample_run(), sample_run(first_eviction=3, error="RuntimeError: x")]
    rows = [evaluation_csv.summary_row(run, f"eval-{i}.json") for i, run in enumerate(runs)]
    path = evaluation_csv.write_summary_csv(rows, tmp_path / "summary.csv")
    table = list(csv.DictReader(path.open(encoding="utf-8")))
    assert list(table[0]) == list(evaluation_csv.CSV_COLUMNS)
    assert table[0]["strategy"] == "sliding" and table[0]["options"] == "window=8"
    assert table[0]["method"] == "chunked (4)" and table[0]["status"] == "finished"
    assert table[0]["first_eviction"] == "" and table[1]["first_eviction"] == "3"
    assert table[1]["status"] == "error" and table[1]["file"] == "eval-1.json"
    assert float(table[0]["final_cache_mib"]) == pytest.approx(12000 / 2**20, rel=1e-5)


def test_a_folder_summary_is_written_again_from_its_files_and_journals(tmp_path):
    """An evaluation kept in a folder (kvviz eval --out) of three strategies: the first has its file, the second only
    the journal a killed process left, the third never started. Its summary has a row for each of the first two."""
    strategies = [{"name": "sliding", "options": {"window": 8}}, {"name": "sink", "options": {}},
                  {"name": "dynamic", "options": {}}]
    first = tmp_path / evaluation_csv.file_name(0, strategies[0])
    sample_run().save(first)
    second = sample_run(n=5, strategy=strategies[1])
    journal = evaluation.EvalJournal(tmp_path / evaluation_csv.file_name(1, strategies[1]), second, {})
    journal.update()
    journal.journal.close()
    written = evaluation_csv.write_folder_summary(tmp_path, strategies)
    table = list(csv.DictReader(written.open(encoding="utf-8")))
    assert [(r["strategy"], r["status"], r["file"], r["tokens"]) for r in table] == [
        ("sliding", "finished", str(first), "12"), ("sink", "cancelled", "", "5")]

    (tmp_path / "eval-1-sliding.json").write_text("{}", encoding="utf-8")  # damaged: named, nothing written
    with pytest.raises(EvalFileError, match="eval-1-sliding.json"):
        evaluation_csv.write_folder_summary(tmp_path, strategies)
    assert written.read_text(encoding="utf-8").count("\n") == 3


def mutate(data, path, value):
    *parents, last = path
    for key in parents:
        data = data[key]
    if value is KeyError:
        del data[last]
    else:
        data[last] = value


@pytest.mark.parametrize(
    "path,value,message",
    [
        (("format",), "kvviz-trace", 'expected "format": "kvviz-eval"'),
        (("version",), 2, "of version 2; this kvviz reads version 1"),
        (("model",), KeyError, "model: expected a model card (an object); the field is missing"),
        (("strategy", "name"), 3, "strategy.name: expected non-empty text, found 3"),
        (("strategy", "options"), [], "strategy.options: expected an object"),
        (("document", "tokens"), -1, "document.tokens: expected a number of tokens"),
        (("document", "tokens"), True, "document.tokens: expected a number of tokens"),
        (("method", "mode"), "magic", 'method.mode: expected one of "token-by-token", "chunked"'),
        (("method", "chunk"), 0, "method.chunk: expected a whole number >= 1, found 0"),
        (("cancelled",), "no", "cancelled: expected true or false"),
        (("error",), 5, "error: expected text or null, found 5"),
        (("first_eviction",), -3, "first_eviction: expected a whole number >= 0 or null, found -3"),
        (("records",), [], "records: expected a table of columns (an object of lists)"),
        (("records", "nll"), KeyError, "records.nll: expected a list"),
        (("records", "nll", 3), float("nan"), "records.nll[3]: expected a negative log-likelihood in nats"),
        (("records", "nll", 3), "1.5", "records.nll[3]: expected a negative log-likelihood in nats"),
        (("records", "nll", 4), -0.5, "records.nll[4]: expected a negative log-likelihood in nats (a finite number "
         ">= 0), found -0.5"),
        (("records", "wall_ms", 0), float("inf"), "records.wall_ms[0]: expected a time in ms"),
        (("records", "cache_bytes", 3), -4000, "records.cache_bytes[3]: expected a byte count"),
        (("records", "tokens_held", 3), 2.5, "records.tokens_held[3]: expected a whole number from 0"),
        (("records", "token_id", 0), None, "records.token_id[0]: expected a whole number >= 0, found null"),
        (("records", "position", 5), 2, "records.position[5]: expected a position after 4"),
        (("records", "position", 11), 12, "records.position[11]: expected a position below 12"),
        (("records", "wall_ms"), [1.0], "records: expected columns of one length (they have 1, 12)"),
    ],
)
def test_damaged_files_are_refused_by_field(tmp_path, path, value, message):
    data = sample_run().to_dict()
    mutate(data, path, value)
    target = tmp_path / "bad.json"
    target.write_text(json.dumps(data))  # json writes NaN and Infinity as a hand-edited file could
    with pytest.raises(EvalFileError) as refused:
        evaluation.load(target)
    assert str(target) in str(refused.value) and message in str(refused.value)


@pytest.mark.parametrize("content", [b"", b"\xff\xfe{", b"{\"format\": \"kvviz-eval\",", b"[]"])
def test_unreadable_files_are_refused(tmp_path, content):
    target = tmp_path / "bad.json"
    target.write_bytes(content)
    with pytest.raises(EvalFileError, match="is empty|is not a (complete )?kvviz evaluation"):
        evaluation.load(target)


# -- documents ------------------------------------------------------------------------------------


def test_the_shipped_document_and_its_licence():
    alice = documents.builtin("alice")
    assert alice.source == "builtin:alice" and alice.author == "Lewis Carroll"
    assert alice.text.startswith("                ALICE'S ADVENTURES IN WONDERLAND")
    assert "\r" not in alice.text and alice.text.rstrip().endswith("THE END")
    notes = resources.path("texts", "README.md").read_text(encoding="utf-8")
    for needed in ("Lewis Carroll", "Alice's Adventures in Wonderland", "public domain", "brotli", "alice.txt"):
        assert needed in notes
    assert documents.builtin_names() == ["alice"]


def test_unknown_builtin_names_the_accepted_ones():
    with pytest.raises(documents.DocumentError, match="no built-in document named 'bible'; accepted: alice"):
        documents.builtin("bible")


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("notes.pdf", b"%PDF-1.4", "kvviz reads texts from UTF-8 .txt and .md files"),
        ("latin1.txt", "caf\xe9".encode("latin-1"), "is not UTF-8 text (undecodable byte at offset 3)"),
        ("empty.txt", b"", "is empty"),
        ("blank.md", b"  \n\t\n", "is empty"),
        ("bom.txt", b"\xef\xbb\xbf", "is empty"),
    ],
)
def test_documents_refused_by_name(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(documents.DocumentError, match=re.escape(message)) as refused:
        documents.from_file(path)
    assert str(path) in str(refused.value)


def test_missing_and_folder_documents_are_refused(tmp_path):
    with pytest.raises(documents.DocumentError, match="cannot read .*nope.txt: No such file"):
        documents.from_file(tmp_path / "nope.txt")
    folder = tmp_path / "folder.md"
    folder.mkdir()
    with pytest.raises(documents.DocumentError, match="is a folder"):
        documents.from_file(folder)


def test_a_prompt_file_and_a_document_are_read_by_one_reader_with_one_limit(tmp_path):
    """The window's File > Open prompt file and a document to evaluate or choose on read the same kinds of file, refuse
    the same ones with the same words, and stop at the same size."""
    big = tmp_path / "book.txt"
    with big.open("wb") as f:
        f.truncate(documents.MAX_FILE_BYTES + 1)
    nul = tmp_path / "binary.md"
    nul.write_bytes(b"text\x00more")
    for path, words in ((big, f"at most {documents.MAX_FILE_BYTES // 2**20} MiB"), (nul, "NUL characters")):
        with pytest.raises(documents.DocumentError) as as_prompt:
            documents.read_text(path)
        with pytest.raises(documents.DocumentError) as as_document:
            documents.from_file(path)
        assert str(as_prompt.value) == str(as_document.value) and words in str(as_prompt.value)
        assert str(path) in str(as_prompt.value)
    fits = tmp_path / "fits.txt"
    fits.write_text("a" * (documents.MAX_FILE_BYTES - 1), encoding="utf-8")
    assert documents.read_text(fits) == documents.from_file(fits).text


def test_a_users_markdown_file_is_read_without_its_byte_order_mark(tmp_path):
    path = tmp_path / "Notes.MD"
    path.write_bytes("\ufeff# Notes\n\nCafé au lait.".encode())
    document = documents.from_file(path)
    assert document.text == "# Notes\n\nCafé au lait." and document.name == "Notes.MD"
    assert document.describe() == {"name": "Notes.MD", "source": str(path), "title": None, "author": None}


def test_time_left_comes_from_each_prediction_s_measured_time():
    chunked = sample_run(12)  # 2 ms a prediction, arrived in chunks of 4
    waiting = sample_run(0)  # the same kind, not started: read at the speed its kind showed
    batched = sample_run(0, method={"mode": "batched", "chunk": 1, "rows": 2})  # a kind not measured yet
    assert evaluation.ms_per_prediction(chunked) == 2.0 and evaluation.ms_per_prediction(waiting) is None
    assert evaluation.seconds_left([(chunked, 100), (waiting, 50)]) == ((88 + 50) * 2.0 / 1000, True)
    assert evaluation.seconds_left([(chunked, 100), (batched, 50)]) == (88 * 2.0 / 1000, False)  # a lower bound
    assert evaluation.seconds_left([(waiting, 50)]) == (None, False)  # nothing measured: unknown, not 0
    slow_lately = sample_run(600)
    for record in slow_lately.records[-evaluation.RECENT:]:
        record.wall_ms = 5.0  # a growing cache: later tokens cost more
    assert evaluation.ms_per_prediction(slow_lately) == 5.0
