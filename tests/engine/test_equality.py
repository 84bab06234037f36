"""Greedy output of the kvviz decoder is identical, token for token, to model.generate."""

import pytest
import torch

from kvviz.engine import decode, strategies

from .families import CONFIGS, tiny_family

PROMPT = "The history of the printing press begins"
EXACT = [("dynamic", {}), ("static", {}), ("none", {}), ("sliding", {"window": 4096}), ("sink", {"window": 4096})]


def generate_reference(loaded, prompt_ids, new_tokens):
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = loaded.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=loaded.tokenizer.eos_token_id,
        )
    return out[0, len(prompt_ids) :].tolist()


def kvviz_tokens(loaded, name, options, new_tokens, prompt=PROMPT, raw=True):
    settings = decode.GenerationSettings(max_new_tokens=new_tokens, raw=raw, stop_at_eos=False)
    decoder = decode.Decoder(loaded, strategies.choose(name, options), settings, prompt)
    return [step.token_id for step in decoder], decoder


@pytest.fixture(scope="module")
def default_reference(default_model):
    ids = decode.encode_prompt(default_model.tokenizer, PROMPT, raw=False)
    return generate_reference(default_model, ids, 32)


@pytest.mark.parametrize("name,options", EXACT, ids=[n for n, _ in EXACT])
def test_default_model_matches_generate(default_model, default_reference, name, options):
    tokens, _ = kvviz_tokens(default_model, name, options, 32, raw=False)
    assert tokens == default_reference


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_families_match_generate(tiny_model, family):
    loaded = tiny_family(family, tiny_model.tokenizer)
    reference = generate_reference(loaded, decode.encode_prompt(loaded.tokenizer, PROMPT, raw=True), 24)
    for name, options in EXACT:
        if strategies.get(name).unsupported(loaded.model):
            continue
        tokens, _ = kvviz_tokens(loaded, name, options, 24)
        assert tokens == reference, f"{family} with {name} diverged from generate"


def test_default_model_writes_sensible_text(default_model):
    settings = decode.GenerationSettings(max_new_tokens=12)
    decoder = decode.Decoder(default_model, strategies.choose("dynamic"), settings, "What is the capital of France?")
    list(decoder)
    assert "Paris" in decoder.trace.text


def test_stops_at_eos(default_model):
    settings = decode.GenerationSettings(max_new_tokens=60)
    decoder = decode.Decoder(default_model, strategies.choose("dynamic"), settings, "Say just the word: yes")
    steps = list(decoder)
    assert len(steps) < 60
    assert steps[-1].token_id in decoder.eos_ids
