import json
import shutil

import pytest
import torch
import transformers

from kvviz.engine import model_cache, model_files, models
from tests.engine.tiny_gguf import write_tiny_gguf


def test_default_model_card(default_model):
    card = default_model.card
    assert card["name"] == "SmolLM2-135M-Instruct"
    assert card["architecture"] == "LlamaForCausalLM"
    assert (card["num_layers"], card["num_attention_heads"], card["num_kv_heads"], card["head_dim"]) == (30, 9, 3, 64)
    assert card["layer_types"] == ["full_attention"] * 30
    assert card["dtype"] == "float32" and card["device"] == "cpu"
    assert card["kv_bytes_per_token"] == 2 * 3 * 64 * 4 * 30
    assert 130e6 < card["parameters"] < 140e6


def test_local_directory_and_gguf_file(tmp_path, default_model):
    directory = model_cache.default_cache_dir()
    assert models.load_model(str(directory)).card["num_layers"] == 30
    # a GGUF of two layers, read in a second (the default model's 4-bit GGUF goes through the same load_gguf in every
    # conversion of test_model_cache)
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    card = models.load_model(str(gguf)).card
    assert card["architecture"] == "LlamaForCausalLM" and card["num_layers"] == 2
    assert card["weights"] == "tiny.gguf: GGUF weights, de-quantized to float32"


def test_dtype_option(tiny_model):
    loaded = models.load_model("tiny", dtype="bfloat16")
    assert loaded.model.dtype == torch.bfloat16
    assert loaded.card["kv_bytes_per_token"] == tiny_model.card["kv_bytes_per_token"] // 2


@pytest.mark.parametrize(
    "spec,message",
    [
        ("/no/such/dir", "neither a model directory nor a .gguf file"),
        ("missing.gguf", "GGUF file 'missing.gguf' does not exist"),
        ("someone/some-model", "Pass a local model directory or a .gguf file instead"),
    ],
)
def test_unloadable_specs_explain_themselves(spec, message):
    with pytest.raises(models.ModelError, match=message):
        models.load_model(spec)


def test_bad_dtype_and_device():
    with pytest.raises(models.ModelError, match="unknown dtype 'float8'; accepted: auto, float32"):
        models.load_model("tiny", dtype="float8")
    if not torch.cuda.is_available():
        with pytest.raises(models.ModelError, match="no CUDA device; use --device cpu"):
            models.load_model("tiny", device="cuda")


# -- folders kvviz cannot run are refused before any weights are read -------------------------------

TOKENIZER = ("tokenizer.json", "tokenizer_config.json")
SMALL = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_attention_heads=2)


def model_folder(directory, config, *, tokenizer_from=None):
    """A folder as save_pretrained writes it: a random model of `config`, with the default model's
    tokenizer files when `tokenizer_from` is given."""
    with model_files.quiet_transformers():
        if isinstance(config, transformers.BertConfig):  # an encoder saved as such, as users do
            transformers.BertModel(config).save_pretrained(directory)
        elif config.is_encoder_decoder:
            transformers.AutoModelForSeq2SeqLM.from_config(config).save_pretrained(directory)
        else:
            models.build_random_model(config).save_pretrained(directory)
    for name in TOKENIZER if tokenizer_from else ():
        shutil.copy(tokenizer_from / name, directory / name)
    return directory


def refusal(directory):
    with pytest.raises(models.ModelError) as refused:
        models.load_model(str(directory))
    return str(refused.value)


def test_an_empty_folder_says_what_a_model_folder_holds(tmp_path):
    message = refusal(tmp_path)
    assert message.startswith(f"{tmp_path} is empty: a model folder holds config.json, the weights (model.safetensors")
    assert "the tokenizer files (one of tokenizer.json, tokenizer.model, vocab.json" in message
    assert "sentencepiece or tiktoken installed" not in message


