"""The shape of a model's KV cache, read from its config in one place.

Most layers cache keys and values of shape ``[batch, kv_heads, tokens, head_dim]`` in the model's dtype; layers of
sliding-window attention keep at most `window` tokens. Models of 2026 mix in other kinds of layer, each cached by a
layer class of transformers' own (`cache_utils.py`), chosen from the config's layer types:

- ``state``: a linear-attention or state-space layer (Mamba, gated DeltaNet, LFM2's short convolution) keeps a
  convolution state and a recurrent state of fixed size, whatever the context (`LinearAttentionLayer`);
- ``state+attention`` / ``state+sliding``: both in one layer (`LinearAttentionAnd...AttentionLayer`);
- ``indexed``: attention with a lightning indexer (GLM-MoE-DSA, DeepSeek-V3.2) also keeps the indexer's keys
  ``[batch, tokens, index_head_dim]`` (`DynamicIndexedLayer`);
- ``shared``: a layer that reads the keys and values of an earlier layer (Gemma 3n) keeps nothing of its own;
  ``none``: a layer without attention (an MLP-only layer) keeps nothing either (`DummyLayer`).

An encoder-decoder (T5, BART) caches, per decoder layer, self-attention keys and values that grow with the tokens
generated and cross-attention keys and values of the encoder's output, fixed once the prompt is read (the kind
``attention+cross``, in transformers' `EncoderDecoderCache`).

Multi-head latent attention (DeepSeek-V2/V3, Kimi, GLM-MoE-DSA) caches its compressed latent: keys
``[batch, 1, tokens, kv_lora_rank]`` and the shared rotary part as values ``[batch, 1, tokens, qk_rope_head_dim]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SLIDING_TYPES = ("sliding_attention", "chunked_attention")

# transformers' cache layer types (`cache_utils.get_layer_types_and_kwargs`) -> what kvviz calls them
CACHE_KINDS = {
    "full_attention": "attention",
    "sliding_attention": "sliding",
    "chunked_attention": "sliding",
    "indexed_attention": "indexed",
    "conv": "state",
    "linear_attention": "state",
    "hybrid": "state+attention",
    "hybrid_sliding": "state+sliding",
    "dummy": "shared",
}
# kinds with keys and values
KEEPS_TOKENS = ("attention", "sliding", "indexed", "state+attention", "state+sliding", "attention+cross")
HAS_STATE = ("state", "state+attention", "state+sliding")  # kinds with a fixed-size state
# every kind kvviz has a size rule for: those above, KV-shared layers, layers without attention, and cross-attention
# layers of an image model, which keep nothing of a text's tokens
KNOWN_KINDS = (*KEEPS_TOKENS, *HAS_STATE, "shared", "none", "image")


def text_config(config):
    """The decoder's own config (multimodal configs nest it)."""
    return config.get_text_config(decoder=True)


def layer_types(config) -> list[str]:
    """Per decoder layer: "full_attention", "sliding_attention", ... as the config declares or implies."""
    config = text_config(config)
    declared = getattr(config, "layer_types", None)
    if declared:
        return list(declared)
    kind = "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"
    return [kind] * config.num_hidden_layers


