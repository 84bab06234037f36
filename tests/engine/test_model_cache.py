"""The converted default model's cache: damage is found, the copy heals, and nothing blocks a run.

Every test works on its own KVVIZ_CACHE_DIR. The cheap ones damage a copy of the suite's converted
model and ask `check_converted`; four run real conversions or in-memory loads in subprocesses
(a rebuild through `kvviz model --verify`, two processes converting at once, a read-only and a
full cache folder, a write that fails half-way).
"""

import fcntl
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys

import pytest

from kvviz.engine import model_cache
from kvviz.files.gguf_header import GGUFHeaderError, read_gguf_header
from tests.engine.conftest import own
from tests.engine.tiny_gguf import write_tiny_gguf

BARS = ("Converting and de-quantizing", "Writing model shards", "it/s]")


def check(directory, full=False):
    return model_cache.check_converted(directory, model_cache.default_gguf_path(), full=full)


def overwrite(path, offset, data, keep_mtime=False):
    """Write `data` at `offset` inside `path` (same size); optionally put the old modification time back."""
    own(path)
    stat = path.stat()
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def manifest(directory):
    return json.loads((directory / model_cache.MANIFEST).read_text())


def kvviz(cache_dir, *args, wrap=(), preexec_fn=None):
    env = dict(os.environ, KVVIZ_CACHE_DIR=str(cache_dir), HF_HUB_OFFLINE="1")
    command = [*wrap, sys.executable, "-m", "kvviz", *args]
    return subprocess.run(  # in the cache folder, where `kvviz run` leaves its trace
        command, env=env, cwd=cache_dir, capture_output=True, text=True, timeout=600, preexec_fn=preexec_fn
    )


def leftovers(cache_dir):
    return sorted(p.name for p in (cache_dir / "models").iterdir() if p.name.startswith(model_cache.WORK_PREFIX))


# -- found at start, without hashing what did not change -------------------------------------------


def test_same_size_corruption_of_the_weights_is_found(cache_copy):
    assert check(cache_copy) is None
    overwrite(cache_copy / "model.safetensors", 300_000_000, b"\x7f" * 64)
    assert check(cache_copy) == (
        "model.safetensors was changed (its content no longer matches its recorded sha256)"
    )


def test_unchanged_times_are_trusted_at_start_and_verify_hashes_everything(cache_copy):
    weights = cache_copy / "model.safetensors"
    overwrite(weights, 300_000_000, b"\x7f" * 64, keep_mtime=True)
    assert check(cache_copy) is None  # size and time as recorded: trusted without reading 538 MB
    assert "model.safetensors was changed" in check(cache_copy, full=True)


def test_a_touched_file_is_hashed_once_then_trusted(cache_copy):
    weights = cache_copy / "model.safetensors"
    own(weights)
    os.utime(weights)
    assert check(cache_copy) is None  # hashed, matches
    assert manifest(cache_copy)["mtime_ns"]["model.safetensors"] == weights.stat().st_mtime_ns


def test_a_config_of_the_same_size_is_found_garbage_or_edited(cache_copy):
    config = cache_copy / "config.json"
    text = config.read_text()
    overwrite(config, 0, b"\xff" * len(text))
    assert check(cache_copy) == "config.json was changed (its content no longer matches its recorded sha256)"
    edited = text.replace('"num_hidden_layers": 30', '"num_hidden_layers": 31')
    config.write_text(edited)
    os.utime(config, ns=(0, manifest(cache_copy)["mtime_ns"]["config.json"]))
    assert check(cache_copy) == "config.json was changed (its content no longer matches its recorded sha256)"


def test_a_config_edit_disagrees_with_the_gguf(cache_copy):
    source = model_cache.default_gguf_path()
    config = cache_copy / "config.json"  # (test_verify_reports_a_good_copy sees the unedited one agree)
    config.write_text(config.read_text().replace('"num_hidden_layers": 30', '"num_hidden_layers": 31'))
    assert model_cache.config_disagreement(config, source) == (
        f"config.json says num_hidden_layers=31, {source.name} says 30"
    )