def test_an_incomplete_folder_names_what_is_missing(tmp_path, converted_copy):
    llama = model_folder(tmp_path / "llama", transformers.LlamaConfig(num_hidden_layers=2, **SMALL))
    assert refusal(llama).startswith(
        f"{llama} is not a complete model folder: missing tokenizer files (tokenizer.json, tokenizer.model, "
    )
    tokenizer_only = tmp_path / "tokenizer-only"
    tokenizer_only.mkdir()
    for name in TOKENIZER:
        shutil.copy(converted_copy / name, tokenizer_only / name)
    assert refusal(tokenizer_only).startswith(
        f"{tokenizer_only} is not a complete model folder: missing config.json and weights (model.safetensors or "
    )


def test_an_encoder_is_refused_with_the_reason(tmp_path):
    bert = model_folder(tmp_path, transformers.BertConfig(num_hidden_layers=2, **SMALL))
    assert refusal(bert) == (
        f"{bert} is BertModel, an encoder (its config says is_decoder: false): it reads a whole text at once "
        "and keeps no KV cache; kvviz needs a decoder-only causal language model"
    )


def test_a_text_to_text_folder_runs_and_a_speech_one_is_refused_with_the_reason(tmp_path, converted_copy):
    from tests.commands import kvviz

    config = transformers.BartConfig(
        vocab_size=49152, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
    )
    bart = model_folder(tmp_path / "bart", config, tokenizer_from=converted_copy)
    ran = kvviz("run", "--model", bart, "--prompt", "Summarise this.", "--raw", "--max-new-tokens", 3, "--ignore-eos",
                "--json", "--no-trace")
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)
    # 256 bytes per token (1 layer x 2 heads x 16 x keys and values x 4 bytes): cross-attention keeps the prompt's
    # tokens, self-attention the decoder's start token and the two new tokens fed back
    assert summary["final_cache_bytes"] == (summary["prompt_tokens"] + summary["new_tokens"]) * 256
    whisper = tmp_path / "whisper"
    transformers.WhisperConfig(d_model=32, encoder_layers=1, decoder_layers=1,
                               architectures=["WhisperForConditionalGeneration"]).save_pretrained(whisper)
    (whisper / "model.safetensors").write_bytes(b"")  # never read: the config already says no
    (whisper / "tokenizer.json").write_text("{}")
    assert refusal(whisper).startswith(
        f"{whisper} is WhisperForConditionalGeneration, a speech encoder-decoder: its encoder reads audio features"
    )


def test_a_model_type_without_a_causal_head_is_refused(tmp_path):
    transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the config already says no
    (tmp_path / "tokenizer.json").write_text("{}")
    assert refusal(tmp_path).startswith(
        f"{tmp_path} is vit: transformers has no causal language-model head for model_type 'vit'"
    )


def test_a_state_space_model_loads_with_its_fixed_state(tmp_path, converted_copy):
    mamba = model_folder(
        tmp_path, transformers.MambaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2),
        tokenizer_from=converted_copy,
    )
    card = models.load_model(str(mamba)).card
    assert card["cache_kinds"] == ["state", "state"] and card["kv_bytes_per_token"] == 0
    assert card["fixed_state_bytes"] == 2 * 64 * (4 + 16) * 4  # per layer: conv [64, 4] + recurrent [64, 16], fp32


def test_a_damaged_or_unknown_config_is_named(tmp_path, converted_copy):
    llama = model_folder(
        tmp_path, transformers.LlamaConfig(num_hidden_layers=2, **SMALL), tokenizer_from=converted_copy
    )
    assert models.load_model(str(llama)).card["num_layers"] == 2  # complete, a decoder: it loads
    config = llama / "config.json"
    text = config.read_text()
    config.write_bytes(b"\xff" * len(text))
    assert refusal(llama) == f"{config} is not valid JSON: it should be the config.json save_pretrained writes"
    config.write_text(text.replace('"model_type": "llama"', '"model_type": "no-such-model"'))
    assert refusal(llama).startswith(
        f"{config} has model_type 'no-such-model', which transformers {transformers.__version__} cannot read"
    )
