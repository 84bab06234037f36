"""Tiny random-initialised models of several decoder-only families, for architecture coverage."""

import transformers

from kvviz.engine.models import TINY_SHAPE, LoadedModel, build_random_model, model_card

COMMON = dict(
    vocab_size=49152,
    **TINY_SHAPE,
    max_position_embeddings=512,
    eos_token_id=2,
    bos_token_id=1,
    pad_token_id=2,
)

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**COMMON),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON),
    # a sliding window shorter than the test sequence, so that the window really slides
    "mistral": lambda: transformers.MistralConfig(**COMMON, sliding_window=12),
    "gemma2": lambda: transformers.Gemma2Config(**COMMON, head_dim=16, sliding_window=12),
    "gemma3": lambda: transformers.Gemma3TextConfig(**COMMON, head_dim=16, sliding_window=12),
    "phi3": lambda: transformers.Phi3Config(**COMMON),
}


def tiny_family(name: str, tokenizer) -> LoadedModel:
    model = build_random_model(CONFIGS[name]())
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, card=model_card(model, f"tiny-{name}"), spec=name)
