"""The user's own questions (a JSONL file with kvpress's columns), refused by line and field; RULER's scorer on
hand-made cases; an item and its answers kept and read back."""

import json

import pytest

from kvviz.files import qa, scoring
from kvviz.files.qa import AnswerRecord, Needle, QAItem, QATurn


def lines(path, *rows):
    path.write_text("\n".join(row if isinstance(row, str) else json.dumps(row) for row in rows) + "\n")
    return path


def test_a_question_file_is_read_with_kvpress_columns(tmp_path):
    path = lines(tmp_path / "q.jsonl",
                 {"context": "Alice has a cat named Dinah.", "question": "What is the cat's name?",
                  "answers": ["Dinah"], "answer_prefix": "Answer:", "max_new_tokens": 8},
                 "",
                 {"context": "The sky is blue.", "question": "What colour is the sky?", "answers": ["blue"]},
                 {"context": "Alice has a cat named Dinah.", "question": "Who has a cat?", "answers": ["Alice"]})
    first, second = qa.read_questions(path, max_new_tokens=20)
    assert first.name == "q.jsonl line 1" and first.task == "file"
    assert [t.question for t in first.turns] == ["What is the cat's name?", "Who has a cat?"]  # one context, twice
    assert first.turns[0] == QATurn("What is the cat's name?", ["Dinah"], "Answer:", 8)
    assert first.turns[1].max_new_tokens == 20 and first.turns[1].answer_prefix == ""
    assert second.context == "The sky is blue." and second.needles == []


@pytest.mark.parametrize(("row", "says"), [
    ("{not json", "line 2 is not JSON"),
    ({"context": "c", "question": "q"}, "line 2: field answers: expected a list (each item non-empty text); the field "
                                        "is missing"),
    ({"context": "c", "question": "q", "answers": "yes"}, "line 2: field answers: expected a list"),
    ({"context": "c", "question": "q", "answers": []}, "line 2: field answers: expected a list of at least one"),
    ({"context": "c", "question": "", "answers": ["a"]}, "line 2: field question: expected non-empty text"),
    ({"context": "c", "question": "q", "answers": ["a"], "max_new_tokens": 0},
     "line 2: field max_new_tokens: expected a number of new tokens (a whole number from 1 to 4,096), found 0"),
    ({"context": "c", "question": "q", "answers": [1]}, "line 2: field answers[0]: expected non-empty text, found 1"),
    (["c", "q"], "line 2: expected an object with context, question and answers, found a list of 2"),
])
def test_a_bad_line_is_refused_by_its_number_and_field(tmp_path, row, says):
    good = {"context": "c", "question": "q", "answers": ["a"]}
    path = lines(tmp_path / "bad.jsonl", good, row, good)
    with pytest.raises(qa.QAFileError) as refused:
        qa.read_questions(path)
    assert str(refused.value).startswith(f"{path} ") and says in str(refused.value)


def test_files_that_are_not_question_files_are_refused(tmp_path):
    with pytest.raises(qa.QAFileError, match="holds no questions"):
        qa.read_questions(lines(tmp_path / "empty.jsonl", ""))
    with pytest.raises(qa.QAFileError, match="is a folder"):
        qa.read_questions(tmp_path)
    (tmp_path / "latin1.jsonl").write_bytes(b'{"context": "caf\xe9"}\n')
    with pytest.raises(qa.QAFileError, match="is not UTF-8 text"):
        qa.read_questions(tmp_path / "latin1.jsonl")
    with pytest.raises(qa.QAFileError, match="cannot read"):
        qa.read_questions(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(("prediction", "references", "every", "any_"), [
    ("The special magic number is 1234567.", ["1234567"], 1.0, 1.0),
    ("1234567 and 7654321", ["1234567", "7654321", "1111111"], 2 / 3, 1.0),  # RULER's string_match_all: 66.67
    ("nothing useful", ["1234567"], 0.0, 0.0),
    ("  VAR abcde\x00VAR FGHIJ  ", ["ABCDE", "fghij"], 1.0, 1.0),  # case does not count; control characters split
    ("123456", ["1234567"], 0.0, 0.0),  # a part of the number is not the number
    ("", ["x"], 0.0, 0.0),
])
def test_the_scorer_matches_ruler_on_hand_made_cases(prediction, references, every, any_):
    assert scoring.string_match_all(prediction, references) == pytest.approx(every)
    assert scoring.string_match_part(prediction, references) == any_
    assert scoring.clean("\tx\x01y \n") == "x\ny"
    with pytest.raises(ValueError, match="at least one reference"):
        scoring.string_match_all("x", [])


def test_an_item_and_its_answers_are_kept_and_read_back():
    item = QAItem("t #1", "niah_single_1", "ctx", [QATurn("q?", ["1"], " A:", 24)],
                  [Needle(0, 3, "answer", 0, (1, 4)), Needle(1, 2, "distractor")], seed=3)
    checked = qa.ITEM_RECORD.check(json.loads(json.dumps(item.to_dict())), None)
    assert qa.build_item(checked) == item
    record = AnswerRecord(0, 0, "multi-turn", "1", 1.0, 2, 40, 30, 90, 90)
    assert AnswerRecord(**qa.ANSWER_RECORD.check(record.to_dict(), None)) == record
    assert item.needle_positions(0) == [1, 2, 3]
