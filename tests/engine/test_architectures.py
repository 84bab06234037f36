"""Every kind of cache layer transformers has, on tiny random models of eighteen families: linear-attention and
state-space layers (a fixed-size state), hybrid layers (both), KV-shared layers, chunked attention (Llama 4), latent
attention and indexed attention. For each: greedy tokens equal plain generate, the bytes kvviz measures equal every
tensor in transformers' own DynamicCache, the prediction from the config equals the measurement at every step, and each
strategy runs exactly or is refused in one sentence that names the layers it cannot handle."""

import pytest
import torch
import transformers
from transformers.models.minimax.modeling_minimax import MiniMaxCache

from kvviz.engine import decode, model_files, strategies
from kvviz.engine.models import build_random_model
from kvviz.errors import OptionError

from .families import ARCHITECTURES, tiny_architecture
from .test_equality import PROMPT, generate_reference, kvviz_tokens

NEW_TOKENS = 4


@pytest.fixture(scope="module")
def architectures(tiny_model):
    """Each family built once for this module."""
    return {name: tiny_architecture(name, tiny_model.tokenizer) for name in ARCHITECTURES}


def own_cache(config):
    """The cache transformers' generate builds for the model: MiniMax's own class, DynamicCache for the others."""
    if config.model_type == "minimax":
        return MiniMaxCache()
    return transformers.DynamicCache(config=config)


def tensor_bytes(cache, model) -> int:
    """Every tensor transformers' cache object holds, walked through its layers' attributes, and every tensor the
    model's modules keep as attributes of their own (RecurrentGemma's recurrent states; parameters and buffers are
    not such attributes). Storages counted once; 0-dimensional bookkeeping such as a layer's window length left
    out."""
    seen, total = set(), 0

    def walk(value):
        nonlocal total
        if isinstance(value, torch.Tensor):
            if value.dim() and value.untyped_storage().data_ptr() not in seen:
                seen.add(value.untyped_storage().data_ptr())
                total += value.untyped_storage().nbytes()
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    for layer in cache.layers:
        walk(vars(layer))
    walk(getattr(cache, "linear_cache", []))  # MiniMax's cache class keeps its linear layers' states beside them
    for module in model.modules():
        walk([value for value in vars(module).values() if isinstance(value, torch.Tensor)])
    return total


@pytest.mark.parametrize("family", sorted(ARCHITECTURES))
def test_dynamic_matches_generate_and_transformers_own_cache(architectures, family):
    loaded = architectures[family]
    ids = decode.encode_prompt(loaded.tokenizer, PROMPT, raw=True)
    tokens, decoder = kvviz_tokens(loaded, "dynamic", {}, NEW_TOKENS)
    assert tokens == generate_reference(loaded, ids, NEW_TOKENS)
    for step in decoder.trace.steps:
        assert step.cache_bytes == step.predicted_cache_bytes, f"step {step.index}"
    # the same tokens through transformers' own DynamicCache, fed as generate feeds them (the prompt, then one token
    # at a time): every tensor it and the model hold, as kvviz measured it
    cache = own_cache(loaded.model.config)
    with torch.inference_mode():
        for fed in [ids] + [[token] for token in tokens[:-1]]:
            loaded.model(input_ids=torch.tensor([fed]), cache=cache, use_cache=True)
    assert decoder.trace.steps[-1].cache_bytes == tensor_bytes(cache, loaded.model) > 0
    kinds = loaded.card["cache_kinds"]
    for kind, layer in zip(kinds, decoder.trace.steps[-1].layers, strict=True):
        assert (layer.state_bytes > 0) == (kind.startswith("state")), kind
        assert (layer.seq_len > 0) == (kind not in ("state", "shared")), kind


def test_the_families_cover_every_kind_of_cache_layer(architectures):
    kinds = {kind for loaded in architectures.values() for kind in loaded.card["cache_kinds"]}
    assert kinds >= {"attention", "sliding", "state", "state+attention", "indexed", "shared"}
    assert any(loaded.card["latent_attention"] for loaded in architectures.values())


SPECS = ["static", "none", "sliding:window=6", "sink:sink_tokens=2:window=4", "quantized:backend=hqq:q_group_size=16",
         "h2o:budget=6", "tova:budget=6", "snapkv:budget=6:window=2", "knorm:budget=6:skip_layers=0"]
# what a refusal names, per family (the layers the strategy cannot handle)
NAMED = {"mamba": "no attention layers", "zamba2": "fixed-size state beside keys and values",
         "glm_moe_dsa": "indexed attention layers", "deepseek_v3": "multi-head latent attention",
         "qwen3_next": "linear-attention or state-space layers"}


