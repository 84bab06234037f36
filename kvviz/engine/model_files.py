"""Read a model from files: a Hugging Face model folder, a GGUF file or a hub id.

Everything kvviz cannot run is refused here, before any weights are read where the files or the
config already tell: an empty or incomplete folder (naming what is missing), a folder without a
tokenizer, an encoder, a speech encoder-decoder, a model type with no causal language-model head. Text-to-text
encoder-decoders (T5, BART) load as such. A model that loads is refused if one forward pass keeps nothing in
transformers' cache.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    PreTrainedModel,
)
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES,
)
from transformers.utils import (
    CONFIG_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

from kvviz.engine.forward import model_forward
from kvviz.errors import ModelError

Progress = Callable[[str, "float | None"], None]

WEIGHT_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
# The files a tokenizer is built from (fast tokenizers, sentencepiece, BPE, WordPiece, tiktoken,
# Mistral's tekken); tokenizer_config.json alone only configures one of these.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tekken.json",
)
WHAT_A_FOLDER_HOLDS = (
    f"{CONFIG_NAME}, the weights ({', '.join(WEIGHT_FILES)}) and the tokenizer files "
    f"(one of {', '.join(TOKENIZER_FILES)}, or *.tiktoken): what model.save_pretrained(DIR) "
    "and tokenizer.save_pretrained(DIR) write"
)


def no_progress(message: str, fraction: float | None) -> None:
    pass


@contextlib.contextmanager
def quiet_transformers():
    """transformers logs warnings and progress bars to stderr; the app reports progress itself."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.logging.enable_progress_bar()


# -- a model folder --------------------------------------------------------------------------------


def missing_files(directory: Path) -> list[str]:
    """What a model folder lacks, in words; empty when config, weights and tokenizer are there."""
    names = {p.name for p in directory.iterdir()}
    missing = []
    if CONFIG_NAME not in names:
        missing.append(CONFIG_NAME)
    if not names.intersection(WEIGHT_FILES):
        missing.append(f"weights ({' or '.join(WEIGHT_FILES)})")
    if not names.intersection(TOKENIZER_FILES) and not any(n.endswith(".tiktoken") for n in names):
        missing.append("tokenizer files (" + ", ".join(TOKENIZER_FILES) + " or *.tiktoken)")
    return missing


def read_config(directory: Path):
    """The folder's transformers config, or a ModelError that says what is wrong with config.json."""
    path = directory / CONFIG_NAME
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise ModelError(f"{path} is not valid JSON: it should be the config.json save_pretrained writes") from None
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror}") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if not isinstance(model_type, str):
        raise ModelError(f"{path} names no model_type: it should be the config.json save_pretrained writes")
    try:
        with quiet_transformers():
            return AutoConfig.from_pretrained(directory)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise ModelError(
            f"{path} has model_type {model_type!r}, which transformers {transformers.__version__} cannot read; "
            "kvviz runs the model types transformers knows (llama, qwen2, gemma3, gpt2, ...)"
        ) from exc


