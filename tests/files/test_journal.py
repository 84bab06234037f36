"""Journals (kvviz.files.journal): a journal cut anywhere reads as what it held up to its last whole line; traces
and evaluations read from their journals as partial runs that say so. No torch: records are built by hand."""

import json

import pytest

from kvviz.files import evaluation, journal, trace
from kvviz.files.formats import kept_from_text, read_kept
from kvviz.files.jsonfile import KeptFileError, decode_text

CARD = {"name": "tiny-random-llama", "num_layers": 1}


def make_trace(steps: int) -> trace.Trace:
    kept = trace.Trace(model=CARD, strategy={"name": "dynamic", "options": {}}, prompt="abc", prompt_tokens=3,
                       settings={"max_new_tokens": 1499})
    for i in range(steps):
        held = 3 + i
        layer = trace.LayerRecord(keys_bytes=32 * held, values_bytes=32 * held, seq_len=held, capacity=held,
                                  spans=[[2, held]])
        kept.steps.append(trace.StepRecord(index=i, phase="prefill" if i == 0 else "decode", token_id=7 + i,
                                           token=f"café{i}", wall_ms=1.5, cache_bytes=64 * held,
                                           predicted_cache_bytes=64 * held, rss_bytes=None, strategy="dynamic",
                                           layers=[layer], position=held))
    return kept


def make_eval(records: int) -> evaluation.EvalRun:
    run = evaluation.EvalRun(model=CARD, strategy={"name": "dynamic", "options": {}},
                             document={"name": "alice", "source": "builtin:alice", "tokens": 1500},
                             method={"mode": "chunked", "chunk": 128})
    run.records = [evaluation.TokenRecord(i, 10 + i, 2.5 + i / 1000, None, None, None, 0.25) for i in range(records)]
    return run


def test_a_journal_cut_at_any_byte_loses_only_the_line_being_written(tmp_path):
    path = tmp_path / "run.json"
    kept = make_trace(6)
    journaled = trace.TraceJournal(path, kept)
    journaled.update()  # created with all six steps
    kept.steps += make_trace(9).steps[6:]
    journaled.update()
    whole = journal.journal_path(path).read_bytes()
    header_end = whole.index(b"\n") + 1
    line_ends = [i + 1 for i, byte in enumerate(whole) if byte == ord("\n")]
    # the header is never cut (the journal is created whole): every byte of the last lines, every 5th before
    sizes = sorted({*range(header_end, len(whole) + 1, 5), *range(line_ends[-3] - 2, len(whole) + 1),
                    *(end + d for end in line_ends[1:] for d in (-1, 0, 1) if end + d <= len(whole))})
    for size in sizes:
        partial = kept_from_text(decode_text(whole[:size], "cut"), "cut")  # what read_kept does with a file's bytes
        whole_lines = sum(end <= size for end in line_ends) - 1
        assert [s.token for s in partial.steps] == [f"café{i}" for i in range(whole_lines)], size
        assert partial.cancelled
        assert partial.error == f"stopped after {whole_lines} of 1,499 tokens; the process ended without saving"
    journaled.journal.close()


def test_a_trace_journal_goes_once_the_trace_is_saved(tmp_path):
    path = tmp_path / "run.json"
    journaled = trace.TraceJournal(path, make_trace(3))
    journaled.update()
    assert journal.journal_path(path).exists() and not path.exists()
    journaled.save()
    assert trace.load(path).steps[-1].token == "café2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_an_evaluation_journal_reads_as_a_partial_evaluation_and_keeps_its_resume_key(tmp_path):
    path = tmp_path / "eval-1-dynamic.json"
    run = make_eval(0)
    journaled = evaluation.EvalJournal(path, run, {"tokens_sha256": "abc", "index": 0})
    run.records = make_eval(412).records
    journaled.update()
    partial = read_kept(journal.journal_path(path))
    assert len(partial.records) == 412 and partial.records[-1].nll == pytest.approx(2.911)
    assert partial.error == "stopped after 412 of 1,499 tokens; the process ended without saving"
    found = evaluation.read_journal(journal.journal_path(path))
    assert found.resume == {"tokens_sha256": "abc", "index": 0} and found.ended is None
    journaled.update(end=True)
    found = evaluation.read_journal(journal.journal_path(path))
    assert found.ended == "finished" and found.run.status == "finished" and found.run.error is None
    journaled.save()
    journaled.remove()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval-1-dynamic.json"]


def test_a_damaged_line_before_the_last_is_refused_by_its_number(tmp_path):
    path = tmp_path / "run.json"
    journaled = trace.TraceJournal(path, make_trace(4))
    journaled.update()
    journaled.journal.close()
    lines = journal.journal_path(path).read_text().split("\n")
    lines[2] = lines[2][:40]  # a step cut short, followed by more
    bad = tmp_path / "bad.json.journal"
    bad.write_text("\n".join(lines))
    with pytest.raises(KeptFileError, match="line 3 of the journal is not JSON"):
        read_kept(bad)
    bad.write_text(json.dumps({"format": "kvviz-journal"})[:20])
    with pytest.raises(KeptFileError, match="not a kvviz file|not a complete kvviz journal"):
        read_kept(bad)


def test_the_words_for_a_journal_left_behind():
    assert journal.ended_without_saving(1, 1) == "stopped after 1 of 1 token; the process ended without saving"
    assert journal.ended_without_saving(3, None).startswith("stopped after 3 tokens;")
