"""`kvviz choose --qa/--task` on the tiny model, in this process: accuracy per configuration and regime in the JSON,
the user's questions and a kept conversation asked, bad question files and options refused; `kvviz run --json`
gives the generated text."""

import json

import pytest

from tests.commands import kvviz

BASE = ["choose", "--model", "tiny", "--tokens", "48", "--context", "512", "--budget", "1GiB"]
CONFIGS = "h2o:budget=16,sink:sink_tokens=4:window=12"


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    path = tmp_path_factory.mktemp("qa") / "questions.jsonl"
    rows = [{"context": "Alice was beginning to get very tired of sitting by her sister on the bank. " * 4,
             "question": "Who was tired?", "answers": ["Alice"], "max_new_tokens": 6},
            {"context": "The magic number is 4417. " * 6, "question": "What is the number?", "answers": ["4417"],
             "answer_prefix": " It is", "max_new_tokens": 6}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_accuracy_per_configuration_in_the_regime_asked(questions):
    ran = kvviz(*BASE, "--qa", questions, "--raw", "--question-in-cache", "--configs", CONFIGS, "--json")
    assert ran.returncode in (0, 3), ran.stderr
    result = json.loads(ran.stdout)
    assert result["asked"]["regimes"] == ["query-aware"] and result["asked"]["raw"] is True
    assert [item["name"] for item in result["asked"]["items"]] == ["questions.jsonl line 1", "questions.jsonl line 2"]
    for row in result["configurations"]:
        assert 0.0 <= row["accuracy_query_aware"] <= 1.0 and row["accuracy_query_agnostic"] is None
        assert [(a["item"], a["turn"], a["regime"]) for a in row["answers"]] == [(0, 0, "query-aware"),
                                                                               (1, 0, "query-aware")]
    assert "points of the exact cache's accuracy in query-aware" in result["answer"]["sentences"][0]
    assert "asking 2 questions of 2 items (questions.jsonl) in query-aware, read as plain text" in ran.stderr


def test_generated_tasks_are_asked_and_their_needles_placed(tmp_path):
    ran = kvviz(*BASE, "--task", "niah_single_1", "--items", "1", "--length", "260", "--turns", "2", "--raw",
                "--regime", "multi-turn,query-agnostic", "--configs", "h2o:budget=32", "--out", tmp_path, "--json")
    assert ran.returncode in (0, 3), ran.stderr
    result = json.loads(ran.stdout)
    (item,) = result["asked"]["items"]
    assert item["task"] == "niah_single_1" and len(item["turns"]) == 2 and "context" not in item
    assert all(needle["tokens"][0] < needle["tokens"][1] for needle in item["needles"])
    assert result["asked"]["seed"] == 0 and result["asked"]["length"] == 260
    header = ran.stderr
    assert "multi-turn" in header
    report = (tmp_path / "report.md").read_text()
    assert "### Answers, multi-turn" in report and "niah_single_1 #1 q2" in report
    assert "accuracy_multi_turn" in (tmp_path / "sweep.csv").read_text().splitlines()[0]


def test_a_kept_conversation_is_asked_again_turn_after_turn(tmp_path):
    script, kept = tmp_path / "chat.txt", tmp_path / "chat.json"
    script.write_text("Tell me about the rabbit.\nAnd the queen?\n")
    chat = kvviz("chat", "--model", "tiny", "--script", script, "--max-new-tokens", "6", "--trace", kept)
    assert chat.returncode == 0, chat.stderr
    ran = kvviz(*BASE, "--qa", kept, "--regime", "multi-turn", "--configs", "sink:sink_tokens=4:window=24", "--json")
    assert ran.returncode in (0, 3), ran.stderr
    result = json.loads(ran.stdout)
    (item,) = result["asked"]["items"]
    assert item["task"] == "conversation" and [t["question"] for t in item["turns"]] == ["Tell me about the rabbit.",
                                                                                           "And the queen?"]
    exact = result["configurations"][0]
    assert exact["strategy"] == "dynamic" and exact["accuracy_multi_turn"] == 1.0  # the kept replies, written again


@pytest.mark.parametrize(("args", "says"), [
    (["--qa", "QA", "--items", "3"], "--items sets how --task writes its items; give --task too"),
    (["--regime", "multi-turn"], "give --task or --qa too"),
    (["--task", "niah_single_1", "--regime", "online"], "--regime: no regime named 'online'; the regimes: "
                                                        "query-agnostic, query-aware, decode-time, multi-turn"),
    (["--task", "needle"], "no task named 'needle'; the tasks: niah_single_1"),
    (["--task", "vt", "--length", "120"], "vt needs at least"),
    (["--task", "vt", "--turns", "0"], "--turns must be at least 1, not 0"),
    (["--task", "vt", "--accuracy-tolerance", "150"], "--accuracy-tolerance is in points from 0 to 100"),
    (["--task", "vt", "--qa", "QA"], "not allowed with argument --task"),
])
def test_bad_question_options_are_refused_with_what_is_accepted(questions, args, says):
    ran = kvviz(*BASE, *[str(questions) if a == "QA" else a for a in args])
    assert ran.returncode == 2 and says in ran.stderr and "Traceback" not in ran.stderr, ran.stderr


def test_a_bad_question_file_is_refused_by_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "c", "question": "q", "answers": ["a"]}\n{"context": "c", "question": "q"}\n')
    ran = kvviz(*BASE, "--qa", bad)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert f"{bad} line 2: field answers: expected a list" in ran.stderr


def test_run_json_gives_the_generated_text(tmp_path):
    ran = kvviz("run", "--model", "tiny", "--prompt", "Once upon a time", "--max-new-tokens", "6", "--json",
                "--trace", tmp_path / "run.json", "--pin", "upon a")
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    from kvviz.files import trace

    kept = trace.load(tmp_path / "run.json")
    assert out["text"] == kept.text and out["new_tokens"] == 6
    (pin,) = out["pins"]
    assert pin["label"] == "upon a" and pin["held"] == pin["layers"] * pin["heads"]  # a dynamic cache keeps it
