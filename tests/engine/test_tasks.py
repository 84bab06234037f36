"""The tasks kvviz writes: reproducible from their seed, at the length asked on the model's tokenizer, each needle
where the item says it is (in the context's characters and in the tokens the model reads)."""

import pytest

from kvviz.engine import tasks
from kvviz.engine.qa_prompt import Rendering
from kvviz.errors import OptionError

LENGTH = 900


@pytest.fixture(scope="module", params=[True, False], ids=["raw", "chat"])
def rendering(request, tiny_model):
    return Rendering(tiny_model.tokenizer, raw=request.param)


@pytest.mark.parametrize("name", list(tasks.TASKS))
def test_an_item_is_the_same_from_the_same_seed_and_another_from_another(rendering, name):
    first = tasks.generate([name], 2, LENGTH, seed=7, turns=2, tokens=rendering.tokens)
    again = tasks.generate([name], 3, LENGTH, seed=7, turns=2, tokens=rendering.tokens)
    other = tasks.generate([name], 2, LENGTH, seed=8, turns=2, tokens=rendering.tokens)
    assert first == again[:2]  # item i does not depend on how many are asked
    assert first[0] != first[1] and first[0].context != other[0].context
    assert [item.name for item in again] == [f"{name} #1", f"{name} #2", f"{name} #3"]


@pytest.mark.parametrize("name", list(tasks.TASKS))
def test_an_item_fills_the_length_asked_and_no_more(rendering, name):
    for item in tasks.generate([name], 2, LENGTH, seed=0, turns=1, tokens=rendering.tokens):
        # the largest haystack that fits: one more unit of it would not
        assert LENGTH - 80 < rendering.tokens(item) <= LENGTH


@pytest.mark.parametrize("name", list(tasks.TASKS))
def test_each_needle_is_where_the_item_says(rendering, name):
    tokenizer = rendering.tokenizer
    for item in tasks.generate([name], 2, LENGTH, seed=3, turns=2, tokens=rendering.tokens):
        placed = rendering.placed(item)
        ids = rendering.context(item)
        answers = [n for n in placed.needles if n.role == "answer"]
        assert answers and {n.turn for n in answers} <= {0, 1}
        for needle in placed.needles:
            text = item.context[needle.start : needle.end]
            start, end = needle.tokens
            read = tokenizer.decode(ids[start:end])
            assert text in read  # the needle's tokens hold it ...
            assert text not in tokenizer.decode(ids[start + 1 : end])  # ... and start where it starts
            assert text not in tokenizer.decode(ids[start : end - 1])  # ... and end where it ends
        for turn, asked in enumerate(item.turns):
            mine = " ".join(item.context[n.start : n.end] for n in answers if n.turn == turn)
            assert all(reference in mine for reference in asked.answers)
            assert placed.needle_positions(turn)  # the tokens a cache must hold for this question


def test_a_needle_value_occurs_only_in_its_needle(rendering):
    for item in tasks.generate(["niah_multikey_1"], 3, LENGTH, seed=1, turns=1, tokens=rendering.tokens):
        (value,) = item.turns[0].answers
        assert item.context.count(value) == 1  # the distractors hold other numbers
        assert sum(n.role == "distractor" for n in item.needles) == 3  # RULER's four keys, one asked


def test_a_length_too_short_or_unknown_names_are_refused(rendering):
    with pytest.raises(OptionError, match="needs at least .* tokens"):
        tasks.generate(["vt"], 1, 100, seed=0, turns=1, tokens=rendering.tokens)
    with pytest.raises(OptionError, match="niah_single_1, niah_multikey_1"):
        tasks.task_names("niah_single_1,needle")
    assert tasks.task_names("vt, niah_single_1,vt") == ["vt", "niah_single_1"]
