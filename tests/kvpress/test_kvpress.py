"""kvviz's strategies against kvpress's presses, run for real on the same tokens: the positions each layer and KV head
keeps after the prefill, and the needles answered.

Skipped unless KVVIZ_KVPRESS_PYTHON names the python of a venv with kvpress (packaging/kvpress/build-venv.sh makes
one; `make test-kvpress` builds it and runs these). Run with -s, each test prints its line of the table.
"""

from __future__ import annotations

import pytest

from kvviz.engine.strategies import parse_spec

from .cases import CASES
from .sides import KVPRESS_PYTHON, answered, budgets, cases, differences, explained, rounding_tie

pytestmark = [
    pytest.mark.skipif(KVPRESS_PYTHON is None,
                       reason="needs kvpress: set KVVIZ_KVPRESS_PYTHON to the python of the kvpress venv "
                       "(packaging/kvpress/build-venv.sh, or run `make test-kvpress`)"),
    pytest.mark.hung_after(2400),  # a model's first test runs all of kvpress's and kvviz's answers for it (minutes)
]

@pytest.mark.parametrize("model", ["tiny", "default"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_kept_positions_are_kvpress_s(sides, model, case):
    """The same positions in every layer and KV head, but for a difference the case documents (counted)."""
    if case not in cases():
        pytest.skip("not among KVVIZ_KVPRESS_CASES")
    both = sides(model)
    compared = differing = documented = ties = 0
    for needle, inputs in both["prompts"]:
        ids = inputs[case.prompt(needle.name)]
        for budget in budgets():
            key = (case.prompt(needle.name), case.id(budget))
            mine, theirs = both["kvviz"][key], both["kvpress"][key]
            if theirs.channels is not None:  # ThinK: the key channels zeroed
                assert mine.channels == theirs.channels, key
                compared += sum(len(head) for layer in theirs.channels for head in layer)
                continue
            compared += sum(len(head) for layer in theirs.kept for head in layer)
            found = differences(mine.kept, theirs.kept)
            tied = [d for d in found if rounding_tie(mine.scores, d)]
            found, ties = [d for d in found if d not in tied], ties + len(tied)
            fed, parted = list(ids), None
            if theirs.decoded is not None:  # a press that compresses while decoding: what is kept at the end too
                compared += sum(len(head) for layer in theirs.decoded for head in layer)
                decoded = differences(mine.decoded, theirs.decoded)
                fed += theirs.tokens[:-1]
                if any(layer == 0 for layer, *_ in decoded):  # the first layer parted at the first compression
                    parted = len(ids) + parse_spec(case.spec(budget)).options["decode_interval"]
                found += decoded
            unexplained = [d for d in found if not explained(case, fed, d, parted)]
            assert not unexplained, f"{key}: (layer, head, kvviz only, kvpress only) {unexplained[:5]}"
            differing += sum(len(d[3]) for d in found)
            documented += len(found)
    print(f"\n| {case.name} | {model} | {compared:,} kept | "
          + ("identical" if not differing else f"{differing} differ in {documented} layer-heads: {case.note}")
          + (f"; {ties} layer-heads part at a tie within float32 rounding" if ties else "") + " |")


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_needles_answered_as_kvpress_answers_them(sides, case):
    """On the default model, each needle prompt is answered by kvviz's strategy exactly where kvpress's press answers
    it; the greedy tokens are compared too (counted)."""
    if case not in cases():
        pytest.skip("not among KVVIZ_KVPRESS_CASES")
    both = sides("default")
    tokenizer = both["loaded"].tokenizer
    line = []
    for budget in budgets():
        mine_right = theirs_right = same_tokens = 0
        for needle, _ in both["prompts"]:
            key = (case.prompt(needle.name), case.id(budget))
            mine, theirs = both["kvviz"][key], both["kvpress"][key]
            assert answered(needle, tokenizer, mine.tokens) == answered(needle, tokenizer, theirs.tokens), key
            mine_right += answered(needle, tokenizer, mine.tokens)
            theirs_right += answered(needle, tokenizer, theirs.tokens)
            same_tokens += mine.tokens == theirs.tokens
        line.append(f"{mine_right}/{len(both['prompts'])} ({theirs_right}; tokens equal on {same_tokens})")
    print(f"\n| {case.spec(budgets()[0])} | " + " | ".join(line) + " |")
