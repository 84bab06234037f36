"""Reading and writing kvviz's JSON files safely.

`read_json(path)` refuses, by name, whatever is not a regular UTF-8 JSON file of sane size: a
missing file, a folder, a FIFO or device (never opened in a way that could hang), a symlink loop,
a huge file, another encoding, invalid UTF-8, a file cut short, nesting deeper than Python can
parse. Every refusal is a `KeptFileError` (or the subclass the caller names) with a message of
kvviz's own; what the JSON means is checked afterwards by the format's schema (`kvviz.files.schema`).

`write_atomic(path, bytes)` is the one way kvviz saves a file (`write_json` for JSON, where
non-finite numbers become null so that the file is always valid JSON): written to a unique
temporary file in the same folder, flushed to disk and renamed over `path`, so that a reader or a
crash never sees half a file. The temporary file is removed on any failure, and ones a killed kvviz
left behind are removed on the next save to the same path. On the main thread SIGINT and SIGTERM
are held back until the save is complete, then take effect: Ctrl-C during the final save of a run
still leaves the whole trace.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import secrets
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# The largest file kvviz reads. A step of a 30-layer model costs about 4.2 KB of JSON, so 128 MiB
# holds about 30,000 steps, far beyond any run a desktop makes. Reading takes about 12 times a
# file's size in memory at its peak (parsed JSON, then the records; measured: 141 MiB for a 12 MiB
# trace), so the limit keeps a damaged or foreign file from costing more than about 1.5 GB.
MAX_FILE_BYTES = 128 * 2**20


class KeptFileError(ValueError):
    """A file kvviz reads is unreadable or not what it claims; the message names the file and the problem."""


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_DEFERRED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM") if hasattr(signal, name))


# -- reading --------------------------------------------------------------------------------------------


def read_json(path: str | os.PathLike, kind: str = "kvviz file", error: type[KeptFileError] = KeptFileError) -> Any:
    """The parsed JSON of a file kvviz keeps. NaN and Infinity literals come back as floats for the
    schema to judge by field; everything that stops the file from being parsed raises `error`."""
    return parse_json(read_text(path, kind, error), path, kind, error)


def read_text(path: str | os.PathLike, kind: str = "kvviz file", error: type[KeptFileError] = KeptFileError) -> str:
    """The UTF-8 text of a file kvviz keeps, refused by name where it is not a regular file of sane size."""
    return decode_text(_read_bytes(Path(path), error), path, kind, error)


def parse_json(text: str, path, kind: str = "kvviz file", error: type[KeptFileError] = KeptFileError) -> Any:
    """`text` (read from `path`) parsed as JSON; what stops it raises `error` naming the file and the place."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()):
            raise error(f"{path} is not a complete {kind}: the JSON text stops short (the file was cut off)") from None
        raise error(
            f"{path} is not a {kind}: it is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise error(f"{path} is not a {kind}: its JSON is nested too deeply to read") from None
    except ValueError:  # json's int() refuses numbers of more than 4,300 digits
        raise error(f"{path} is not a {kind}: it holds a number with thousands of digits") from None


def _read_bytes(path: Path, error: type[KeptFileError]) -> bytes:
    # O_NONBLOCK: opening a FIFO for reading must not wait for a writer; regular files ignore it.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise error(_cannot_open(path, exc)) from None
    except ValueError:  # a NUL character in the name
        raise error(f"cannot read {str(path)!r}: that is not a possible file name") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{path} is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path} is not a regular file (a pipe, socket or device); kvviz reads files only")
        if info.st_size > MAX_FILE_BYTES:
            raise error(f"{path} is {_mib(info.st_size)}; kvviz reads files of up to {_mib(MAX_FILE_BYTES)}")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_FILE_BYTES:  # it grew while being read
                raise error(f"{path} is larger than {_mib(MAX_FILE_BYTES)}, the most kvviz reads")
            chunks.append(chunk)
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or 'the system refused'}") from None
    finally:
        os.close(fd)
    if not total:
        raise error(f"{path} is empty")
    return b"".join(chunks)


def _cannot_open(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return f"cannot read {path}: there is no such file"
    if exc.errno == errno.ELOOP:
        return f"cannot read {path}: it is a symbolic link that points back to itself (a loop)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"cannot read {path}: permission denied"
    return f"cannot read {path}: {exc.strerror or 'the system refused to open it'}"


def decode_text(raw: bytes, path, kind: str = "kvviz file", error: type[KeptFileError] = KeptFileError) -> str:
    """A file's bytes as text; a character cut short at the very end (a write cut mid-way) is left out, so that
    what precedes it still reads (a journal) or the file is said to be cut off (JSON)."""
    if raw.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        raise error(f"{path} is not a {kind}: it is UTF-32 text; kvviz files are UTF-8")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise error(f"{path} is not a {kind}: it is UTF-16 text; kvviz files are UTF-8")
    if raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark some editors add to UTF-8
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":
            return raw[: exc.start].decode("utf-8")
        bad = raw[exc.start]
        raise error(
            f"{path} is not a {kind}: it is not UTF-8 text"
            f" (byte 0x{bad:02x} at offset {exc.start:,} is not valid UTF-8)"
        ) from None


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n:,} bytes"


