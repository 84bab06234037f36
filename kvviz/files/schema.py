"""Declared schemas for the files kvviz reads: types, ranges and cross-field rules, checked before use.

A schema is made of small specs (`Int`, `Number`, `Text`, `Flag`, `ListOf`, `Pair`, `MapOf`,
`Record`, `Json`, `Either`); a `Record` may carry rules, functions that look at the checked record as a whole
and refuse what its fields allow one by one but not together (for example, a step's bytes that do
not add up). A spec refuses a value with a `Refusal`, which `kvviz.files.file_format.FileFormat` turns into a
`KeptFileError` (`kvviz.files.jsonfile`) whose message names the file, the field path
(``steps[1].layers[0].storage``), what was expected and what was found; nothing else escapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_BYTES = 2**53  # byte counts above 8 PiB are nonsense, and float64 holds every integer up to here exactly
MAX_INT = 2**63 - 1  # free-form integers must fit the 64-bit integers of numpy and Qt


class Refusal(Exception):
    """Internal: one value does not fit its spec. `kvviz.files.file_format.FileFormat.parse` turns it into a
    KeptFileError."""

    def __init__(self, where: Any, expected: str, found: Any = None, show_found: bool = True):
        super().__init__(expected)
        self.where, self.expected, self.found, self.show_found = where, expected, found, show_found


# A place in the document (`where` below) is None at the top, else (parent, key) with key a field
# name or a list index: built in O(1) per value, and spelled out only when a value is refused.


def at(where, *keys) -> Any:
    for key in keys:
        where = (where, key)
    return where


def path_text(where) -> str:
    """``steps[1].layers[0].storage`` for the place `where`."""
    parts: list[str] = []
    while where is not None:
        where, key = where
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif key.isidentifier():
            parts.append(f".{key}")
        else:
            parts.append(f"[{quoted(key)}]")
    text = "".join(reversed(parts)).lstrip(".")
    return text or "the top level"


def describe(value: Any) -> str:
    """What was found, in words, short enough for a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        text = str(value) if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
        return text
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, str):
        return f"the text {quoted(value)}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return "something that is not JSON"


def quoted(text: str, limit: int = 40) -> str:
    """`text` in double quotes, cut to `limit` characters and escaped to ASCII, short enough for a message."""
    text = text if len(text) <= limit else text[: limit - 1] + "~"
    return '"' + text.encode("ascii", "backslashreplace").decode("ascii").replace('"', '\\"') + '"'


