"""Encoder-decoder models (T5, BART), tiny and random: the prompt goes to the encoder, the decoder generates. The
cache is transformers' EncoderDecoderCache: the decoder's self-attention keys and values grow by one token per step,
the cross-attention keys and values of the encoder's output are fixed once the prompt is read. Greedy tokens equal
plain generate; measured bytes equal every tensor of transformers' own EncoderDecoderCache; predicted equals
measured at every step; strategies that act on a decoder-only cache are refused by name."""

import pytest
import torch
import transformers

from kvviz.engine import decode, evaluate, model_files, strategies
from kvviz.engine.conversation import Conversation
from kvviz.errors import ModelError, OptionError
from kvviz.files.documents import Document

from .families import ENCODER_DECODERS, tiny_encoder_decoder
from .test_architectures import tensor_bytes
from .test_equality import PROMPT

NEW_TOKENS = 4


@pytest.fixture(scope="module")
def models(tiny_model):
    return {name: tiny_encoder_decoder(name, tiny_model.tokenizer) for name in ENCODER_DECODERS}


def run(loaded, spec, new_tokens=NEW_TOKENS):
    settings = decode.GenerationSettings(max_new_tokens=new_tokens, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(loaded, strategies.parse_spec(spec), settings, PROMPT)
    return list(decoder), decoder


@pytest.mark.parametrize("family", sorted(ENCODER_DECODERS))
def test_greedy_tokens_and_bytes_equal_transformers_own_encoder_decoder_cache(models, family):
    loaded = models[family]
    prompt = torch.tensor([decode.encode_prompt(loaded.tokenizer, PROMPT, raw=True)])
    steps, _ = run(loaded, "dynamic")
    tokens = [step.token_id for step in steps]
    with torch.inference_mode():
        generated = loaded.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                          max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    start = loaded.model.config.decoder_start_token_id
    assert [start, *tokens] == generated[0].tolist()
    # the same tokens through transformers' own cache: every tensor of both its caches, as kvviz measured them
    cache = transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache())
    with torch.inference_mode():
        loaded.model(input_ids=prompt, decoder_input_ids=torch.tensor([[start, *tokens[:-1]]]), cache=cache)
    own = (tensor_bytes(cache.self_attention_cache, loaded.model)
           + tensor_bytes(cache.cross_attention_cache, loaded.model))
    assert steps[-1].cache_bytes == own > 0
    # cross-attention: every prompt token's keys and values in every layer, from the first step on, fixed
    cross = prompt.shape[-1] * loaded.card["cross_bytes_per_prompt_token"]
    for step in steps:
        assert step.cache_bytes == step.predicted_cache_bytes, f"step {step.index}"
        assert sum(layer.cross_bytes for layer in step.layers) == cross
        assert [layer.cross_tokens for layer in step.layers] == [prompt.shape[-1]] * 2
        assert [layer.seq_len for layer in step.layers] == [step.index + 1] * 2  # the start token, then each new one


@pytest.mark.parametrize("family", sorted(ENCODER_DECODERS))
def test_static_and_no_cache_run_exactly_and_the_rest_are_refused_by_name(models, family):
    loaded = models[family]
    dynamic = [step.token_id for step in run(loaded, "dynamic")[0]]
    for spec in ("static", "none"):
        steps, _ = run(loaded, spec)
        assert [step.token_id for step in steps] == dynamic, spec
        assert all(step.cache_bytes == step.predicted_cache_bytes for step in steps), spec
        if spec == "static":  # slots for the decoder's own tokens (its start token and the new ones), not the prompt
            assert {layer.capacity for layer in steps[-1].layers} == {NEW_TOKENS + 1}
    for spec in ("sliding:window=4", "sink:sink_tokens=2:window=4", "h2o:budget=4", "quantized:backend=hqq"):
        with pytest.raises(OptionError, match="is an encoder-decoder .*; run dynamic, static or none$"):
            run(loaded, spec)


def test_switching_evaluating_and_comparing_to_a_reference_are_refused_with_the_reason(models):
    loaded = models["t5"]
    settings = decode.GenerationSettings(max_new_tokens=3, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(loaded, strategies.choose("dynamic"), settings, PROMPT)
    next(iter(decoder))
    with pytest.raises(OptionError, match="cross-attention .*; start a new run$"):
        decoder.request_switch(strategies.choose("static"))
    with pytest.raises(OptionError, match="is an encoder-decoder"):
        decode.Decoder(loaded, strategies.choose("dynamic"), settings, PROMPT, reference=True)
    with pytest.raises(OptionError, match="^max new tokens .300. and the decoder's start token pass the model's "
                       "context of 256 tokens; ask for at most 255 new tokens$"):
        bart = models["bart"]
        decode.Decoder(bart, strategies.choose("dynamic"), decode.GenerationSettings(max_new_tokens=300), PROMPT)
    document = Document(name="text", source="text.txt", text=PROMPT * 4)
    with pytest.raises(OptionError, match="T5ForConditionalGeneration is an encoder-decoder: .* with kvviz run$"):
        evaluate.prepare(loaded, document, [strategies.choose("dynamic")])
    with pytest.raises(OptionError, match="^a conversation keeps one .*: chat with a decoder-only model$"):
        Conversation(loaded, strategies.choose("dynamic"), settings)


def test_a_speech_encoder_decoder_is_refused_with_the_reason():
    with pytest.raises(ModelError, match="a speech encoder-decoder: its encoder reads audio features, not text"):
        model_files.check_runnable(transformers.WhisperConfig(), "whisper")
    model_files.check_runnable(ENCODER_DECODERS["t5"](), "t5")  # text-to-text runs
