"""Every kind of file kvviz reads, and the one reader for all of them.

`read_kept(path)` reads any kvviz file (the window's File > Open, drag and drop and ``--open``):
the file's ``"format"`` field picks the `FileFormat` declared in the module listed here, whose
schema checks it before anything is built. Modules load only when their format is read, so reading
a trace imports neither the attach client nor torch. A journal a killed process left
(`kvviz.files.journal`) reads as the partial object it holds, through its kind's `from_journal`.

A new format adds one line here and a ``FILE_FORMAT`` in its own module; no reader code.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from kvviz.files import journal
from kvviz.files.file_format import FileFormat
from kvviz.files.jsonfile import KeptFileError, parse_json, read_text

# "format" field -> the module that declares FILE_FORMAT for it
FORMATS = {
    "kvviz-trace": "kvviz.files.trace_schema",
    "kvviz-attach": "kvviz.attach.session",
    "kvviz-eval": "kvviz.files.evaluation",
    "kvviz-conversation": "kvviz.files.conversation",
    "kvviz-sweep": "kvviz.files.sweep_schema",
    "kvviz-serve": "kvviz.files.serve_trace",
}


def file_format(name: str) -> FileFormat:
    return importlib.import_module(FORMATS[name]).FILE_FORMAT


def read_kept(path: str | os.PathLike) -> Any:
    """The object a kvviz file holds (a Trace, a Session, ...). Raises KeptFileError (the format's own
    subclass once the format is known) naming the file, the field and what was expected."""
    return kept_from_text(read_text(path), str(path))


def kept_from_text(text: str, source: str) -> Any:
    """`read_kept` of a file's text (`source` names it in messages)."""
    if journal.is_journal(text):
        kind, header, lines = journal.parse_journal(text, source)
        kept = file_format(kind) if kind in FORMATS else None
        if kept is None or kept.from_journal is None:
            raise KeptFileError(f"{source} is a journal of a kind this kvviz does not read ({kind!r})")
        return kept.from_journal(header, lines, source)
    data = parse_json(text, source)
    name = data.get("format") if isinstance(data, dict) else None
    if not isinstance(name, str) or name not in FORMATS:
        known = ", ".join(f'"{n}"' for n in FORMATS)
        raise KeptFileError(f'{source} is not a kvviz file: expected "format" at the top level to be one of {known}')
    return file_format(name).parse(data, source)
