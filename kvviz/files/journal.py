"""Journals: what a long measurement has measured so far, kept on disk as it goes, so that a process ended
without warning (kill -9, the out-of-memory killer, a power cut) loses at most its last moments.

A journal lies beside the file it will become (`journal_path`: ``run.json.journal``) and is JSON lines:

    {"format": "kvviz-journal", "version": 1, "kind": "kvviz-trace", "header": {...}}
    ...                                  one JSON value per line, as the kind of kept file defines them

`Journal` hands every line to the operating system as it is appended, so that a killed process loses nothing
appended and a write cut short loses only its own line; it fsyncs at `sync()` (the end of a strategy, of a turn)
and at least every SYNC_S seconds while lines come, so that a power cut loses at most those seconds. It starts
whole (header and any lines carried over, written to a hidden file that is renamed into place), so that a journal
never exists without its header. The measurement's owner writes the final file atomically at the end,
as always, then `remove()`s the journal.

`parse_journal` gives the kind, the header and the lines; a last line cut mid-write is dropped. Each kind of kept
file declares what its header and lines hold and how they become its object (`FileFormat.from_journal`: traces
and evaluations now, sweeps and conversations as they come); nothing here knows what they mean.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from kvviz.files.jsonfile import (
    KeptFileError,
    deferred_signals,
    encode_json,
    part_name,
    read_text,
    remove_stale_parts,
    sync_folder,
)

FORMAT = "kvviz-journal"
VERSION = 1
SUFFIX = ".journal"
SYNC_S = 5.0  # the longest a written line waits for fsync (what a power cut can cost)
_START = f'{{"format":"{FORMAT}"'  # how every journal's first line begins (compact JSON, written here)


def journal_path(final: str | os.PathLike) -> Path:
    """Where the journal of the file `final` lies while it is measured."""
    final = Path(final)
    return final.with_name(final.name + SUFFIX)


def ended_without_saving(done: int, planned: int | None, unit: str = "token") -> str:
    """What a journal left by a killed process holds, in words: "stopped after 412 of 1,499 tokens; ..."."""
    of = f" of {planned:,}" if planned is not None else ""
    plural = unit if planned == 1 or (planned is None and done == 1) else unit + "s"
    return f"stopped after {done:,}{of} {plural}; the process ended without saving"


class Journal:
    """The journal at `path` of a kind of kept file: `start` it with its header (when the first records are known),
    then `extend` it. Writing never stops the measurement: a journal that cannot be created or written (a full disk,
    a folder gone) stops, and says why in `problem`."""

    def __init__(self, path: str | os.PathLike, kind: str):
        self.path = Path(path)
        self.kind = kind
        self.started = False
        self.problem: str | None = None
        self._fd: int | None = None
        self._synced = time.monotonic()

    def start(self, header: dict[str, Any], lines: list[Any] = ()) -> None:
        """Create the journal holding the header and `lines`, in place at once and durable (it replaces any
        journal there, whole: a process killed meanwhile leaves the one before)."""
        self.started = True
        first = {"format": FORMAT, "version": VERSION, "kind": self.kind, "header": header}
        content = b"".join(encode_json(value) + b"\n" for value in (first, *lines))
        try:
            with deferred_signals():
                remove_stale_parts(self.path)
                part = part_name(self.path, os.getpid(), "journal")
                fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
                try:
                    _write_all(fd, content)
                    os.fsync(fd)
                    os.replace(part, self.path)  # the open descriptor follows the file to its name
                except BaseException:
                    os.close(fd)
                    with contextlib.suppress(OSError):
                        os.unlink(part)
                    raise
                sync_folder(self.path.parent)
        except OSError as exc:
            self._stop(exc)
            return
        self._fd = fd
        self._synced = time.monotonic()

    def extend(self, lines: list[Any]) -> None:
        """Append these values, one line each, handed to the operating system now (one write)."""
        if self._fd is None or not lines:
            return
        content = b"".join(encode_json(value) + b"\n" for value in lines)
        try:
            # one write: a file's write is not cut by a signal (Ctrl-C acts after it), only by the process's death
            _write_all(self._fd, content)
            if time.monotonic() - self._synced >= SYNC_S:
                self.sync()
        except OSError as exc:
            self._stop(exc)

    def sync(self) -> None:
        """Make what was appended durable (the end of a strategy or a turn)."""
        if self._fd is None:
            return
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self._stop(exc)
        self._synced = time.monotonic()

    def close(self) -> None:
        """Stop appending; the journal stays."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        """The final file is written: the journal goes (if this process wrote one)."""
        self.close()
        if self.started:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            remove_stale_parts(self.path)  # a creation a killed process left half done

    def _stop(self, exc: OSError) -> None:
        self.problem = f"the journal {self.path} could not be written: {exc.strerror or exc}"
        self.close()


def _write_all(fd: int, content: bytes) -> None:
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view) :]


# -- reading --------------------------------------------------------------------------------------------


def is_journal(text: str) -> bool:
    return text.startswith(_START)


def read_journal_of(path: str | os.PathLike, kind: str, what: str,
                    error: type[KeptFileError]) -> tuple[dict, list[Any]]:
    """(header, lines) of the journal at `path`, which must be of `kind` (`what`: its name in words, "an
    evaluation"). Raises `error` naming what is wrong."""
    text = read_text(path, "kvviz journal", error)
    if not is_journal(text):
        raise error(f"{path} is not a kvviz journal")
    found, header, lines = parse_journal(text, str(path), error)
    if found != kind:
        raise error(f"{path} is the journal of a {found}, not of {what}")
    return header, lines


def parse_journal(text: str, source: str, error: type[KeptFileError] = KeptFileError) -> tuple[str, dict, list[Any]]:
    """(kind, header, lines) of a journal's text. A last line cut mid-write (no newline at its end, or not JSON)
    is dropped; a line that is not JSON before the last is damage, refused naming it."""
    lines = text.split("\n")
    lines.pop()  # what follows the last newline: empty, or a line whose write was cut short
    try:
        first = json.loads(lines[0]) if lines else None
    except ValueError:
        first = None
    if not isinstance(first, dict) or first.get("format") != FORMAT or not isinstance(first.get("header"), dict):
        raise error(f"{source} is not a complete kvviz journal: its first line is not a journal's header")
    if first.get("version") != VERSION:
        raise error(f"{source} is a kvviz journal of version {first.get('version')!r}; this kvviz reads {VERSION}")
    values = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            values.append(json.loads(line))
        except ValueError:
            if number == len(lines):  # the last line, cut short (or garbage left by a power cut)
                break
            raise error(f"{source}: line {number:,} of the journal is not JSON (only the last line may be cut "
                        "short)") from None
        except RecursionError:
            raise error(f"{source}: line {number:,} of the journal is nested too deeply to read") from None
    return str(first.get("kind")), first["header"], values


# -- resuming -------------------------------------------------------------------------------------------


def digest(value: Any) -> str:
    """The SHA-256 of a value's JSON: what a journal keeps of the text's tokens or the items asked, for a resume
    to check it reads the same ones."""
    import hashlib

    return hashlib.sha256(json.dumps(value, sort_keys=True, allow_nan=False).encode("ascii")).hexdigest()


def differences(theirs: dict, ours: dict, names: dict[str, str]) -> list[str]:
    """What differs between what a journal keeps for a resume to check (`theirs`: its "resume" header) and what the
    measurement about to continue it would keep (`ours`), in words: each key of `names` that differs, by its name,
    with both values where they can be shown."""
    found = []
    for key, name in names.items():
        if theirs.get(key) == ours.get(key):
            continue
        if key == "tokens_sha256":
            found.append(f"{name} (another text, or another part of it)")
        elif key == "model":
            found.append(f"{name} ({(theirs.get(key) or {}).get('name', '?')} there, {ours[key].get('name')} here, or "
                         "its dtype or device)")
        else:
            found.append(f"{name} ({_shown(theirs.get(key))} there, {_shown(ours.get(key))} here)")
    return found


def _shown(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(v, dict) and "name" in v for v in value):  # strategies
        from kvviz.present import strategy_label

        return ", ".join(strategy_label(v) for v in value)
    return json.dumps(value)
