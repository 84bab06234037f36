"""A tiny random config of every causal-LM family in the installed transformers, for the every-family check.

The families with a config of their own in `tests/engine/families.py` get it; every other family gets its own
default config made small: the widths, heads, layers, experts and windows transformers' configs name (`SMALL`),
a vocabulary the default model's tokenizer fits in, at most four decoder layers that keep one of each kind of layer
the default config mixes (every per-layer list cut alike), windows and chunks of 8 tokens so that a few steps slide
them, and sub-configs (a vision tower) made small alike.
"""

from __future__ import annotations

import json

import torch
import transformers
from transformers import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from kvviz.engine.model_files import model_class

from .families import ARCHITECTURES, CONFIGS, ENCODER_DECODERS

FAMILIES = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
OWN = {make().model_type: make for table in (CONFIGS, ARCHITECTURES, ENCODER_DECODERS) for make in table.values()}
TOKENIZER_VOCAB = 49152  # the default model's tokenizer's, which feeds every family
WINDOW = 8  # sliding windows and attention chunks: the check's prompt and steps go past them
MOST_PARAMETERS = 60_000_000  # a tiny config that is still larger than this is not tiny: its family is skipped

SMALL = {
    "hidden_size": 64, "d_model": 64, "n_embd": 64, "n_embed": 64, "embed_dim": 64,
    "intermediate_size": 128, "n_inner": 128, "ffn_dim": 128, "d_ff": 128, "decoder_ffn_dim": 128,
    "encoder_ffn_dim": 128, "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "n_heads": 4,
    "decoder_attention_heads": 4, "encoder_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "expert_intermediate_size": 32,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "rotary_dim": 8,
    "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_head_dim": 8, "linear_num_heads": 2,
    "mamba_d_state": 8, "state_size": 8, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_headdim": 16,
    "n_mamba_heads": 8, "mamba_d_ssm": 128, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 8,
    "hidden_size_per_layer_input": 8, "max_position_embeddings": 256,
    "n_positions": 256,
}
# set wherever a config names them, whatever their default: experts routed in one group, two per token
ROUTING = {"n_group": 1, "topk_group": 1, "num_expert_group": 1, "num_experts_per_tok": 2, "num_experts_per_token": 2}
# multi-head latent attention: as many KV heads as query heads, widths that fit together (as families.MLA)
LATENT = {"num_key_value_heads": 4, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8,
          "qk_nope_head_dim": 8, "v_head_dim": 16, "head_dim": 8, "qk_head_dim": 16, "first_k_dense_replace": 1}
WINDOWS = ("sliding_window", "attention_chunk_size", "attention_window_size")
LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers")


def tiny_config(model_type: str):
    """A tiny config of the family (raises what transformers raises where none builds)."""
    if model_type in OWN:
        return OWN[model_type]()
    return _small(CONFIG_MAPPING[model_type])


def parameters(config) -> int:
    """Parameters of the model the config builds, counted without allocating them."""
    with torch.device("meta"):
        model = model_class(config).from_config(config)
    return sum(p.numel() for p in model.parameters())


def _small(config_class, base=None):
    base = base if base is not None else config_class()
    values = base.to_dict()
    per_layer = (values.get("per_layer_config") or {}).values()
    latent = isinstance(values.get("kv_lora_rank"), int) or any("kv_lora_rank" in layer for layer in per_layer)
    changes = {k: v for k, v in SMALL.items() if _larger(values.get(k), v) and not (latent and k == "head_dim")}
    changes.update({k: v for k, v in ROUTING.items() if k in values and (values[k] is None or _larger(values[k], v))})
    if latent:
        changes.update({k: v for k, v in LATENT.items() if k in values})
    changes.update({k: WINDOW for k in WINDOWS if _larger(values.get(k), WINDOW)})
    if values.get("is_decoder") is False:  # a BERT-like family's causal-LM head needs it
        changes["is_decoder"] = True
    if isinstance(values.get("vocab_size"), int) and values["vocab_size"] < TOKENIZER_VOCAB:
        changes["vocab_size"] = TOKENIZER_VOCAB
    changes.update(_fewer_layers(values))
    for name, sub_class in (getattr(config_class, "sub_configs", None) or {}).items():
        sub = getattr(base, name, None)
        if isinstance(sub, transformers.PretrainedConfig):
            changes[name] = _small(type(sub) if sub_class is transformers.AutoConfig else sub_class, sub).to_dict()
    return config_class(**changes)  # the config derives what follows from these (head widths, layer types)


def _larger(value, small) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > small


def _fewer_layers(values: dict) -> dict:
    """At most four layers (more where the default mixes more kinds), keeping the first layer of each combination
    of per-layer values (layer types, MLP types, ...) and cutting every per-layer list alike."""
    count = next((values[k] for k in LAYERS if isinstance(values.get(k), int)), None)
    if not count or count <= 4:
        return {}
    lists = {k: v for k, v in values.items() if isinstance(v, list) and len(v) == count}
    per_layer = {int(k): v for k, v in (values.get("per_layer_config") or {}).items()}  # keys may read "05"
    keep, seen = [], set()
    for i in range(count):
        own = per_layer.get(i)
        combination = json.dumps([lists[k][i] for k in lists] + [own], sort_keys=True, default=str)
        if combination not in seen:
            seen.add(combination)
            keep.append(i)
    keep += [i for i in range(count) if i not in keep][: max(0, 4 - len(keep))]
    keep.sort()
    changes = {k: len(keep) for k in LAYERS if values.get(k) == count}
    changes.update({k: [v[i] for i in keep] for k, v in lists.items()})
    if per_layer:  # a heterogeneous config's own values of some layers (Gemma 4), numbered again and made small
        changes["per_layer_config"] = {new: _small_values(per_layer[old]) for new, old in enumerate(keep)
                                       if old in per_layer}
    return changes


def _small_values(values: dict) -> dict:
    latent = "kv_lora_rank" in values
    return {k: (LATENT[k] if latent and k in LATENT else SMALL[k] if k in SMALL and _larger(v, SMALL[k]) else v)
            for k, v in values.items()}