@pytest.mark.parametrize("which", ["default", "tiny"])
def test_the_config_read_from_the_gguf_header_is_transformers_own(which, tmp_path):
    """Derived from the header alone (the default model's in 0.05 s), it equals what transformers' reader derives after
    decoding every tokenizer string (4.5 s), key for key and value for value."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    source = model_cache.default_gguf_path() if which == "default" else write_tiny_gguf(tmp_path / "tiny.gguf")
    expected = load_gguf_checkpoint(str(source), return_tensors=False)["config"]
    assert model_cache.gguf_metadata_config(source) == expected
    assert expected["num_hidden_layers"] == (30 if which == "default" else 2)


def test_a_gguf_cut_short_inside_its_header_is_named(tmp_path):
    source = write_tiny_gguf(tmp_path / "tiny.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(source.read_bytes()[:1000])
    with pytest.raises(GGUFHeaderError, match=r"^cut.gguf ends inside its header \(at byte \d+\)$"):
        read_gguf_header(cut)
    cut.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GGUFHeaderError, match="^cut.gguf is not a GGUF file"):
        read_gguf_header(cut)


def test_missing_truncated_and_manifest_problems_are_named(cache_copy):
    tokenizer = cache_copy / "tokenizer.json"
    size = tokenizer.stat().st_size
    with tokenizer.open("r+b") as f:
        f.truncate(size // 2)
    assert check(cache_copy) == f"tokenizer.json has {size // 2:,} bytes instead of {size:,}"
    tokenizer.unlink()
    assert check(cache_copy) == "tokenizer.json is missing"
    record = manifest(cache_copy)
    (cache_copy / model_cache.MANIFEST).write_text(json.dumps({"files": record["files"]}))
    assert check(cache_copy) == "the copy was made by an earlier kvviz, whose conversion differs"
    (cache_copy / model_cache.MANIFEST).write_bytes(b"\x00" * 100)
    assert check(cache_copy) == "the manifest is not readable"
    (cache_copy / model_cache.MANIFEST).unlink()
    assert check(cache_copy) == "no manifest: a missing or half-written copy"


def test_abandoned_work_folders_go_unless_a_conversion_holds_the_lock(cache_copy):
    parent = cache_copy.parent
    abandoned = parent / f"{model_cache.WORK_PREFIX}killed"
    abandoned.mkdir()
    (abandoned / "model.safetensors").write_bytes(b"\x00" * 1000)
    fd = os.open(parent / model_cache.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a running conversion holds it
        assert model_cache.ensure_default_model() == cache_copy
        assert abandoned.exists()
    finally:
        os.close(fd)
    assert model_cache.ensure_default_model() == cache_copy
    assert not abandoned.exists()


def test_verify_reports_a_good_copy(cache_copy):
    found = model_cache.verify_default_model()
    assert re.match(rf"{re.escape(str(cache_copy))}: all 6 files \(54\d MB\) match their recorded sha256", found)
    assert "config.json agrees with SmolLM2-135M-Instruct.Q4_1.gguf" in found


# -- real conversions --------------------------------------------------------------------------------


def test_verify_rebuilds_a_damaged_copy_without_transformers_bars(cache_copy):
    expected = manifest(cache_copy)["sha256"]
    overwrite(cache_copy / "model.safetensors", 300_000_000, b"\x7f" * 64, keep_mtime=True)
    abandoned = cache_copy.parent / f"{model_cache.WORK_PREFIX}killed"
    abandoned.mkdir()
    done = kvviz(cache_copy.parent.parent, "model", "--verify")
    assert done.returncode == 0, done.stderr
    assert f"{cache_copy}: model.safetensors was changed" in done.stdout
    assert "rebuilt it from SmolLM2-135M-Instruct.Q4_1.gguf in" in done.stdout
    assert "layers  30 (30 full_attention)" in done.stdout
    assert re.search(r"kvviz: \[ *\d+%\] dequantizing tensors: \d+/272", done.stderr)  # kvviz's own progress...
    assert not any(bar in done.stderr for bar in BARS), done.stderr  # ...and no one else's
    assert manifest(cache_copy)["sha256"] == expected  # the same bytes as before the damage
    assert leftovers(cache_copy.parent.parent) == []


def test_a_conversion_depends_on_the_source_alone(tmp_path):
    """The same GGUF (a tiny one, converted in a second) converted under HF_HUB_OFFLINE=1 and without it, each in a
    fresh process: every file byte for byte the same, and no load-time option written into them."""
    source = write_tiny_gguf(tmp_path / "tiny.gguf")
    code = ("import sys; from pathlib import Path; from kvviz.engine.model_cache import convert; "
            "convert(Path(sys.argv[1]), Path(sys.argv[2]))")
    bare = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    runs = {name: subprocess.Popen([sys.executable, "-c", code, str(source), str(tmp_path / name)], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name, env in (("offline", dict(bare, HF_HUB_OFFLINE="1")), ("online", bare))}
    for run in runs.values():
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    offline, online = tmp_path / "offline", tmp_path / "online"
    names = sorted(p.name for p in offline.iterdir())
    assert names == sorted(p.name for p in online.iterdir()) and "tokenizer_config.json" in names
    for name in names:
        if name == model_cache.MANIFEST:  # it also records when each file was written
            kept = [{k: v for k, v in manifest(folder).items() if k != "mtime_ns"} for folder in (offline, online)]
            assert kept[0] == kept[1]
        else:
            assert (offline / name).read_bytes() == (online / name).read_bytes(), name
        for option in model_cache.LOAD_OPTIONS:
            assert f'"{option}"' not in (offline / name).read_text(errors="replace"), (name, option)


def test_two_processes_converting_at_once_end_with_one_good_copy(tmp_path):
    env = dict(os.environ, KVVIZ_CACHE_DIR=str(tmp_path), HF_HUB_OFFLINE="1")
    command = [sys.executable, "-m", "kvviz", "model", "--json"]
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert all(json.loads(out)["num_layers"] == 30 for out, _ in results)
    assert sum("converting SmolLM2" in err for _, err in results) == 1  # the other one waited or came late
    assert check(tmp_path / "models" / model_cache.DEFAULT_NAME, full=True) is None
    assert leftovers(tmp_path) == []
    shutil.rmtree(tmp_path / "models")  # half a gigabyte


def test_a_write_that_fails_half_way_leaves_nothing_and_says_what_to_do(tmp_path):
    def small_files_only():  # a real file-system refusal (EFBIG) in the middle of writing the weights
        resource.setrlimit(resource.RLIMIT_FSIZE, (50 * 2**20, 50 * 2**20))

    done = kvviz(tmp_path, "model", "--verify", preexec_fn=small_files_only)
    assert done.returncode == 1
    folder = tmp_path / "models"
    assert f"kvviz cannot write into the model cache folder {folder} (File too large): free some space there" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
    assert [p.name for p in folder.iterdir()] == [model_cache.LOCK_NAME]


def _mount_namespace():
    """The command that runs a shell in a private mount namespace, or None where that is not allowed."""
    if shutil.which("unshare") is None:
        return None
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    probe = subprocess.run([*unshare, "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /tmp"], capture_output=True)
    return unshare if probe.returncode == 0 else None


MOUNTS = _mount_namespace()
needs_mounts = pytest.mark.skipif(MOUNTS is None, reason="needs unshare and mount (a private mount namespace)")


def mounted(setup):
    return [*MOUNTS, "sh", "-c", f'{setup} && exec "$0" "$@"']


@needs_mounts
def test_a_read_only_cache_folder_still_runs_converting_in_memory(cache_copy):
    (cache_copy / model_cache.MANIFEST).unlink()
    folder = shlex.quote(str(cache_copy.parent))
    done = kvviz(
        cache_copy.parent.parent,
        *("run", "--prompt", "The capital of France is", "--raw", "--max-new-tokens", "3", "--json"),
        wrap=mounted(f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder}"),
    )
    assert done.returncode == 0, done.stderr
    assert f"the converted default model in {cache_copy} cannot be used (no manifest: " in done.stderr
    assert (
        f"and kvviz cannot write into the model cache folder {cache_copy.parent} (Read-only file system): "
        "set KVVIZ_CACHE_DIR to a folder you can write, or make this one writable. Converting in memory for this run"
    ) in done.stderr
    assert json.loads(done.stdout)["model"] == "SmolLM2-135M-Instruct"
    assert not any(bar in done.stderr for bar in BARS)


@needs_mounts
def test_a_full_cache_folder_is_refused_before_converting(tmp_path):
    root = shlex.quote(str(tmp_path))
    done = kvviz(tmp_path, "model", "--verify", wrap=mounted(f"mount -t tmpfs -o size=100m tmpfs {root}"))
    assert done.returncode == 1
    folder = re.escape(str(tmp_path / "models"))
    assert re.search(rf"kvviz cannot write into the model cache folder {folder} \(10\d MB free\): free", done.stderr)
    assert "(the converted default model takes about 560 MB), or set KVVIZ_CACHE_DIR to a folder with room" in (
        done.stderr
    )
    assert "dequantizing" not in done.stderr
