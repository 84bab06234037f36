"""kill -9 at random moments: a run, an evaluation and a resumed evaluation ended by SIGKILL keep what they wrote
before the kill, leave nothing unreadable, and a resumed evaluation ends with the numbers of an uninterrupted one.

Each kill is a child forked from this process, the tiny model already loaded (a fresh interpreter would pay about
3 s for torch each time): the child runs the command in its own process and kills itself with SIGKILL in the
middle of its k-th write to a journal, after writing a random part of it, so that kill points spread over the
whole measurement and cut lines mid-write. k and the part are random; KVVIZ_KILL_SEED replays a failure. A forked
child runs torch on one thread: the parent's OpenMP pool does not survive a fork (a child that used it would wait
for ever).
"""

import gc
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest

from kvviz.files import evaluation
from kvviz.files.formats import read_kept
from tests.commands import kvviz

SEED = int(os.environ.get("KVVIZ_KILL_SEED", time.time_ns() % 10**6))
RUN = ["run", "--model", "tiny", "--prompt", "Tell me a story.", "--max-new-tokens", "40", "--ignore-eos"]
EXACT = ["eval", "--model", "tiny", "--builtin", "alice", "--tokens", "300", "--strategies", "dynamic,static"]
EVICTING = ["eval", "--model", "tiny", "--builtin", "alice", "--tokens", "40", "--strategies",
            "tova:budget=8,h2o:budget=6", "--token-by-token"]  # read together, a journal write at every token
STEPPED = ["eval", "--model", "tiny", "--builtin", "alice", "--tokens", "300", "--strategies",
           "tova:budget=40,h2o:budget=30"]
KILLED = "killed"


@pytest.fixture
def preloaded(tiny_model, monkeypatch):
    """Commands in children load nothing: `--model tiny` is the model this process loaded."""
    from kvviz.engine import models

    monkeypatch.setattr(models, "load_model", lambda spec, **kwargs: tiny_model)


