import pytest
import torch

from kvviz.engine import models


def test_default_model_card(default_model):
    card = default_model.card
    assert card["name"] == "SmolLM2-135M-Instruct"
    assert card["architecture"] == "LlamaForCausalLM"
    assert (card["num_layers"], card["num_attention_heads"], card["num_kv_heads"], card["head_dim"]) == (30, 9, 3, 64)
    assert card["layer_types"] == ["full_attention"] * 30
    assert card["dtype"] == "float32" and card["device"] == "cpu"
    assert card["kv_bytes_per_token"] == 2 * 3 * 64 * 4 * 30
    assert 130e6 < card["parameters"] < 140e6


def test_damaged_cached_copy_is_detected_and_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    directory = models.ensure_default_model()
    assert models.check_converted(directory) is None
    weights = directory / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:  # same size, corrupted header
        f.seek(9)
        f.write(b"\x00\x00\x00\x00")
    assert "header" in models.check_converted(directory)
    with weights.open("r+b") as f:  # half-written
        f.truncate(size // 2)
    assert "wrong size" in models.check_converted(directory)
    (directory / models.MANIFEST).unlink()
    assert "no manifest" in models.check_converted(directory)
    rebuilt = models.ensure_default_model()
    assert models.check_converted(rebuilt) is None
    assert (rebuilt / "model.safetensors").stat().st_size == size
    loaded = models.load_model("default")
    assert loaded.card["num_layers"] == 30


def test_local_directory_and_gguf_file(tmp_path, default_model):
    directory = models.default_cache_dir()
    assert models.load_model(str(directory)).card["num_layers"] == 30
    gguf = models.default_gguf_path()
    assert models.load_model(str(gguf)).card["architecture"] == "LlamaForCausalLM"


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