def check_runnable(config, where: str) -> None:
    """Refuse configs that are not decoder-only causal language models, with the reason."""
    model_type = config.model_type
    kind = ", ".join(config.architectures or []) or model_type
    if config.is_encoder_decoder and model_type in MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES:
        raise ModelError(
            f"{where} is {kind}, a speech encoder-decoder: its encoder reads audio features, not text, and kvviz "
            "feeds text prompts; kvviz runs text decoders and text-to-text encoder-decoders (T5, BART)"
        )
    if config.is_encoder_decoder and model_type not in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        raise ModelError(
            f"{where} is {kind}, an encoder-decoder without a text-to-text head in transformers: kvviz runs text "
            "decoders and text-to-text encoder-decoders (T5, BART)"
        )
    if config.is_encoder_decoder:
        return
    if getattr(config, "is_decoder", True) is False:
        raise ModelError(
            f"{where} is {kind}, an encoder (its config says is_decoder: false): it reads a whole text at once "
            "and keeps no KV cache; kvviz needs a decoder-only causal language model"
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelError(
            f"{where} is {kind}: transformers has no causal language-model head for model_type {model_type!r}, "
            "so it cannot generate text; kvviz needs a decoder-only causal language model"
        )


def model_class(config):
    """The transformers auto class that builds a generating model of this config: text-to-text for an
    encoder-decoder (T5, BART), causal language model otherwise."""
    return AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM


def load_directory(directory: Path, dtype: torch.dtype, progress: Progress):
    """(model, tokenizer) from a save_pretrained folder, after refusing what cannot run."""
    if not any(directory.iterdir()):
        raise ModelError(f"{directory} is empty: a model folder holds {WHAT_A_FOLDER_HOLDS}")
    missing = missing_files(directory)
    incomplete = (
        f"{directory} is not a complete model folder: missing {' and '.join(missing)}. "
        f"A model folder holds {WHAT_A_FOLDER_HOLDS}"
    )
    if CONFIG_NAME in missing or any(m.startswith("weights") for m in missing):
        raise ModelError(incomplete)
    config = read_config(directory)
    check_runnable(config, str(directory))  # an encoder says so even when it has no tokenizer either
    if missing:
        raise ModelError(incomplete)
    progress(f"loading {directory.name}", 0.95)
    with quiet_transformers():
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"the tokenizer files in {directory} cannot be read (run with --debug for why)") from exc
        try:
            model = model_class(config).from_pretrained(directory, config=config, dtype=dtype)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ModelError(
                f"the weights in {directory} cannot be loaded into a {config.model_type} model: damaged, or saved "
                "from another model (run with --debug for why)"
            ) from exc
    return model, tokenizer


# -- a GGUF file -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _gguf_loading(progress: Progress, start: float, end: float):
    """Change three things transformers' GGUF loading does, while it runs.

    It parses the file's metadata (100,000 tokenizer strings) once for the tokenizer, once for the
    config and once for the tensors, and it builds gguf's tensor-name table (the same one) once per
    submodule, about 400 times: hand it each of them built once (together most of a conversion's
    time). And it walks the tensors under its own tqdm bar ("Converting and de-quantizing GGUF
    tensors"), which disable_progress_bar does not reach: report that walk through `progress`
    instead, which may raise to abandon the load (the window does when it closes). transformers
    imports the first two from gguf inside each call, so swapping gguf's attributes reaches them.
    """

    def report(tensors, desc=None, **_):
        total = max(len(tensors), 1)
        reported = -1
        for i, tensor in enumerate(tensors):
            tenth = 10 * i // total
            if tenth > reported:
                reported = tenth
                progress(f"dequantizing tensors: {i}/{total}", start + (end - start) * i / total)
            yield tensor

    import gguf  # only where a GGUF is read: importing it costs a few tenths of a second
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    originals = gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.tqdm
    reader, name_map = (functools.cache(original) for original in originals[:2])
    gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.tqdm = reader, name_map, report
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.tqdm = originals


def load_gguf(path: Path, dtype: torch.dtype, progress: Progress, start: float = 0.1, end: float = 0.8):
    """(model, tokenizer) dequantized from a GGUF file; progress runs from `start` to `end`."""
    progress(f"reading the tokenizer of {path.name}", start)
    cannot = (
        f"cannot load GGUF file {path}: damaged, or an architecture transformers {transformers.__version__} "
        "cannot dequantize (run with --debug for why)"
    )
    with quiet_transformers(), _gguf_loading(progress, start, end):
        try:
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ModelError(cannot) from exc
        check_runnable(config, str(path))
        try:
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=config, dtype=dtype)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ModelError(cannot) from exc
    # transformers marks GGUF-loaded models as quantized, which blocks save_pretrained; the weights
    # are already dequantized to ordinary tensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    return model, tokenizer


