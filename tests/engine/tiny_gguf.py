"""A GGUF file of a tiny random Llama with a byte-level BPE tokenizer of 263 tokens, written with the gguf package: what
the default model's GGUF holds (metadata, a tokenizer, float32 tensors under llama.cpp's names), in 100 KB, so that a
test can convert it in a second instead of the default model's ten or more."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from transformers.convert_slow_tokenizer import bytes_to_unicode

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e"]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def write_tiny_gguf(path: Path, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                    ffn: int = 64, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    pieces = list(bytes_to_unicode().values()) + ["".join(merge.split()) for merge in MERGES]
    tokens = pieces + SPECIAL
    head_dim = hidden // heads

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(pieces) + [3] * len(SPECIAL))  # normal, then control tokens
    writer.add_token_merges(MERGES)
    writer.add_unk_token_id(tokens.index("<|endoftext|>"))
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_tensor("token_embd.weight", weight(len(tokens), hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(hidden, heads * head_dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(ffn, hidden))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(ffn, hidden))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(hidden, ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