# -- writing --------------------------------------------------------------------------------------------


def write_json(path: str | os.PathLike, data: Any | Callable[[], Any]) -> Path:
    """Save `data` (or what the callable `data` returns, built while signals wait) as JSON at `path`:
    `write_atomic`, with NaN and infinities written as null."""

    return write_atomic(path, lambda: encode_json(data() if callable(data) else data))


def encode_json(content: Any) -> bytes:
    """`content` as compact UTF-8 JSON on one line, NaN and infinities written as null."""
    try:
        return _dumps(content)
    except (ValueError, UnicodeEncodeError):  # a NaN or a lone surrogate somewhere: walk and mend, then dump
        return _dumps(_finite(content))


def write_atomic(path: str | os.PathLike, data: bytes | Callable[[], bytes]) -> Path:
    """The one way kvviz saves a file (a trace, a session, a CSV): whole or not at all, never a `.part` left.

    `data` may be a callable, run while SIGINT and SIGTERM wait. Raises OSError (naming the path or
    its folder) if the folder is missing or not writable or the disk is full; `path` is then unchanged.
    """
    path = Path(path)
    with deferred_signals():
        content = data() if callable(data) else data
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "it is a folder", str(path))
        remove_stale_parts(path)
        tmp, fd = _create_part(path)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(content)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        sync_folder(path.parent)
    return path


def part_name(path: Path, pid: int, tag: str) -> Path:
    """The temporary file of a save to `path` by process `pid`: hidden, beside it, unique."""
    return path.with_name(f".{path.name}.{pid}-{tag}.part")


def remove_stale_parts(path: Path) -> list[Path]:
    """Delete the temporary files of saves to `path` by processes that no longer run (killed while
    saving), and the ``<name>.part`` older kvviz versions wrote. Returns what was removed."""
    removed = []
    candidates = [path.with_name(path.name + ".part")]
    with contextlib.suppress(OSError):
        candidates += list(path.parent.glob(f".{_glob_escape(path.name)}.*-*.part"))
    for candidate in candidates:
        if candidate.name != path.name + ".part":
            pid_text = candidate.name[len(path.name) + 2 :].split("-", 1)[0]
            if not pid_text.isdigit() or process_alive(int(pid_text)):
                continue
        try:
            candidate.unlink()
            removed.append(candidate)
        except OSError:
            pass
    return removed


def _create_part(path: Path) -> tuple[Path, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = part_name(path, os.getpid(), secrets.token_hex(4))
        try:
            # O_EXCL: never write into someone else's file; mode 0o666 lets the umask decide, as for any new file
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:  # name the folder the user chose, not our hidden temporary file
            raise type(exc)(exc.errno, exc.strerror, str(path.parent)) from None


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs (ours, or anyone's)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def sync_folder(folder: Path) -> None:
    """Make the rename itself durable (a power cut after it keeps the new file)."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _dumps(content: Any) -> bytes:
    return json.dumps(content, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _finite(value: Any) -> Any:
    """A copy of `value` that JSON can hold: NaN and infinities become null (unknown), text that is
    not Unicode (lone surrogates, e.g. from undecodable command-line bytes) gets U+FFFD."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is str:
        return value if value.isascii() else _LONE_SURROGATE.sub("\ufffd", value)
    if kind is dict:
        return {_finite(str(k)): _finite(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_finite(v) for v in value]
    return value


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then let them act as they would have.

    Python runs signal handlers on the main thread only, so this works there (and is a no-op
    elsewhere, where Python could not act on the signal mid-save anyway). Nested use is fine.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {}
    for sig in _DEFERRED_SIGNALS:
        handler = signal.getsignal(sig)
        if handler is None or getattr(handler, "_kvviz_deferring", False):
            continue  # installed outside Python (cannot restore it), or an outer block already defers
        try:
            signal.signal(sig, _deferring(caught))
        except (ValueError, OSError):
            continue
        previous[sig] = handler
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(caught):
            if previous.get(sig) not in (signal.SIG_IGN, None):
                signal.raise_signal(sig)


def _deferring(caught: list[int]) -> Callable[[int, Any], None]:
    def handler(signum, frame) -> None:
        caught.append(signum)

    handler._kvviz_deferring = True  # type: ignore[attr-defined]
    return handler
