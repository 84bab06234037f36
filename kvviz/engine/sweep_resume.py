"""Taking up a sweep an earlier process journaled: what its journal keeps to check, the check, its question again."""

from __future__ import annotations

import dataclasses
import os

from kvviz.engine.sweep import SweepRun, free_budget
from kvviz.errors import OptionError
from kvviz.files.journal import differences, digest
from kvviz.files.sweep import Configuration, Question, SweptSoFar, read_journal

# what a sweep's journal keeps for a resume to check, by what a refusal calls it
RESUME_NAMES = {"model": "the model", "tokens_sha256": "the text's tokens", "context": "the target context",
                "sequences": "the sequences", "budget": "the budget", "tolerance": "the tolerance",
                "accuracy_tolerance": "the accuracy tolerance", "grid": "the configurations",
                "rows": "the rows per forward", "quantized_alone": "quantized caches fed alone or not",
                "questions": "the questions asked (their source, items, seed and length, plain text or not)",
                "regimes": "the regimes", "budget_covers": "what the budget covers",
                "first_tokens": "requests served up to their first token or not"}


def resume_key(run: SweepRun, budget: str) -> dict:
    """What a sweep's journal keeps for a resume to check: the same model, text, question (`budget` as the user gave
    it), configurations and questions give the same table."""
    sweep = run.sweep
    question, asked = sweep.question, sweep.asked
    questions = None
    if asked is not None:
        questions = {"source": asked.source, "raw": asked.raw, "seed": asked.seed, "length": asked.length,
                     "items_sha256": digest([item.to_dict() for item in asked.items])}
    return {"model": sweep.model, "tokens_sha256": digest(run.ids), "context": question.context,
            "sequences": question.sequences,
            # the free memory changes from one run to the next: "free" is the same budget
            "budget": "free" if budget.strip().lower() == "free" else question.budget_bytes,
            "tolerance": question.tolerance.to_dict(), "accuracy_tolerance": question.accuracy_tolerance,
            "grid": [c.run.strategy for c in sweep.configurations], "rows": run.rows,
            "quantized_alone": run.quantized_alone, "questions": questions,
            "regimes": list(asked.regimes) if asked else None, "budget_covers": question.budget_covers,
            "first_tokens": run.first_tokens}


def take_up(run: SweepRun, journal: str | os.PathLike, key: dict) -> tuple[SweptSoFar, list[Configuration]]:
    """Continue in `run` the sweep whose journal an earlier process left (`SweepRun.resume`), after checking that it
    was measured as `run` would measure it (`key`, from `resume_key`): what it holds, and the configurations kept.
    Raises OptionError naming what is wrong with the journal, or each difference."""
    from kvviz.files.sweep import SweepFileError

    try:
        found = read_journal(journal)
    except SweepFileError as exc:
        raise OptionError(str(exc)) from None
    differing = differences(found.resume, key, RESUME_NAMES)
    if differing:
        raise OptionError(f"{journal} was measured with other settings than these, so its table would not continue: "
                          + "; ".join(differing))
    return found, run.resume(found)


def asked_again(model, found: SweptSoFar) -> Question:
    """The question a journaled sweep asked, asked again here: the same, but a budget of the device's free memory,
    which is measured again."""
    question = found.sweep.question
    if found.resume.get("budget") != "free":
        return question
    free, said = free_budget(model, question.budget_covers)
    return dataclasses.replace(question, budget_bytes=free, budget=said)