def decoder_shape(config) -> tuple[int, int, int]:
    """(layers, attention heads, head_dim) of an encoder-decoder's decoder (T5 names them num_decoder_layers,
    num_heads, d_kv; BART decoder_layers, decoder_attention_heads)."""
    layers = getattr(config, "num_decoder_layers", None) or getattr(config, "decoder_layers", None)
    heads = getattr(config, "decoder_attention_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "d_kv", None) or (getattr(config, "d_model", None) or config.hidden_size) // heads
    return layers or config.num_hidden_layers, heads, head_dim


def cache_kinds(config) -> list[str]:
    """Per decoder layer, what its cache layer keeps (`CACHE_KINDS`), as transformers' DynamicCache builds it; a
    layer type kvviz does not know keeps transformers' name (`Geometry.unknown` then says so)."""
    return [kind for kind, _ in cache_layers(config)]


def cache_layers(config) -> list[tuple[str, int | None]]:
    """Per decoder layer: its kind (`cache_kinds`) and the window its cache layer keeps, None where it keeps every
    token. transformers caches a chunked-attention layer (Llama 4) as a sliding one whose window is the attention
    chunk (`attention_chunk_size`): it keeps the last chunk - 1 tokens, as a sliding layer keeps window - 1."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    if config.is_encoder_decoder:
        return [("attention+cross", None)] * decoder_shape(config)[0]
    text = text_config(config)
    types, kwargs = get_layer_types_and_kwargs(text)
    declared = layer_types(config)
    cross = set(getattr(text, "cross_attention_layers", None) or ())
    layers = []
    for i, (cache_type, declared_type, options) in enumerate(zip(types, declared, kwargs, strict=False)):
        if cache_type == "dummy" and declared_type in ("moe", "mlp"):
            kind = "none"
        elif i in cross:  # Mllama's: they attend to an image's keys and values, none of a text's own tokens
            kind = "image"
        else:
            kind = CACHE_KINDS.get(cache_type, cache_type)
        layers.append((kind, options.get("sliding_window") if kind.endswith("sliding") else None))
    return layers


# transformers' PyTorch implementations of every linear-attention and state-space mixer (gated DeltaNet, Kimi delta
# attention, Mamba 1 and 2) compute the recurrent state in float32 and cache it so, whatever the model's dtype (measured
# under bfloat16: `tests/engine/test_architectures.py`); the convolution state keeps the model's dtype
RECURRENT_STATE_ELEMENT = 4


def state_bytes(config, element: int) -> int | None:
    """Bytes of the fixed-size state of one linear-attention or state-space layer (convolution state in the model's
    dtype of `element` bytes, recurrent state in float32; batch 1), from the config. None where kvviz knows no
    formula for the config's mixer."""
    c = text_config(config)
    if c.model_type == "minimax":  # lightning attention: K^T V per head, kept in the model's dtype (`own_caches`)
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return c.num_attention_heads * head_dim * head_dim * element
    sizes = state_elements(config)
    if sizes is None:
        return None
    conv, recurrent = sizes
    return conv * element + recurrent * RECURRENT_STATE_ELEMENT


def step_state_bytes(config, element: int) -> int:
    """Bytes one state layer's allocation holds beyond `state_bytes` after a one-token feed (batch 1): RecurrentGemma
    keeps its convolution state as a view into the conv1d_width columns it convolved, one column more than it keeps;
    0 for every other mixer."""
    c = text_config(config)
    return c.lru_width * element if c.model_type == "recurrent_gemma" else 0


def state_elements(config) -> tuple[int, int] | None:
    """(convolution state, recurrent state) elements of one linear-attention or state-space layer: one formula per
    family of mixer, as its transformers module sizes it; None for a mixer kvviz knows no formula for."""
    c = text_config(config)
    get = lambda name, default=None: getattr(c, name, default)  # noqa: E731 - short reads of optional fields
    if get("linear_key_head_dim"):  # gated DeltaNet (Qwen3-Next, Qwen3.5, OLMo-hybrid): q, k, v convolved
        key_dim = c.linear_num_key_heads * c.linear_key_head_dim
        value_dim = c.linear_num_value_heads * c.linear_value_head_dim
        conv = (2 * key_dim + value_dim) * c.linear_conv_kernel_dim
        return conv, c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
    if get("linear_head_dim") and get("linear_num_heads"):  # Kimi delta attention
        width = c.linear_num_heads * c.linear_head_dim
        return 3 * width * c.linear_conv_kernel_dim, c.linear_num_heads * c.linear_head_dim**2
    if get("conv_L_cache"):  # LFM2's short convolution: no recurrent state
        return c.hidden_size * c.conv_L_cache, 0
    if get("mamba_d_state"):  # Mamba mixers inside hybrids (Jamba, Bamba, Granite 4, Zamba2, Falcon-H1)
        inner = get("mamba_d_ssm") or int(c.mamba_expand * c.hidden_size)
        heads = get("mamba_n_heads") or get("n_mamba_heads")
        if not heads:  # Mamba-1 (Jamba): one state per channel
            return inner * c.mamba_d_conv, inner * c.mamba_d_state
        groups = get("mamba_n_groups") or get("mamba_ngroups") or 1
        head_dim = get("mamba_d_head") if isinstance(get("mamba_d_head"), int) else get("mamba_headdim")
        return (inner + 2 * groups * c.mamba_d_state) * c.mamba_d_conv, heads * head_dim * c.mamba_d_state
    if c.model_type == "recurrent_gemma":  # RG-LRU: conv1d_width - 1 columns convolved, one state per channel
        return c.lru_width * (c.conv1d_width - 1), c.lru_width
    if get("mamba_num_heads") and get("ssm_state_size"):  # Mamba-2 mixers named so (Nemotron-H)
        inner = c.mamba_num_heads * c.mamba_head_dim
        conv = (inner + 2 * c.n_groups * c.ssm_state_size) * c.conv_kernel
        return conv, inner * c.ssm_state_size
    if c.model_type in ("mamba", "falcon_mamba"):
        return c.intermediate_size * c.conv_kernel, c.intermediate_size * c.state_size
    if c.model_type == "mamba2":
        inner = int(c.expand * c.hidden_size)
        return (inner + 2 * c.n_groups * c.state_size) * c.conv_kernel, c.num_heads * c.head_dim * c.state_size
    return None


def attention_widths(layer, kind: str) -> tuple[int, int, int]:
    """(KV heads, key width, value width) one token adds to an attention layer of `kind`, from that layer's config
    (`config.per_layer_config[i]`, which differs from layer to layer in heterogeneous models such as Gemma 4)."""
    get = lambda name, default=None: getattr(layer, name, default)  # noqa: E731 - short reads of optional fields
    heads = get("num_attention_heads") or 0  # 0: a pure state-space model (Mamba)
    kv_heads = get("num_key_value_heads") or heads
    if get("new_decoder_architecture") is not None:  # Falcon: every head (new), one (multi-query) or num_kv_heads
        kv_heads = heads if layer.new_decoder_architecture else 1 if layer.multi_query else layer.num_kv_heads
    if get("model_type") == "mimo_v2_flash" and kind.endswith("sliding"):
        kv_heads *= 2  # its modeling code doubles the KV heads of sliding-window layers, which its config does not say
    head_dim = get("head_dim") or (layer.hidden_size // heads if heads else 0)
    return kv_heads, head_dim, get("v_head_dim") or head_dim  # values may be narrower than keys (MiMo-V2-Flash)


def indexer_layers(config, kinds: list[str]) -> list[bool]:
    """Per layer, whether it keeps indexer keys: every indexed layer, except those a config's `indexer_types` marks
    "shared" (they reuse the last full indexer's, HY-V4)."""
    declared = getattr(text_config(config), "indexer_types", None)
    return [kind == "indexed" and (declared is None or declared[i] == "full") for i, kind in enumerate(kinds)]


def latent_widths(config) -> tuple[int, int] | None:
    """(kv_lora_rank, qk_rope_head_dim) of multi-head latent attention, or None for other attention."""
    c = text_config(config)
    rank, rope = getattr(c, "kv_lora_rank", None), getattr(c, "qk_rope_head_dim", None)
    return (rank, rope) if rank and rope else None


@dataclass(frozen=True)
class Geometry:
    """What sizes every layer's cache: [batch, kv_heads, tokens, head_dim] of `element` bytes, and per layer its
    kind, the bytes one token adds to it and the bytes of its fixed state."""

    num_layers: int
    num_attention_heads: int
    kv_heads: int
    head_dim: int
    element: int
    windows: tuple[int | None, ...]  # per layer: its sliding window, None for full attention
    layer_types: tuple[str, ...]
    context: int | None  # the positions the model was built for (max_position_embeddings), None if unsaid
    kinds: tuple[str, ...] = ()  # per layer: `CACHE_KINDS` (empty: every layer plain attention)
    layer_token_bytes: tuple[int, ...] = ()  # per layer: keys + values (+ indexer keys) one token adds
    layer_state_bytes: tuple[int | None, ...] = ()  # per layer: its fixed state (0: none; None: no formula)
    layer_step_state_bytes: tuple[int, ...] = ()  # per layer: what its state holds beyond that after a one-token feed
    latent: tuple[int, int] | None = None  # multi-head latent attention's (kv_lora_rank, qk_rope_head_dim)
    encoder_decoder: bool = False  # every layer also keeps cross-attention keys and values of the encoder's output
    unknown: str | None = None  # why the cache's size cannot be predicted from the config (None: it can)
    batch: int = 1

    @classmethod
    def of(cls, config, dtype: torch.dtype) -> Geometry:
        if config.is_encoder_decoder:
            return cls.of_encoder_decoder(config, dtype)
        text = text_config(config)
        layers = cache_layers(config)
        kinds = [kind for kind, _ in layers]
        element = torch.empty((), dtype=dtype).element_size()
        widths = [attention_widths(layer, kind) for layer, kind in zip(text.per_layer_config, kinds, strict=False)]
        first = next((w for w, kind in zip(widths, kinds, strict=False) if kind in KEEPS_TOKENS), widths[0])
        latent = latent_widths(config)
        indexer = getattr(text, "index_head_dim", 0) or 0
        indexed = indexer_layers(config, kinds)
        state = state_bytes(config, element) if any(kind in HAS_STATE for kind in kinds) else 0
        token_bytes = []
        for kind, (kv_heads, key_dim, value_dim), has_indexer in zip(kinds, widths, indexed, strict=False):
            per_token = kv_heads * (key_dim + value_dim) if latent is None else sum(latent)
            per_token += indexer if has_indexer else 0
            token_bytes.append(per_token * element if kind in KEEPS_TOKENS else 0)
        unknown = [kind for kind in kinds if kind not in KNOWN_KINDS]
        return cls(
            num_layers=text.num_hidden_layers,
            num_attention_heads=getattr(text.per_layer_config[0], "num_attention_heads", None) or 0,
            kv_heads=first[0],
            head_dim=first[1],
            element=element,
            windows=tuple(window for _, window in layers),
            layer_types=tuple(layer_types(config)),
            context=getattr(text, "max_position_embeddings", None) or None,
            kinds=tuple(kinds),
            layer_token_bytes=tuple(token_bytes),
            layer_state_bytes=tuple(state if kind in HAS_STATE else 0 for kind in kinds),
            layer_step_state_bytes=tuple(step_state_bytes(config, element) if kind in HAS_STATE else 0
                                         for kind in kinds),
            latent=latent,
            unknown=f"layers kvviz has no size rule for ({', '.join(dict.fromkeys(unknown))})" if unknown else None,
        )

    @classmethod
    def of_encoder_decoder(cls, config, dtype: torch.dtype) -> Geometry:
        layers, heads, head_dim = decoder_shape(config)
        element = torch.empty((), dtype=dtype).element_size()
        return cls(
            num_layers=layers,
            num_attention_heads=heads,
            kv_heads=heads,
            head_dim=head_dim,
            element=element,
            windows=(None,) * layers,
            layer_types=("full_attention",) * layers,
            context=getattr(config, "max_position_embeddings", None) or None,
            kinds=("attention+cross",) * layers,
            layer_token_bytes=(2 * heads * head_dim * element,) * layers,
            layer_state_bytes=(0,) * layers,
            layer_step_state_bytes=(0,) * layers,
            encoder_decoder=True,
        )

    def cross_bytes(self, encoder_tokens: int) -> int:
        """Cross-attention keys and values of every layer once the encoder has read `encoder_tokens` tokens (0 for
        a decoder-only model): what attending to the encoder's output costs, fixed for the rest of the run."""
        return self.batch * encoder_tokens * sum(self.layer_token_bytes) if self.encoder_decoder else 0

    @property
    def hybrid(self) -> bool:
        """True when some layers use sliding-window attention."""
        return any(w is not None for w in self.windows)

    @property
    def plain(self) -> bool:
        """True when every layer keeps keys and values of [kv_heads, head_dim] per token and nothing else."""
        return all(kind in ("attention", "sliding") for kind in self.kinds) and self.latent is None

    def unusual_layers(self, accepted: tuple[str, ...] = (), latent: bool = False) -> str | None:
        """The layers that are not plain keys and values, in words ("linear-attention or state-space layers"), or
        None: what a strategy that only knows keys and values names when it refuses; `accepted` kinds and, with
        `latent`, latent attention are left out."""
        words = {
            "state": "linear-attention or state-space layers (a fixed-size state)",
            "state+attention": "layers that keep a fixed-size state beside keys and values",
            "state+sliding": "layers that keep a fixed-size state beside keys and values",
            "indexed": "indexed attention layers (indexer keys beside keys and values)",
            "shared": "layers that share another layer's keys and values",
            "none": "layers without attention",
            "image": "cross-attention layers that read an image's keys and values",
            "attention+cross": "an encoder-decoder's cross-attention (keys and values of the encoder's output)",
        }
        found = [words[kind] for kind in dict.fromkeys(self.kinds) if kind in words and kind not in accepted]
        if self.latent is not None and not latent:
            found.append("multi-head latent attention (a compressed latent in place of per-head keys and values)")
        return ", ".join(dict.fromkeys(found)) or None

    @property
    def values_per_token(self) -> int:
        """Key (or value) elements of one token in one plain layer."""
        return self.kv_heads * self.head_dim

    @property
    def token_bytes(self) -> int:
        """Keys or values of one token in one plain layer."""
        return self.batch * self.values_per_token * self.element

    @property
    def kv_bytes_per_token(self) -> int:
        """Everything one token adds to the cache across all layers (keys, values, indexer keys)."""
        return self.batch * sum(self.layer_token_bytes)

    @property
    def fixed_state_bytes(self) -> int | None:
        """Bytes of every layer's fixed-size state together (None: some layer's is not known)."""
        if any(b is None for b in self.layer_state_bytes):
            return None
        return self.batch * sum(self.layer_state_bytes)