@pytest.mark.parametrize("family", sorted(NAMED))
def test_each_strategy_runs_exactly_or_is_refused_by_name(architectures, family):
    loaded = architectures[family]
    ran = []
    for spec in SPECS:
        choice = strategies.parse_spec(spec)
        settings = decode.GenerationSettings(max_new_tokens=3, raw=True, stop_at_eos=False)
        try:
            decoder = decode.Decoder(loaded, choice, settings, PROMPT)
        except OptionError as refused:
            message = str(refused)
            assert NAMED[family] in message and "run dynamic or static" in message, message
            assert "Error" not in message and "\n" not in message
            continue
        for step in decoder:
            assert step.cache_bytes == step.predicted_cache_bytes, f"{spec} step {step.index}"
            assert step.policy_bytes == step.predicted_policy_bytes, f"{spec} step {step.index}"
        ran.append(choice.name)
    assert {"static", "none"} <= set(ran)
    if family == "qwen3_next":  # attention layers beside state layers: every strategy acts on them
        assert set(ran) == {choice.split(":")[0] for choice in SPECS}


def test_a_live_switch_carries_the_state_layers_over(architectures):
    loaded = architectures["qwen3_next"]
    settings = decode.GenerationSettings(max_new_tokens=6, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(loaded, strategies.choose("dynamic"), settings, PROMPT)
    steps = []
    for step in decoder:
        steps.append(step)
        if step.index == 1:
            decoder.request_switch(strategies.parse_spec("h2o:budget=5"))
        if step.index == 3:
            decoder.request_switch(strategies.parse_spec("sliding:window=4"))
    assert [s.strategy for s in steps] == ["dynamic"] * 2 + ["h2o"] * 2 + ["sliding"] * 2
    for step in steps:
        assert step.cache_bytes == step.predicted_cache_bytes, f"step {step.index}"
        assert sum(layer.state_bytes for layer in step.layers) == loaded.card["fixed_state_bytes"]
    hybrid = architectures["zamba2"]
    decoder = decode.Decoder(hybrid, strategies.choose("dynamic"), settings, PROMPT)
    next(iter(decoder))
    with pytest.raises(OptionError, match="fixed-size state beside keys and values; start a new run$"):
        decoder.request_switch(strategies.choose("static"))


def test_a_state_space_model_is_not_refused_as_keeping_nothing():
    mamba = build_random_model(ARCHITECTURES["mamba"]())
    model_files.check_keeps_kv_cache(mamba.eval(), "mamba")  # a state-space model keeps a state: it runs


# what a model that keeps its cache outside transformers' layers says when it refuses every strategy but dynamic, none
OUTSIDE = {"minimax": "keeps its cache in a class of its own whose linear-attention states only its forward pass "
                      "updates; run dynamic or none",
           "recurrent_gemma": "keeps the states of its recurrent layers in its own modules, which kvviz keeps only "
                              "with a DynamicCache; run dynamic or none"}


@pytest.mark.parametrize("family", sorted(OUTSIDE))
def test_a_cache_kept_outside_transformers_layers_runs_none_and_refuses_the_rest(architectures, family):
    """Dynamic runs in `test_dynamic_matches_generate_and_transformers_own_cache`."""
    loaded = architectures[family]
    model_files.check_keeps_kv_cache(loaded.model, family)  # its states are read, not refused
    ran = []
    for spec in SPECS:
        settings = decode.GenerationSettings(max_new_tokens=2, raw=True, stop_at_eos=False)
        try:
            decoder = decode.Decoder(loaded, strategies.parse_spec(spec), settings, PROMPT, reference=True)
        except OptionError as refused:
            assert str(refused).endswith(OUTSIDE[family]), refused
            continue
        for step in decoder:
            assert step.cache_bytes == step.predicted_cache_bytes, f"{spec} step {step.index}"
            assert step.top1_agree, f"{spec} step {step.index}"  # the exact reference runs in its own cache too
        ran.append(spec)
    assert ran == ["none"]


def test_recurrent_states_kept_in_the_modules_never_reach_another_run(architectures):
    """RecurrentGemma reads a one-token prompt through the convolution state its modules hold: a run starts from none
    (as a freshly loaded model does), whatever ran before, and a reference beside it keeps states of its own."""
    from kvviz.engine.conversation import Conversation

    loaded = architectures["recurrent_gemma"]
    settings = decode.GenerationSettings(max_new_tokens=3, raw=True, stop_at_eos=False)

    def one_token_run():
        decoder = decode.Decoder(loaded, strategies.choose("dynamic"), settings, "", prompt_ids=[7], reference=True)
        steps = list(decoder)
        assert all(step.top1_agree and step.cache_bytes == step.predicted_cache_bytes for step in steps)
        return [step.token_id for step in steps]

    first = one_token_run()
    generate_reference(loaded, [9, 8, 7, 6], 3)  # generate leaves its states in the modules
    assert one_token_run() == first
    # each of these would feed more than one token into a cache that holds some: refused by name
    decoder = decode.Decoder(loaded, strategies.choose("dynamic"), settings, PROMPT)
    next(iter(decoder))
    with pytest.raises(OptionError, match="keeps the states of its recurrent layers in its own modules; start a new"):
        decoder.request_switch(strategies.choose("dynamic"))
    with pytest.raises(OptionError, match="reads a feed of more than one token as a new prompt"):
        Conversation(loaded, strategies.choose("dynamic"), settings)


@pytest.mark.parametrize("family", ["bamba", "jamba", "lfm2"])
def test_window_and_eviction_act_on_the_attention_layers_alone(architectures, family):
    loaded = architectures[family]
    kinds, states = loaded.card["cache_kinds"], loaded.card["layer_state_bytes"]
    for spec, kept in (("sliding:window=4", 4), ("sink:sink_tokens=2:window=3", 5), ("h2o:budget=5", 5)):
        settings = decode.GenerationSettings(max_new_tokens=3, raw=True, stop_at_eos=False)
        try:
            steps = list(decode.Decoder(loaded, strategies.parse_spec(spec), settings, PROMPT))
        except OptionError as refused:  # Jamba's attention layers have no rotary embedding to re-rotate
            assert family == "jamba" and spec.startswith("sink"), refused
            assert str(refused).endswith("needs a model with one rotary position embedding (RoPE) to re-rotate kept "
                                         "keys; this model has none")
            continue
        for step in steps:
            assert step.cache_bytes == step.predicted_cache_bytes, f"{spec} step {step.index}"
            seen = step.position + 1
            for kind, state, layer in zip(kinds, states, step.layers, strict=True):
                if kind == "state":  # left to transformers, as it is: the whole state, no positions
                    assert (layer.state_bytes, layer.seq_len) == (state, 0), spec
                else:  # the attention layers keep at most what the strategy keeps, and lose the rest for real
                    assert layer.state_bytes == 0 and layer.seq_len <= kept < seen, spec


# Mamba-1, Mamba-2, gated DeltaNet and Kimi delta attention mixers
@pytest.mark.parametrize("family", ["jamba", "mamba2", "qwen3_next", "kimi_linear"])
def test_bfloat16_states_are_predicted_in_the_dtypes_transformers_keeps_them(tiny_model, family):
    loaded = tiny_architecture(family, tiny_model.tokenizer, dtype=torch.bfloat16)
    tokens, decoder = kvviz_tokens(loaded, "dynamic", {}, 2)  # the prefill and a decode step
    for step in decoder.trace.steps:
        assert step.cache_bytes == step.predicted_cache_bytes, f"step {step.index}"
    cache = transformers.DynamicCache(config=loaded.model.config)
    with torch.inference_mode():
        loaded.model(input_ids=torch.tensor([[5, 6, 7]]), cache=cache, use_cache=True)
    dtypes = {(name, tensor.dtype) for layer in cache.layers for name in ("conv_states", "recurrent_states")
              for tensor in getattr(layer, name, {}).values() if isinstance(tensor, torch.Tensor)}
    # the convolution state in the model's dtype, the recurrent state in float32
    assert dtypes == {("conv_states", torch.bfloat16), ("recurrent_states", torch.float32)}


def test_minimax_keeps_its_linear_states_in_the_models_dtype(tiny_model):
    loaded = tiny_architecture("minimax", tiny_model.tokenizer, dtype=torch.bfloat16)
    tokens, decoder = kvviz_tokens(loaded, "dynamic", {}, 2)  # the prefill and a decode step
    for step in decoder.trace.steps:
        assert step.cache_bytes == step.predicted_cache_bytes, f"step {step.index}"
    cache = own_cache(loaded.model.config)
    with torch.inference_mode():
        loaded.model(input_ids=torch.tensor([[5, 6, 7]]), cache=cache, use_cache=True)
        loaded.model(input_ids=torch.tensor([[8]]), cache=cache, use_cache=True)
    assert {t.dtype for t in cache.linear_cache if isinstance(t, torch.Tensor)} == {torch.bfloat16}


@pytest.mark.parametrize("family", ["minimax", "qwen3_next"])
def test_a_cache_with_fixed_size_states_refuses_to_be_cropped(architectures, family):
    """A state cannot be wound back to an earlier token (a conversation prefills again instead): MiniMax keeps its
    states beside its layers, a hybrid in layers of their own; the attention layers alone would crop."""
    from kvviz.engine.cache_run import CacheRun

    loaded = architectures[family]
    run = CacheRun(loaded.model, strategies.choose("dynamic"), 16)
    with torch.inference_mode():
        run.forward(torch.tensor([[1, 2, 3, 4]]))
    assert run.crop_refusal() is not None and "cannot be cropped" in run.crop_refusal()
