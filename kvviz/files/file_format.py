"""One kind of kvviz file: its "format" name and version, its schema, and how the checked JSON becomes its object.

A file format is data, not reader code: a `FileFormat` names its ``"format"`` string, its version,
a `kvviz.files.schema.Record` schema and a `build` function that turns the checked JSON into kvviz's objects.
Every refusal is a `KeptFileError` (`kvviz.files.jsonfile`) naming the file and the first problem.

Adding a format: declare its schema with `kvviz.files.schema`'s specs, write `build`, define
``FILE_FORMAT = FileFormat(...)`` in its module and add one line to `kvviz.files.formats.FORMATS`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvviz.files.jsonfile import KeptFileError, read_json
from kvviz.files.schema import Record, Refusal, describe, path_text, quoted


@dataclass(frozen=True)
class FileFormat:
    """One kind of kvviz file: ``{"format": name, "version": version, ...}`` checked by `schema`."""

    name: str  # the "format" field, e.g. "kvviz-trace"
    version: int
    kind: str  # how messages call it, e.g. "kvviz trace"
    schema: Record
    build: Callable[[dict], Any]  # checked JSON -> kvviz's object
    error: type[KeptFileError] = KeptFileError
    hints: dict[str, str] = field(default_factory=dict)  # another format's name -> what to do with it
    # (header, lines, source) of a journal a killed process left (kvviz.files.journal) -> the partial object
    from_journal: Callable[[dict, list, str], Any] | None = None
    # the built object -> the summary its records give; a file's "summary" must agree with it (`agrees`)
    summary: Callable[[Any], dict] | None = None

    def read(self, path: str | os.PathLike) -> Any:
        """Read, check and build a file that must be of this format."""
        return self.parse(read_json(path, self.kind, self.error), str(path))

    def parse(self, data: Any, source: str) -> Any:
        """The object a file's parsed JSON describes; raises `error` naming the first problem."""
        found = data.get("format") if isinstance(data, dict) else None
        if found != self.name:
            hint = self.hints.get(found, "") if isinstance(found, str) else ""
            raise self.error(f'{source} is not a {self.kind}: expected "format": "{self.name}" at the top level{hint}')
        version = data.get("version")
        if version is None:
            raise self.error(f'{source} is a {self.kind} without a "version" field; this kvviz reads version '
                             f'{self.version}')
        if version != self.version or type(version) is not int:
            shown = quoted(version) if isinstance(version, str) else describe(version)
            raise self.error(f"{source} is a {self.kind} of version {shown}; this kvviz reads version {self.version}")
        try:
            checked = self.schema.check(data, None)
            built = self.build(checked)
            if self.summary is not None and checked.get("summary") is not None:
                agrees(checked["summary"], self.summary(built), ((None, "summary")))
        except Refusal as refusal:
            found_text = f", found {describe(refusal.found)}" if refusal.show_found else ""
            raise self.error(f"{source}: {path_text(refusal.where)}: expected {refusal.expected}{found_text}") from None
        return built


def agrees(found: Any, derived: Any, where) -> None:
    """Refuse a kept summary (`found`) that says other than what the file's records give (`derived`): every name
    both hold must hold the same value (numbers to 1e-9 relative, which JSON's round trip keeps exactly; a
    non-finite figure is written as null). Names only one of them holds are left alone: another kvviz version
    may summarize more or less."""
    if isinstance(derived, dict):
        if type(found) is not dict:
            raise Refusal(where, "an object (what the records give)", found)
        for key in found.keys() & derived.keys():
            agrees(found[key], derived[key], (where, key))
        return
    if isinstance(derived, (list, tuple)):
        if type(found) is not list or len(found) != len(derived):
            raise Refusal(where, f"a list of {len(derived)} (what the records give)", found)
        for i, (a, b) in enumerate(zip(found, derived, strict=True)):
            agrees(a, b, (where, i))
        return
    if isinstance(derived, float) and not math.isfinite(derived):
        derived = None
    if derived is None or isinstance(derived, (bool, str)):
        same = found is None if derived is None else type(found) is type(derived) and found == derived
    else:  # a number
        same = type(found) in (int, float) and math.isclose(found, derived, rel_tol=1e-9, abs_tol=1e-12)
    if not same:
        raise Refusal(where, f"{describe(derived)} (what the file's records give)", found)
