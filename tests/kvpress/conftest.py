"""kvpress run for real beside kvviz: both sides' answers, once per model per session (`sides`)."""

from __future__ import annotations

import pytest

from .needles import needles
from .sides import KVPRESS_PYTHON, budgets, cases, kvpress_answers, kvviz_answer

PROMPTS = {"tiny": 2, "default": 5}  # needle prompts read per model (the tiny model's random weights answer nothing)


def prompts_of(tokenizer, model: str) -> list[tuple]:
    """Per needle prompt, the token ids of each prompt a case reads: {name: ids}, raw and in the chat template."""
    from kvviz.engine.decode import encode_prompt

    return [(needle, {needle.name: encode_prompt(tokenizer, needle.text, raw=True),
                      f"{needle.name}/chat": encode_prompt(tokenizer, needle.text, raw=False)})
            for needle in needles()[: PROMPTS[model]]]


@pytest.fixture(scope="session")
def sides(request, tmp_path_factory):
    """`sides(model)`: {"kvpress": {(prompt, case id): Answer}, "kvviz": {...}, "versions", "prompts", "loaded"}."""
    from kvviz.engine.model_cache import ensure_default_model

    done = {}

    def run(model: str) -> dict:
        if model in done:
            return done[model]
        loaded = request.getfixturevalue(f"{model}_model")
        if model == "tiny":
            folder = tmp_path_factory.mktemp("tiny-model")
            loaded.model.save_pretrained(folder)
            loaded.tokenizer.save_pretrained(folder)
        else:
            folder = ensure_default_model()
        prompts = prompts_of(loaded.tokenizer, model)
        readings = [(case.prompt(needle.name), case, budget)
                    for needle, _ in prompts for case in cases() for budget in budgets()]
        inputs = {name: ids for _, named in prompts for name, ids in named.items()}
        requested = [(name, ids, [case.id(budget) for read, case, budget in readings if read == name])
                     for name, ids in inputs.items()]
        reference = kvpress_answers(KVPRESS_PYTHON, folder, requested, tmp_path_factory.mktemp(f"kvpress-{model}"))
        mine = {(name, case.id(budget)): kvviz_answer(loaded, inputs[name], case.spec(budget))
                for name, case, budget in readings}
        done[model] = {"kvpress": reference["answers"], "kvviz": mine, "versions": reference["versions"],
                       "prompts": prompts, "loaded": loaded}
        return done[model]

    return run
