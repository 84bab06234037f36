"""Saving kept files: atomic, always valid JSON, no temporary file left in any case, and a Ctrl-C or
SIGTERM during the save of a big trace takes effect only once the whole file is written."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvviz.files import jsonfile, trace
from kvviz.files.jsonfile import part_name, write_json

# A child that builds a big trace (3,000 steps x 30 layers, about 15 MB of JSON) and saves it. The save
# announces itself from inside (where signals wait) and pauses, so the parent's signal lands mid-save.
CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from kvviz.files.trace import LayerRecord, StepRecord, Trace

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job may have inherited "ignore"
    layers = lambda i: [LayerRecord(64 * i, 64 * i, i, i, 0.1, {"full": 128 * i}, [[2, i]]) for _ in range(30)]
    steps = [StepRecord(i, "decode", 1, "x", 1.0, 30 * 128 * (i + 1), 0, 0, "dynamic", layers(i + 1),
                        position=1 + i) for i in range(3000)]
    big = Trace(model={"name": "big"}, strategy={"name": "dynamic", "options": {}}, prompt_tokens=1, steps=steps)
    build = Trace.to_dict

    def to_dict_slowly(self):
        print("saving", flush=True)
        time.sleep(1.0)
        return build(self)

    Trace.to_dict = to_dict_slowly
    try:
        big.save(sys.argv[1])
    except KeyboardInterrupt:
        print("interrupted after the save", flush=True)
        sys.exit(130)
    print("saved without a signal", flush=True)
    """
)


def _parts(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_save_of_a_big_trace_waits_for_it(tmp_path, sig):
    path = tmp_path / "big.json"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "saving"
        child.send_signal(sig)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    if sig == signal.SIGINT:
        assert (child.returncode, out.strip()) == (130, "interrupted after the save"), err
    else:
        assert child.returncode == -signal.SIGTERM, out + err  # SIGTERM's own effect, once the file was complete
    assert "Traceback" not in err
    kept = trace.load(path)
    assert len(kept.steps) == 3000 and kept.steps[-1].cache_bytes == 30 * 128 * 3000
    assert _parts(tmp_path) == []


def test_save_replaces_the_file_whole_and_leaves_no_part(tmp_path):
    path = tmp_path / "x.json"
    write_json(path, {"a": 1})
    write_json(path, lambda: {"a": [2, float("nan")], "t": "caf\udcc3\udca9 \ud800"})
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": [2, None], "t": "caf\ufffd\ufffd \ufffd"}
    assert _parts(tmp_path) == []


def test_a_failed_save_keeps_the_old_file_and_leaves_no_part(tmp_path, monkeypatch):
    path = tmp_path / "x.json"
    write_json(path, {"old": True})

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jsonfile.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_json(path, {"new": True})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"old": True}
    with pytest.raises(TypeError):
        write_json(path, {"not json": object()})
    with pytest.raises(IsADirectoryError):
        write_json(tmp_path, {})
    with pytest.raises(FileNotFoundError) as missing:
        write_json(tmp_path / "no" / "such.json", {})
    assert str(tmp_path / "no") in str(missing.value)  # the folder, not a hidden temporary name
    assert _parts(tmp_path) == [] and json.loads(path.read_text()) == {"old": True}


def test_parts_a_killed_save_left_are_removed_by_the_next_save(tmp_path):
    path = tmp_path / "run.json"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = part_name(path, gone.pid, "dead")
    legacy = tmp_path / "run.json.part"  # what kvviz wrote before
    running = part_name(path, 1, "live")  # a save in progress in a running process is left alone
    other = part_name(tmp_path / "other.json", gone.pid, "dead")  # another file's
    for p in (stale, legacy, running, other):
        p.write_text("{half")
    trace.Trace(model={}, strategy={"name": "dynamic", "options": {}}).save(path)
    assert _parts(tmp_path) == sorted([running.name, other.name])
    assert trace.load(path).steps == []
