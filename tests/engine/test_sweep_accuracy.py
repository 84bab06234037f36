"""A sweep that also asks questions, on the tiny model: every configuration's answers beside its perplexity, kept in
the sweep file, CSV and report; the answer never names a configuration that answers worse than the accuracy
tolerance, and says where perplexity and accuracy disagree."""

import copy
import dataclasses

import pytest

from kvviz.engine import evaluate, sweep, tasks
from kvviz.engine.qa_prompt import Rendering
from kvviz.engine.strategies import parse_spec
from kvviz.files import documents, frontier, sweep_report
from kvviz.files import sweep as sweep_file
from kvviz.files.formats import read_kept
from kvviz.files.jsonfile import KeptFileError

CONFIGS = ["sink:sink_tokens=4:window=28", "h2o:budget=32", "tova:budget=16"]
REGIMES = ["query-agnostic", "multi-turn"]


@pytest.fixture(scope="module")
def swept(tiny_model):
    choices = [parse_spec(spec) for spec in CONFIGS]
    ids, record, _ = evaluate.prepare(tiny_model, documents.builtin("alice"), sweep.with_reference(choices), 64)
    rendering = Rendering(tiny_model.tokenizer, raw=True)
    items = tasks.generate(["niah_single_1"], 1, 300, seed=4, turns=2, tokens=rendering.tokens)
    asked = sweep_file.Asked("tasks niah_single_1", REGIMES, True, items, 4, 300)
    question = sweep.ask(tiny_model.model, context=1024, budget="1GiB", tolerance="20%", accuracy_tolerance=0.1)
    run = sweep.SweepRun(tiny_model, choices, ids, record, question, rows=4, asked=asked)
    list(run)
    return run.sweep


def test_every_configuration_answers_every_question_in_every_regime(swept):
    assert swept.asked.regimes == REGIMES and swept.speed.answering_s > 0
    for config in swept.configurations:
        asked = {(a.item, a.turn, a.regime) for a in config.answers}
        assert asked == {(i, t, r) for i in range(1) for t in range(2) for r in REGIMES}
        for regime in REGIMES:
            assert 0.0 <= config.accuracy(regime) <= 1.0
        assert all(a.layer_heads == 8 and 0 <= a.needle_held <= 8 for a in config.answers)
    assert all(needle.tokens for item in swept.asked.items for needle in item.needles)  # placed on the tokens read


def test_the_answers_are_kept_in_the_sweep_file_csv_and_report(swept, tmp_path):
    swept.save(tmp_path / "sweep.json")
    kept = read_kept(tmp_path / "sweep.json")
    assert kept.asked == swept.asked and kept.question.accuracy_tolerance == 0.1
    assert [c.answers for c in kept.configurations] == [c.answers for c in swept.configurations]
    row = sweep_report.csv_row(kept, kept.configurations[1])
    assert row["accuracy_query_agnostic"] == kept.configurations[1].accuracy("query-agnostic")
    assert row["accuracy_decode_time"] is None  # not asked: unknown, not 0
    sweep_report.write_csv(kept, tmp_path / "sweep.csv")
    assert "accuracy_multi_turn" in (tmp_path / "sweep.csv").read_text().splitlines()[0]
    report = sweep_report.markdown(kept)
    assert "### Answers, query-agnostic" in report and "### Answers, multi-turn" in report
    assert "multi-turn answers" in report.split("## Every configuration")[1]
    damaged = kept.to_dict()
    damaged["configurations"][1]["answers"][0]["item"] = 7
    (tmp_path / "damaged.json").write_text(__import__("json").dumps(damaged))
    with pytest.raises(KeptFileError, match=r"configurations\[1\]\.answers\[0\]: expected an answer to a question"):
        read_kept(tmp_path / "damaged.json")


def scored(result, scores: dict[str, float]):
    """The sweep with every answer of each configuration named scored as given (the rest as they are)."""
    changed = copy.deepcopy(result)
    for config in changed.configurations:
        if config.run.strategy["name"] in scores:
            config.answers = [dataclasses.replace(a, score=scores[config.run.strategy["name"]])
                              for a in config.answers]
    return changed


def test_the_answer_never_names_a_configuration_that_loses_the_answers(swept):
    everyone = scored(swept, {"dynamic": 1.0, "sink": 1.0, "h2o": 1.0, "tova": 1.0})
    said = frontier.answer(everyone)
    named = {said.smallest.label, said.best.label} - {"dynamic"}
    assert named, said.sentences  # the tolerance of 20 % lets some compressed cache be named
    losing = scored(everyone, {name.split(" ")[0]: 0.0 for name in named})
    again = frontier.answer(losing)
    assert again.smallest.label not in named and again.best.label not in named
    assert frontier.accuracy_loss(losing, again.smallest) <= 0.1
    disagree = again.sentences[-1]
    assert disagree.startswith("Perplexity and accuracy disagree:")
    assert all(f"{label}: perplexity" in disagree and "but 0 of 2 needles" in disagree for label in named
               if frontier.quality_loss(losing, next(c for c in losing.configurations if c.label == label)) <= 0.2)


def test_a_cache_beyond_the_perplexity_tolerance_that_answers_is_said_to(swept):
    result = scored(swept, {"dynamic": 1.0, "sink": 1.0, "h2o": 1.0, "tova": 1.0})
    strict = dataclasses.replace(result, question=dataclasses.replace(
        result.question, tolerance=sweep_file.Tolerance("perplexity", 0.0)))
    beyond = [c for c in frontier.placed(strict) if frontier.quality_loss(strict, c) > 0]
    said = frontier.disagreements(strict)
    assert beyond and all(any(line.startswith(f"{c.label}: perplexity") and "yet 2 of 2 needles" in line
                              for line in said) for c in beyond)


def test_a_sweep_without_questions_is_answered_as_before(swept):
    plain = dataclasses.replace(swept, asked=None)
    said = frontier.answer(plain).sentences
    # the two answers, and where serving a request outweighs the caches, what its prefill needs: no disagreement
    assert frontier.disagreements(plain) == [] and all(s.startswith("For ") for s in said[2:])
    assert [key for key, _ in sweep_report.columns(plain)] == [key for key, _ in sweep_report.COLUMNS]