def _text_ok(text: str, where) -> str:
    """JSON lets a file carry lone surrogates (\\ud800), which are not text: printing them fails later."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Refusal(
            where, "text (this has an unpaired \\ud800-\\udfff escape, which is not a character)", text
        ) from None
    return text


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e18 else f"{x:g}"


def _or_null(expected: str, null: bool) -> str:
    return f"{expected} or null" if null else expected


# -- specs --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Int:
    """A whole number (not true/false, not 2.0) in [min, max]; `what` names it in messages ("a byte count")."""

    min: int | None = None
    max: int | None = MAX_INT
    null: bool = False
    what: str = ""

    @property
    def expected(self) -> str:
        if self.min is not None and self.max is not None and self.max != MAX_INT:
            text = f"a whole number from {_num(self.min)} to {_num(self.max)}"
        elif self.min is not None:
            text = f"a whole number >= {_num(self.min)}"
        else:
            text = "a whole number"
        return _or_null(f"{self.what} ({text})" if self.what else text, self.null)

    def check(self, value: Any, where) -> int | None:
        if value is None and self.null:
            return None
        if type(value) is not int:
            raise Refusal(where, self.expected, value)
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            raise Refusal(where, self.expected, value)
        return value


@dataclass(frozen=True)
class Number:
    """A finite number (whole or not) in [min, max]; comes back as a float."""

    min: float | None = None
    max: float | None = None
    null: bool = False
    infinite: bool = False  # also +/-Infinity (a histogram's last bucket bound)
    what: str = ""

    @property
    def expected(self) -> str:
        text = "a number" if self.infinite else "a finite number"
        if self.min is not None and self.max is not None:
            text += f" from {_num(self.min)} to {_num(self.max)}"
        elif self.min is not None:
            text += f" >= {_num(self.min)}"
        elif self.max is not None:
            text += f" <= {_num(self.max)}"
        return _or_null(f"{self.what} ({text})" if self.what else text, self.null)

    def check(self, value: Any, where) -> float | None:
        if value is None and self.null:
            return None
        if type(value) is int:
            if abs(value) > MAX_BYTES:  # float() of a huge int overflows or loses the value
                raise Refusal(where, self.expected, value)
            value = float(value)
        elif type(value) is not float or math.isnan(value) or (math.isinf(value) and not self.infinite):
            raise Refusal(where, self.expected, value)
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            if not (self.infinite and math.isinf(value)):
                raise Refusal(where, self.expected, value)
        return value


@dataclass(frozen=True)
class Text:
    choices: tuple[str, ...] | None = None
    null: bool = False
    nonempty: bool = False

    @property
    def expected(self) -> str:
        if self.choices:
            text = "one of " + ", ".join(f'"{c}"' for c in self.choices)
        else:
            text = "non-empty text" if self.nonempty else "text"
        return _or_null(text, self.null)

    def check(self, value: Any, where) -> str | None:
        if value is None and self.null:
            return None
        if type(value) is not str or (self.nonempty and not value):
            raise Refusal(where, self.expected, value)
        if self.choices is not None and value not in self.choices:
            raise Refusal(where, self.expected, value)
        return _text_ok(value, where)


@dataclass(frozen=True)
class Flag:
    null: bool = False

    @property
    def expected(self) -> str:
        return _or_null("true or false", self.null)

    def check(self, value: Any, where) -> bool | None:
        if value is None and self.null:
            return None
        if type(value) is not bool:
            raise Refusal(where, self.expected, value)
        return value


@dataclass(frozen=True)
class ListOf:
    item: Any
    null: bool = False

    @property
    def expected(self) -> str:
        return _or_null(f"a list (each item {self.item.expected})", self.null)

    def check(self, value: Any, where) -> list | None:
        if value is None and self.null:
            return None
        if type(value) is not list:
            raise Refusal(where, self.expected, value)
        check = self.item.check
        return [check(item, (where, i)) for i, item in enumerate(value)]


@dataclass(frozen=True)
class Pair:
    """A two-item list ``[first, second]``."""

    first: Any
    second: Any
    what: str = ""  # e.g. "span [slot state, count]"; spelled out from the items when empty

    @property
    def expected(self) -> str:
        return f"a {self.what}" if self.what else f"a pair [{self.first.expected}, {self.second.expected}]"

    def check(self, value: Any, where) -> list:
        if type(value) is not list or len(value) != 2:
            raise Refusal(where, self.expected, value)
        return [self.first.check(value[0], (where, 0)), self.second.check(value[1], (where, 1))]


@dataclass(frozen=True)
class MapOf:
    """An object with any (or the listed) names, each value of one spec."""

    value: Any
    keys: tuple[str, ...] | None = None
    null: bool = False

    @property
    def expected(self) -> str:
        names = f" with names among {', '.join(self.keys)}" if self.keys else ""
        return _or_null(f"an object{names} (each value {self.value.expected})", self.null)

    def check(self, value: Any, where) -> dict | None:
        if value is None and self.null:
            return None
        if type(value) is not dict:
            raise Refusal(where, self.expected, value)
        out = {}
        for key, item in value.items():
            _text_ok(key, (where, key))
            if self.keys is not None and key not in self.keys:
                raise Refusal((where, key), f"a name among {', '.join(self.keys)}", key)
            out[key] = self.value.check(item, (where, key))
        return out


@dataclass(frozen=True)
class Json:
    """Free-form JSON (a model card, options, settings): finite numbers, real text, at most `depth` levels."""

    depth: int = 2
    null: bool = True

    @property
    def expected(self) -> str:
        return f"JSON of at most {self.depth} nested levels, with finite numbers"

    def check(self, value: Any, where, depth: int | None = None) -> Any:
        depth = self.depth if depth is None else depth
        kind = type(value)
        if value is None:
            if self.null or depth < self.depth:
                return None
            raise Refusal(where, self.expected, value)
        if kind is str:
            return _text_ok(value, where)
        if kind is bool:
            return value
        if kind is int:
            if abs(value) > MAX_INT:
                raise Refusal(where, "a whole number that fits 64 bits", value)
            return value
        if kind is float:
            if not math.isfinite(value):
                raise Refusal(where, "a finite number or null", value)
            return value
        if kind is list or kind is dict:
            if depth <= 0:
                raise Refusal(
                    where,
                    f"a plain value (this part of the file is nested more than {self.depth} levels)",
                    show_found=False,
                )
            if kind is list:
                return [self.check(v, (where, i), depth - 1) for i, v in enumerate(value)]
            return {_text_ok(k, (where, k)): self.check(v, (where, k), depth - 1) for k, v in value.items()}
        raise Refusal(where, self.expected, value)


@dataclass(frozen=True)
class Either:
    """A value that `first` or, failing that, `second` accepts (an older writer's spelling beside today's)."""

    first: Any
    second: Any

    @property
    def expected(self) -> str:
        return f"{self.first.expected}, or {self.second.expected}"

    def check(self, value: Any, where) -> Any:
        for spec in (self.first, self.second):
            try:
                return spec.check(value, where)
            except Refusal:
                continue
        raise Refusal(where, self.expected, value)


_ABSENT = object()


@dataclass(frozen=True)
class Field:
    spec: Any
    required: bool = True
    default: Any = None

    @property
    def stands_in(self) -> bool:
        """Whether the default also stands in for null (it does where it is a value, e.g. [] or "own")."""
        return not self.required and self.default is not None and self.default is not _ABSENT

    def missing(self) -> Any:
        return type(self.default)() if isinstance(self.default, (list, dict)) else self.default


def optional(spec: Any, default: Any = None) -> Field:
    """A field older or other writers may leave out; `default` stands in for it, and for null."""
    return Field(spec, required=False, default=default)


def maybe(spec: Any) -> Field:
    """A field checked where present and left out where absent (free-form records such as a model card)."""
    return Field(spec, required=False, default=_ABSENT)


Rule = Callable[[dict, Any], None]  # rule(checked_record, where): raises Refusal


@dataclass(frozen=True)
class Record:
    """An object with declared fields. Unknown names are ignored (a later kvviz may add fields) unless
    `extra` is a spec, in which case they are checked and kept."""

    fields: dict[str, Any]
    rules: tuple[Rule, ...] = ()
    extra: Any = None
    null: bool = False
    what: str = "an object"

    def __post_init__(self) -> None:
        fields = {k: f if isinstance(f, Field) else Field(f) for k, f in self.fields.items()}
        object.__setattr__(self, "fields", fields)

    @property
    def expected(self) -> str:
        return _or_null(self.what, self.null)

    def check(self, value: Any, where) -> dict | None:
        if value is None and self.null:
            return None
        if type(value) is not dict:
            raise Refusal(where, self.expected, value)
        out = {}
        for key, declared in self.fields.items():
            if key in value:
                if value[key] is None and declared.stands_in:
                    out[key] = declared.missing()
                else:
                    out[key] = declared.spec.check(value[key], (where, key))
            elif declared.required:
                raise Refusal((where, key), f"{declared.spec.expected}; the field is missing", show_found=False)
            elif declared.default is not _ABSENT:
                out[key] = declared.missing()
        if self.extra is not None:
            for key in value.keys() - self.fields.keys():
                out[_text_ok(key, (where, key))] = self.extra.check(value[key], (where, key))
        for rule in self.rules:
            rule(out, where)
        return out