# -- a hub id --------------------------------------------------------------------------------------


def load_hub(spec: str, dtype: torch.dtype, progress: Progress):
    progress(f"fetching {spec} from the Hugging Face Hub", None)
    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(spec)
            check_runnable(config, spec)
            tokenizer = AutoTokenizer.from_pretrained(spec)
            model = model_class(config).from_pretrained(spec, config=config, dtype=dtype)
    except OSError as exc:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        reason = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else "the Hugging Face Hub cannot be reached"
        raise ModelError(
            f"cannot load {spec!r}: it is not a local path, and {reason} or has no such model. "
            "Pass a local model directory or a .gguf file instead (--model /path/to/model), "
            "or --model default for the embedded SmolLM2-135M-Instruct."
        ) from exc
    except ValueError as exc:
        raise ModelError(
            f"{spec!r} is not a causal language model transformers can load (run with --debug for why)"
        ) from exc
    return model, tokenizer


# -- after loading ---------------------------------------------------------------------------------


def check_keeps_kv_cache(model: PreTrainedModel, where: str) -> None:
    """Refuse a model whose forward pass keeps nothing kvviz can read in a transformers DynamicCache.

    A two-token prompt through the model, then one more token alone through the same cache, as the decoder feeds
    them. Keys and values, indexer keys and the fixed-size states
    of linear-attention and state-space layers (Mamba, gated DeltaNet) are all read; a model that keeps its cache in
    a class of its own is read through it (MiniMax), one that keeps its recurrent states in its modules through the
    states kvviz keeps with its cache (RecurrentGemma; both in `own_caches`). A model whose state layers still keep
    nothing kvviz can read is refused with that reason.
    """
    from kvviz.engine.geometry import HAS_STATE, cache_kinds
    from kvviz.engine.measure import measure_cache
    from kvviz.engine.own_caches import dynamic_cache

    if model.config.is_encoder_decoder:  # text-to-text (check_runnable): its decoder keeps keys and values
        return
    cache = dynamic_cache(model.config)
    prompt = torch.ones((1, 2), dtype=torch.long, device=model.device)
    token = prompt[:, :1]
    name = type(model).__name__
    try:
        with torch.no_grad():
            model_forward(model, prompt, cache, position_ids=None)
    except (ValueError, TypeError, RuntimeError, AttributeError, IndexError) as exc:
        raise ModelError(f"{where} is {name}, which fails one forward pass through transformers' DynamicCache "
                         "(run with --debug for why)") from exc
    records = measure_cache(cache, prompt.shape[1], slots=False)
    try:  # the next token alone, as kvviz feeds every token after the prompt
        with torch.no_grad():
            model_forward(model, token, cache, position_ids=None)
    except (ValueError, TypeError, RuntimeError, AttributeError, IndexError) as exc:
        raise ModelError(f"{where} is {name}, which fails when fed one new token after a prompt through "
                         "transformers' DynamicCache, as kvviz feeds every token after the prompt (it may want the "
                         "whole sequence again at every step; run with --debug for why)") from exc
    stateless = [i for i, (kind, record) in enumerate(zip(cache_kinds(model.config), records, strict=False))
                 if kind in HAS_STATE and not record.state_bytes]
    if stateless:
        raise ModelError(
            f"{where} is {name}, which keeps the state of its recurrent layers ({len(stateless)} of them) inside the "
            "model's own modules rather than in transformers' cache, so kvviz cannot measure it; kvviz reads the "
            "caches transformers' DynamicCache holds (Llama, Qwen3-Next, Jamba, Mamba, ...)"
        )
    if not sum(record.total_bytes for record in records):
        raise ModelError(
            f"{where} is {name}, which keeps nothing in a cache: kvviz shows the caches of decoders (attention, "
            "linear-attention and state-space layers: Llama, Qwen3-Next, Jamba, Mamba, ...)"
        )
