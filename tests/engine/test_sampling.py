"""Sampling's seed, temperature, top-k and top-p: the mechanics, on the tiny model (its random weights give every
token some probability, so other seeds draw other tokens)."""

from kvviz.engine import decode, strategies

PROMPT = "Once upon a time"


def run(loaded, **settings):
    s = decode.GenerationSettings(max_new_tokens=16, raw=True, stop_at_eos=False, **settings)
    return [step.token_id for step in decode.Decoder(loaded, strategies.choose("dynamic"), s, PROMPT)]


def test_same_seed_same_tokens(tiny_model):
    a = run(tiny_model, temperature=1.2, top_k=50, top_p=0.95, seed=7)
    b = run(tiny_model, temperature=1.2, top_k=50, top_p=0.95, seed=7)
    assert a == b


def test_other_seed_other_tokens(tiny_model):
    a = run(tiny_model, temperature=1.5, seed=1)
    b = run(tiny_model, temperature=1.5, seed=2)
    assert a != b


def test_top_k_one_is_greedy(tiny_model):
    assert run(tiny_model, temperature=0.8, top_k=1, seed=3) == run(tiny_model)
