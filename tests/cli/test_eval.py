"""`kvviz eval` as a user runs it: its output, the files it writes, and real signals to a real process."""

import csv
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from kvviz.files import evaluation
from tests.commands import kvviz

STRATEGIES = "dynamic,tova:budget=16,h2o:budget=12"


def test_eval_writes_a_file_per_strategy_and_a_summary(tmp_path):
    out = tmp_path / "out"
    result = kvviz("eval", "--model", "tiny", "--builtin", "alice", "--tokens", "48", "--strategies", STRATEGIES,
                   "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    assert [r["strategy"]["name"] for r in results] == ["dynamic", "tova", "h2o"]
    assert [r["method"]["mode"] for r in results] == ["chunked", "chunked", "chunked"]  # tova, h2o: stepped
    for r in results:
        run = evaluation.load(r["file"])
        assert r["status"] == run.status == "finished" and len(run.records) == 47
        assert run.document["source"] == "builtin:alice" and run.document["tokens"] == 48
        assert r["summary"]["perplexity"] == pytest.approx(run.summary()["perplexity"])
    assert results[1]["summary"]["first_eviction"] == 17 and results[0]["summary"]["first_eviction"] is None
    rows = list(csv.DictReader((out / "summary.csv").open(encoding="utf-8")))
    assert [row["strategy"] for row in rows] == ["dynamic", "tova", "h2o"]
    assert rows[2]["options"].startswith("budget=12 recent=-1 ") and rows[2]["first_eviction"] == "13"
    assert not list(out.glob("*.part"))


def test_strategies_that_evict_read_token_by_token_together_unless_one_at_a_time():
    args = ("eval", "--model", "tiny", "--builtin", "alice", "--tokens", "40", "--strategies",
            "tova:budget=16,dynamic,h2o:budget=16", "--token-by-token")
    together, alone = kvviz(*args), kvviz(*args, "--one-at-a-time")
    assert together.returncode == alone.returncode == 0, together.stderr + alone.stderr
    rows = together.stdout.splitlines()[1:4]  # in the order asked for, though h2o finished before dynamic started
    assert rows[0].endswith("tova (budget=16): finished, evicting from token 17, one of 2 strategies per forward")
    assert rows[1].endswith("dynamic: finished, up to 128 tokens per forward")
    assert rows[2].endswith("evicting from token 17, one of 2 strategies per forward")
    assert "share each forward" in together.stdout and "share each forward" not in alone.stdout
    as_json = [json.loads(kvviz(*args, "--json", *extra).stdout) for extra in ((), ("--one-at-a-time",))]
    stepped = json.loads(kvviz(*args[:-1], "--json").stdout)
    for batched, single, chunks in zip(*as_json, stepped, strict=True):
        assert batched["summary"]["perplexity"] == pytest.approx(single["summary"]["perplexity"], rel=1e-4)
        assert chunks["summary"]["perplexity"] == pytest.approx(single["summary"]["perplexity"], rel=1e-4)
    assert [r["method"]["mode"] for r in as_json[1]] == ["token-by-token", "chunked", "token-by-token"]
    assert [r["method"]["mode"] for r in stepped] == ["chunked"] * 3


def test_eval_prints_a_table_and_trace_opens_its_files(tmp_path):
    result = kvviz("eval", "--model", "tiny", "--builtin", "alice", "--tokens", "40", "--strategies",
                   "sliding:window=16,quantized:backend=hqq:nbits=4:q_group_size=32", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["perplexity", "2nd", "half"] and lines[0].endswith("strategy")
    # a sliding window reads in chunks, each token masked to its window
    assert lines[1].endswith("sliding (window=16): finished, evicting from token 16, up to 128 tokens per forward")
    assert "quantized (backend=hqq, nbits=4" in lines[2]
    assert lines[2].endswith(": finished, up to 128 tokens per forward")  # between re-quantizations
    assert "Q1-Q4: perplexity over each quarter" in result.stdout
    assert "kvviz: tiny-random-llama, document alice, 40 tokens, 2 strategies" in result.stderr
    shown = kvviz("trace", str(tmp_path / "eval-1-sliding.json"))
    assert shown.returncode == 0, shown.stderr
    assert "kvviz evaluation of tiny-random-llama on alice (40 tokens, chunked), finished" in shown.stdout
    assert lines[1] in shown.stdout
    as_json = json.loads(kvviz("trace", str(tmp_path / "eval-2-quantized.json"), "--json").stdout)
    assert as_json["summary"]["tokens"] == 39 and as_json["strategy"]["options"]["nbits"] == 4


def test_a_document_longer_than_the_context_is_cut_with_a_message(short_context_model):
    result = kvviz("eval", "--model", short_context_model, "--builtin", "alice", "--strategies", "dynamic", "--json")
    assert result.returncode == 0, result.stderr
    assert "longer than the model's context of 256 tokens: evaluating its first 256 tokens" in result.stderr
    assert json.loads(result.stdout)[0]["summary"]["tokens"] == 255


@pytest.mark.parametrize(
    "make,args,message",
    [
        (None, ["--text", "{tmp}/missing.txt"], "cannot read {tmp}/missing.txt"),
        (("doc.txt", b"\xff\xfeh\x00i\x00"), ["--text", "{tmp}/doc.txt"], "{tmp}/doc.txt is not UTF-8 text"),
        (("doc.md", b""), ["--text", "{tmp}/doc.md"], "{tmp}/doc.md is empty"),
        (("doc.pdf", b"%PDF"), ["--text", "{tmp}/doc.pdf"], "kvviz reads texts from UTF-8 .txt and .md files"),
        (None, ["--builtin", "bible"], "no built-in document named 'bible'; accepted: alice"),
        (None, ["--builtin", "alice", "--tokens", "1"], "--tokens: the token count must be at least 2"),
        (("file", b"x"), ["--builtin", "alice", "--out", "{tmp}/file"], "--out {tmp}/file is a file"),
        (None, ["--builtin", "alice", "--strategies", "sliding:window=0"], "option 'window' of strategy 'sliding'"),
        (None, ["--builtin", "alice", "--strategies", "nope"], "unknown strategy 'nope'"),
        (None, ["--strategies", "dynamic"], "one of the arguments --text --builtin is required"),
    ],
)
def test_refusals_name_the_problem(tmp_path, make, args, message):
    if make:
        (tmp_path / make[0]).write_bytes(make[1])
    args = [a.format(tmp=tmp_path) for a in args]
    if "--strategies" not in args:
        args += ["--strategies", "dynamic"]
    result = kvviz("eval", "--model", "tiny", *args)
    assert result.returncode == 2, result.stderr
    assert message.format(tmp=tmp_path) in result.stderr
    assert "Traceback" not in result.stderr


def test_a_model_a_strategy_cannot_run_on_is_refused_before_any_work():
    # tiny keeps 2 KV heads x 32 values per token and layer: groups of 128 cannot be filled
    result = kvviz("eval", "--model", "tiny", "--builtin", "alice", "--strategies",
                   "dynamic,quantized:q_group_size=128")
    assert result.returncode == 2, result.stderr
    assert "cannot use q_group_size=128 with this model" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_keeps_what_was_measured(tmp_path, signum, status):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvviz", "eval", "--model", "tiny", "--builtin", "alice", "--tokens", "4000",
         "--strategies", "sliding:window=32,dynamic", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    # the header comes once every strategy has been checked and the evaluation starts
    assert proc.stdout.readline().startswith("perplexity"), proc.communicate()[1]
    for line in proc.stderr:  # the progress line: once the first strategy has predicted a few tokens
        done = re.search(r"\[1/2\] [^:]*: ([\d,]+)/", line)
        if done and int(done.group(1).replace(",", "")) >= 1:
            break
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr
    partial = evaluation.load(out / "eval-1-sliding.json")
    assert partial.cancelled and 0 < len(partial.records) < 3999
    assert not (out / "eval-2-dynamic.json").exists()  # never started
    rows = list(csv.DictReader((out / "summary.csv").open(encoding="utf-8")))
    assert [(row["strategy"], row["status"]) for row in rows] == [("sliding", "cancelled")]
    assert "sliding (window=32)" in stdout and "not run: dynamic" in stdout
    assert not list(out.glob("*.part"))


def test_reading_an_evaluation_file_does_not_import_torch(tmp_path):
    from tests.cli.test_startup_imports import run_and_list_heavy_imports
    from tests.files.test_evaluate_file import sample_run

    path = sample_run().save(tmp_path / "e.json")
    assert run_and_list_heavy_imports("trace", str(path)) == "HEAVY [] STATUS 0"
    assert run_and_list_heavy_imports("eval", "--model", "tiny", "--builtin", "bible", "--strategies",
                                      "dynamic") == "HEAVY [] STATUS 2"


def test_trace_refuses_a_damaged_evaluation_file_by_field(tmp_path):
    from tests.files.test_evaluate_file import sample_run

    data = sample_run().to_dict()
    data["records"]["cache_bytes"][3] = -1
    path = tmp_path / "e.json"
    path.write_text(json.dumps(data))
    result = kvviz("trace", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{path}: records.cache_bytes[3]: expected a byte count" in result.stderr