def in_child(args, kill_at: int | None = None, part: float = 0.5, stderr: Path | None = None):
    """Run `kvviz ARGS` in a forked child; with `kill_at`, the child writes `part` of its kill_at-th write to a
    journal and kills itself with SIGKILL. Returns KILLED or the command's exit status (and with `stderr`, writes
    what the command said there into that file)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            import torch

            signal.alarm(120)  # a child that hangs dies
            gc.enable()  # collected as in a user's process (the suite's windows turn that off: kvviz.qt.collector)
            torch.set_num_threads(1)
            # no figures: Qt hangs drawing in a child forked from a process that ran Qt before (the suite's window
            # tests), and the pictures are not what a kill test checks (the command says it did not draw them)
            sys.modules["kvviz.qt.tools.figures"] = None
            if kill_at is not None:
                _kill_at_write(kill_at, part)
            ran = kvviz(*args)
            if stderr is not None:
                stderr.write_text(ran.stderr)
            code = ran.returncode
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL, f"the child died of signal {os.WTERMSIG(status)} (seed {SEED})"
        return KILLED
    return os.WEXITSTATUS(status)


def _kill_at_write(kill_at: int, part: float) -> None:
    real_write, writes = os.write, [0]

    def write(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.endswith((".journal", ".part")):
            writes[0] += 1
            if writes[0] == kill_at:
                real_write(fd, bytes(data)[: int(len(data) * part)])
                os.kill(os.getpid(), signal.SIGKILL)
        return real_write(fd, data)

    os.write = write


def readable(folder: Path) -> dict[str, object]:
    """Every file a user sees in `folder` (kvviz's hidden temporary files aside), read: none may be unreadable. The
    kept files (runs, sweeps, journals) come back as kvviz reads them; the tables and reports a finished command
    writes beside them (summary.csv, sweep.csv, report.md) are only read as UTF-8 text."""
    seen = [p for p in sorted(folder.iterdir()) if not p.name.startswith(".")]
    for text in (p for p in seen if p.suffix in (".csv", ".md")):
        text.read_text(encoding="utf-8")
    return {p.name: read_kept(p) for p in seen if p.suffix not in (".csv", ".md")}


def test_a_run_killed_at_any_step_keeps_every_step_written_before(tmp_path, preloaded):
    assert in_child([*RUN, "--trace", tmp_path / "whole.json"]) == 0
    tokens = [s.token_id for s in read_kept(tmp_path / "whole.json").steps]
    rng = random.Random(SEED)
    for kill_at in sorted(rng.sample(range(1, len(tokens) + 1), 8)):  # the first write creates the journal
        folder = tmp_path / f"killed-{kill_at}"
        folder.mkdir()
        assert in_child([*RUN, "--trace", folder / "run.json"], kill_at, rng.random()) == KILLED
        files = readable(folder)
        if kill_at == 1:  # killed while the journal was being created: no journal yet, nothing half-written
            assert files == {}, SEED
            continue
        partial = files["run.json.journal"]
        assert list(files) == ["run.json.journal"], SEED
        assert [s.token_id for s in partial.steps] == tokens[: kill_at - 1], SEED  # the write cut short is lost
        assert partial.error.startswith(f"stopped after {kill_at - 1} of 40 tokens"), SEED
    shown = kvviz("trace", folder / "run.json.journal")  # the last one killed, as `kvviz trace` says it
    assert shown.returncode == 0 and f"ended  stopped after {kill_at - 1} of 40 tokens; the process ended without " \
        "saving" in shown.stdout, shown.stdout + shown.stderr


def nll(folder: Path) -> dict[str, list[float]]:
    return {name: [r.nll for r in run.records] for name, run in readable(folder).items()}


@pytest.mark.parametrize("args,writes,chains", [(EXACT, 6, 3), (STEPPED, 8, 3), (EVICTING, 79, 3)],
                         ids=["exact", "stepped", "evicting"])
def test_an_evaluation_and_its_resume_killed_anywhere_end_as_an_uninterrupted_one(tmp_path, preloaded, args, writes,
                                                                                  chains):
    whole = tmp_path / "whole"
    # `writes` counts the journal writes of an uninterrupted run, each a place to kill it (a reading that writes fewer
    # would otherwise fail only for the seeds that draw a kill past its last write)
    assert in_child([*args, "--out", whole], writes + 1) == 0
    assert in_child([*args, "--out", tmp_path / "last"], writes) == KILLED
    expected = nll(whole)
    rng = random.Random(SEED + writes)
    for chain in range(chains):
        folder = tmp_path / f"chain-{chain}"
        # the first chain is killed in its third write: an exact cache then continues after two whole chunks
        first, second = 3 if chain == 0 else rng.randint(1, writes), rng.randint(1, writes)
        assert in_child([*args, "--out", folder], first, rng.random()) == KILLED
        partial = readable(folder)
        for name, run in partial.items():
            assert name.endswith(".journal") and run.records, (name, SEED)
            done, whole_run = len(run.records), expected[name.removesuffix(".journal")]
            assert [r.nll for r in run.records] == whole_run[:done], (name, SEED)
            assert run.status == "finished" or run.error.startswith(f"stopped after {done:,} of {len(whole_run):,}"), \
                (name, SEED)
        resume = ["--resume"] if partial else []  # killed while the first journal was created: nothing to resume
        assert in_child([*args, "--out", folder, *resume], second, rng.random()) in (KILLED, 0), SEED
        readable(folder)
        resume = ["--resume"] if any(folder.glob("*.journal")) else []
        assert in_child([*args, "--out", folder, *resume]) == 0, SEED
        resumed = nll(folder)
        assert resumed.keys() == expected.keys() and not list(folder.glob("*.journal")), SEED
        for name, values in expected.items():
            assert resumed[name] == pytest.approx(values, abs=1e-6), (name, first, second, SEED)


def test_resume_refuses_a_journal_of_other_settings_naming_the_differences(tmp_path, preloaded):
    assert in_child([*EXACT, "--out", tmp_path], kill_at=3) == KILLED
    result = kvviz(*EXACT[:6], "200", "--strategies", "dynamic,sink", "--out", tmp_path, "--resume")
    assert result.returncode == 2, result.stderr
    assert "the document's tokens" in result.stderr and "the strategies (dynamic, static (" in result.stderr
    assert "Traceback" not in result.stderr
    kept = evaluation.read_journal(tmp_path / "eval-1-dynamic.json.journal").run.records
    assert 256 <= len(kept) < 299  # the third chunk's records cut mid-write: those written whole are kept, untouched
    shown = kvviz("trace", tmp_path / "eval-1-dynamic.json.journal")
    assert f"stopped after {len(kept)} of 299 tokens; the process ended without saving" in shown.stdout
    empty = kvviz(*EXACT, "--out", tmp_path / "empty", "--resume")
    assert empty.returncode == 2 and "holds no journal to resume" in empty.stderr


def test_an_evaluation_stopped_with_ctrl_c_keeps_its_journals_and_resumes_as_an_uninterrupted_one(tmp_path, preloaded,
                                                                                                    monkeypatch):
    args = [*EXACT[:6], "200", "--strategies", "dynamic"]  # two chunks: stopped after the first
    assert kvviz(*args, "--out", tmp_path / "whole").returncode == 0
    expected = nll(tmp_path / "whole")
    update, stopped = evaluation.EvalJournal.update, []

    def ctrl_c_after_a_chunk(journal, end=False):  # as a terminal's Ctrl-C: a KeyboardInterrupt between tokens
        if not stopped and len(journal.run.records) == 128:
            stopped.append(True)
            raise KeyboardInterrupt
        update(journal, end)

    monkeypatch.setattr(evaluation.EvalJournal, "update", ctrl_c_after_a_chunk)
    folder = tmp_path / "stopped"
    interrupted = kvviz(*args, "--out", folder)
    assert interrupted.returncode == 130 and "with --resume continues this evaluation" in interrupted.stderr
    partial = evaluation.load(folder / "eval-1-dynamic.json")  # written as before, and its journal kept
    assert partial.status == "cancelled" and len(partial.records) == 128
    assert [p.name for p in folder.glob("*.journal")] == ["eval-1-dynamic.json.journal"]
    resumed = kvviz(*args, "--out", folder, "--resume")
    assert resumed.returncode == 0 and "continues after token 128 of 199" in resumed.stderr, resumed.stderr
    assert not list(folder.glob("*.journal"))
    for name, values in nll(folder).items():
        assert values == pytest.approx(expected[name], abs=1e-6), name
