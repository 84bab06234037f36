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


# -- every kind of cache layer transformers has (kvviz.engine.geometry.CACHE_KINDS) ------------------------------
# Smaller still (hidden 64, 2-4 layers): each is built once per test module. The default model's tokenizer needs
# its vocabulary.
SMALL = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, eos_token_id=2, bos_token_id=1, pad_token_id=2)
MLA = dict(SMALL, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
           v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
           n_group=1, topk_group=1)
MAMBA2 = dict(mamba_d_state=8, mamba_n_groups=1, mamba_expand=2)
GATED_DELTA = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)

ARCHITECTURES = {
    # linear attention (gated DeltaNet) beside full attention
    "qwen3_next": lambda: transformers.Qwen3NextConfig(
        **SMALL, num_hidden_layers=4, head_dim=16, **GATED_DELTA, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "qwen3_5": lambda: transformers.Qwen3_5TextConfig(**SMALL, num_hidden_layers=4, head_dim=16, **GATED_DELTA),
    "olmo_hybrid": lambda: transformers.OlmoHybridConfig(**SMALL, num_hidden_layers=4, **GATED_DELTA),
    # Kimi delta attention (per-channel decay) beside latent attention
    "kimi_linear": lambda: transformers.KimiLinearConfig(
        **MLA, num_hidden_layers=4, num_local_experts=4, linear_num_heads=2, linear_head_dim=8,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
    # Mamba mixers beside attention
    "jamba": lambda: transformers.JambaConfig(
        **SMALL, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
        expert_layer_offset=1, num_experts=2, num_experts_per_tok=1, mamba_d_state=8, use_mamba_kernels=False),
    "bamba": lambda: transformers.BambaConfig(
        **SMALL, num_hidden_layers=4, attn_layer_indices=[1, 3], mamba_n_heads=4, mamba_d_head=32, **MAMBA2),
    "granitemoehybrid": lambda: transformers.GraniteMoeHybridConfig(
        **SMALL, num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "attention"], mamba_n_heads=8,
        mamba_d_head=16, **MAMBA2, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64),
    # a layer that keeps a state and keys and values at once
    "zamba2": lambda: transformers.Zamba2Config(
        **SMALL, num_hidden_layers=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], mamba_headdim=16,
        n_mamba_heads=8, mamba_d_state=8, use_mem_eff_path=False),
    "falcon_h1": lambda: transformers.FalconH1Config(
        **SMALL, num_hidden_layers=2, head_dim=16, mamba_n_heads=8, mamba_d_head=16, mamba_d_ssm=128, **MAMBA2),
    # a short convolution: a state without a recurrent part
    "lfm2": lambda: transformers.Lfm2Config(
        **SMALL, num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "full_attention"]),
    # lightning attention beside softmax attention, in MiniMax's own cache class
    "minimax": lambda: transformers.MiniMaxConfig(
        **SMALL, num_hidden_layers=4, head_dim=16, num_local_experts=2, num_experts_per_tok=1, block_size=8),
    # recurrent blocks (RG-LRU) that keep their states in their own modules, beside local (sliding) attention
    "recurrent_gemma": lambda: transformers.RecurrentGemmaConfig(
        **SMALL, num_hidden_layers=3, attention_window_size=6),
    # state-space models without attention
    "mamba": lambda: transformers.MambaConfig(
        vocab_size=49152, hidden_size=64, state_size=8, num_hidden_layers=2, use_mambapy=False, eos_token_id=2,
        bos_token_id=1, pad_token_id=2),
    "mamba2": lambda: transformers.Mamba2Config(
        vocab_size=49152, hidden_size=64, state_size=8, num_hidden_layers=2, num_heads=8, head_dim=16, n_groups=1,
        eos_token_id=2, bos_token_id=1, pad_token_id=2),
    # KV-shared layers (the last two read the keys and values of earlier ones)
    "gemma3n": lambda: transformers.Gemma3nTextConfig(
        **SMALL, num_hidden_layers=4, head_dim=16, num_kv_shared_layers=2, laurel_rank=8,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=128, altup_num_inputs=2, sliding_window=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        activation_sparsity_pattern=[0.0] * 4),
    # chunked attention (Llama 4): transformers caches a chunked layer as a sliding one whose window is the chunk
    "llama4": lambda: transformers.Llama4TextConfig(
        **SMALL, num_hidden_layers=4, head_dim=16, attention_chunk_size=6, num_local_experts=2,
        intermediate_size_mlp=128),
    # multi-head latent attention, and latent attention with indexer keys
    "deepseek_v3": lambda: transformers.DeepseekV3Config(**MLA, num_hidden_layers=2),
    "glm_moe_dsa": lambda: transformers.GlmMoeDsaConfig(**MLA, num_hidden_layers=2, index_n_heads=2,
                                                       index_head_dim=16, index_topk=8),
}


def tiny_architecture(name: str, tokenizer, dtype=None) -> LoadedModel:
    model = build_random_model(ARCHITECTURES[name](), **({"dtype": dtype} if dtype else {}))
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, card=model_card(model, f"tiny-{name}"), spec=name)


# -- encoder-decoders (text to text): T5 and BART, two layers each --------------------------------------------------
# eos out of reach of a random model's greedy picks, so that generate's min_new_tokens changes nothing
SEQ2SEQ = dict(vocab_size=49152, d_model=64, eos_token_id=49151, pad_token_id=0, forced_eos_token_id=None)
ENCODER_DECODERS = {
    "t5": lambda: transformers.T5Config(**SEQ2SEQ, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                        decoder_start_token_id=0),
    "bart": lambda: transformers.BartConfig(**SEQ2SEQ, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                            max_position_embeddings=256, decoder_start_token_id=2),
}


def tiny_encoder_decoder(name: str, tokenizer) -> LoadedModel:
    model = build_random_model(ENCODER_DECODERS[name]())
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, card=model_card(model, f"tiny-{name}"), spec=name)
