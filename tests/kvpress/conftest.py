"""kvpress run for real beside kvviz: both sides' answers, once per model per session (`sides`)."""

from __future__ import annotations

import pytest

from .cases import CASES
from .needles import needles
from .sides import KVPRESS_PYTHON, budgets, kvpress_answers, kvviz_answer

PROMPTS = {"tiny": 2, "default": 5}  # needle prompts read per model (the tiny model's random weights answer nothing)


@pytest.fixture(scope="session")
def sides(request, tmp_path_factory):
    """`sides(model)`: {"kvpress": {(prompt, case id): Answer}, "kvviz": {...}, "versions", "prompts", "loaded"}."""
    from kvviz.engine.evaluate import encode
    from kvviz.engine.model_cache import ensure_default_model

    done = {}

    def run(model: str) -> dict:
        if model not in done:
            loaded = request.getfixturevalue(f"{model}_model")
            if model == "tiny":
                folder = tmp_path_factory.mktemp("tiny-model")
                loaded.model.save_pretrained(folder)
                loaded.tokenizer.save_pretrained(folder)
            else:
                folder = ensure_default_model()
            prompts = [(needle, encode(loaded.tokenizer, needle.text)) for needle in needles()[: PROMPTS[model]]]
            reference = kvpress_answers(KVPRESS_PYTHON, folder, [(n.name, ids) for n, ids in prompts],
                                        tmp_path_factory.mktemp(f"kvpress-{model}"))
            mine = {(needle.name, case.id(budget)): kvviz_answer(loaded, ids, case.spec(budget))
                    for needle, ids in prompts for case in CASES for budget in budgets()}
            done[model] = {"kvpress": reference["answers"], "kvviz": mine, "versions": reference["versions"],
                           "prompts": prompts, "loaded": loaded}
        return done[model]

    return run
