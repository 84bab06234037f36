"""Runs, evaluations, chats and sweeps the window measured and nobody has saved yet, kept on disk as they are
measured (`kvviz.files.journal`), so that a crash, kill -9 or a power cut does not take them with the window. A chat
not saved when the window closes is kept in the same folder (`ChatMode.keep_at_close`), as a conversation file.

Each run, each evaluated strategy, each chat and each sweep has a journal in the user's state folder (`folder()`;
KVVIZ_UNSAVED_DIR overrides it), named after the window's process. A window that closes normally removes its own:
what was not saved goes with it, as it always did. The journals of a window that ended without closing stay; the next
window says where they are (`left_behind`), and File ▸ Open shows each as the partial run, evaluation, chat or sweep it
holds, and offers to continue an evaluation or a sweep.

What windows leave here is cleaned when a window starts (`clean`, said in Help ▸ About as `RULE`): the newest
KEEP_NEWEST files left by windows that ended stay while they are younger than KEEP_DAYS days; the rest go. A
running window's journals are never touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from pathlib import Path

import platformdirs

from kvviz.files.conversation import ConversationJournal, ConversationTrace
from kvviz.files.evaluation import EvalJournal, EvalRun
from kvviz.files.journal import SUFFIX
from kvviz.files.jsonfile import process_alive
from kvviz.files.serve_trace import ServeJournal, ServeRun
from kvviz.files.sweep import Sweep, SweepJournal
from kvviz.files.trace import Trace, TraceJournal
from kvviz.present import counted

log = logging.getLogger(__name__)
KEEP_NEWEST = 20  # files left by windows that ended, kept at most
KEEP_DAYS = 14  # and for at most this long
RULE = (f"kvviz keeps the newest {KEEP_NEWEST} of them for {KEEP_DAYS} days and removes the rest when a window "
        "starts: save what you want to keep")
_KEPT_AT_CLOSE = re.compile(r"^conversation-.*\.json$")  # `ChatMode.keep_at_close`'s files
# the owner's process id
_OWNED = re.compile(r"^(?:run|eval|chat|sweep|serve)-(\d+)-.*\.json" + re.escape(SUFFIX) + "$")


def folder() -> Path:
    return Path(os.environ.get("KVVIZ_UNSAVED_DIR") or platformdirs.user_state_dir("kvviz")) / "unsaved"


def trace_journal(run_id: int, trace: Trace) -> TraceJournal | None:
    """The journal of a run of this window (None where the folder cannot be written: the run goes on)."""
    path = _file(f"run-{os.getpid()}-{run_id}.json")
    return TraceJournal(path, trace) if path else None


def eval_journal(eval_id: int, index: int, run: EvalRun) -> EvalJournal | None:
    """Likewise for one strategy of an evaluation."""
    path = _file(f"eval-{os.getpid()}-{eval_id}-{index + 1}-{run.strategy['name']}.json")
    return EvalJournal(path, run, {}) if path else None


def conversation_journal(chat_id: int, trace: ConversationTrace) -> ConversationJournal | None:
    """Likewise for a chat: its finished turns."""
    path = _file(f"chat-{os.getpid()}-{chat_id}.json")
    return ConversationJournal(path, trace) if path else None


def sweep_journal(sweep_id: int, sweep: Sweep, resume: dict) -> SweepJournal | None:
    """Likewise for a sweep of the Choose tab: each configuration as it finishes, the answers as they are given;
    `resume` is what a continuation checks (`kvviz.engine.sweep_resume.resume_key`)."""
    path = _file(f"sweep-{os.getpid()}-{sweep_id}.json")
    return SweepJournal(path, sweep, resume) if path else None


def serve_journal(job_id: int, run: ServeRun) -> ServeJournal | None:
    """Likewise for a run of the Serve tab: its steps and requests as it serves."""
    path = _file(f"serve-{os.getpid()}-{job_id}.json")
    return ServeJournal(path, run) if path else None


def say_left_behind(status_bar) -> list[Path]:
    """Say in `status_bar` where the runs, evaluations, chats, sweeps and serving runs of a window that ended without
    closing are kept; returns them."""
    left = left_behind()
    if left:
        # what to do first, the folder last: a narrow window cuts the end
        status_bar.showMessage(f"{counted(len(left), 'unsaved journal')} left by a window that ended without closing: "
                               f"File ▸ Open shows {'it' if len(left) == 1 else 'them'}, in {folder()}", 60_000)
    return left


def holds(path: str | os.PathLike) -> bool:
    """`path` lies in the folder of unsaved work (a window's journal, not one beside a command's --out files)."""
    return Path(path).resolve().parent == folder().resolve()


def _file(name: str) -> Path | None:
    try:
        folder().mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.info("what the window measures is not journaled: %s", exc)
        return None
    return folder() / name


def _journals() -> list[tuple[Path, int]]:
    with contextlib.suppress(OSError):
        return [(p, int(m.group(1))) for p in folder().iterdir() if (m := _OWNED.match(p.name))]
    return []


def left_behind() -> list[Path]:
    """Journals of windows that ended without closing (their process is gone)."""
    return sorted(path for path, pid in _journals() if not process_alive(pid))


def remove_own() -> None:
    """This window closes normally: its journals go (what was not saved goes with it, as always)."""
    for path, pid in _journals():
        if pid == os.getpid():
            with contextlib.suppress(OSError):
                path.unlink()


def clean(now: float | None = None) -> list[Path]:
    """Remove what windows that ended left here beyond `RULE` (their journals, the chats kept at close): all but the
    newest KEEP_NEWEST, and any older than KEEP_DAYS days. Returns what was removed."""
    now = time.time() if now is None else now
    left = [path for path, pid in _journals() if not process_alive(pid)]
    with contextlib.suppress(OSError):
        left += [p for p in folder().iterdir() if _KEPT_AT_CLOSE.match(p.name)]
    dated = []
    for path in left:
        with contextlib.suppress(OSError):
            dated.append((path.stat().st_mtime, path))
    dated.sort(reverse=True)
    removed = []
    for rank, (mtime, path) in enumerate(dated):
        if rank >= KEEP_NEWEST or now - mtime > KEEP_DAYS * 86400:
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
    return removed
