"""The metadata and tensor names of a GGUF file, read from its header without its tensors or its tokenizer's strings.

gguf's own `GGUFReader` makes a numpy view of every value, which for the default model's 49k tokens and 49k merges
takes seconds; a model's config needs none of them. Here every array of strings is stepped over by the lengths of its
strings, undecoded, and kept as `Unread(count)`. Layout: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
(little-endian, version 2 or 3).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
VERSIONS = (2, 3)
STRING, ARRAY = 8, 9
# struct formats of the scalar value types, by GGUF type number
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@dataclass(frozen=True)
class Unread:
    """An array of strings the reader stepped over: only how many it holds is known."""

    count: int


@dataclass(frozen=True)
class GGUFHeader:
    metadata: dict[str, object]  # key -> int, float, bool, str, list, or Unread
    tensor_names: list[str]


class GGUFHeaderError(ValueError):
    """The file is not a GGUF this reader understands (the message says why)."""


def read_gguf_header(path: Path) -> GGUFHeader:
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _Parser(data, path).header()


class _Parser:
    def __init__(self, data: mmap.mmap, path: Path):
        self.data, self.path, self.at = data, path, 0

    def header(self) -> GGUFHeader:
        if self.data[:4] != MAGIC:
            raise GGUFHeaderError(f"{self.path.name} is not a GGUF file (it does not start with {MAGIC!r})")
        self.at = 4
        version = self.scalar("<I")
        if version not in VERSIONS:
            raise GGUFHeaderError(f"{self.path.name} is GGUF version {version}; this reader reads versions 2 and 3")
        tensor_count, kv_count = self.scalar("<Q"), self.scalar("<Q")
        metadata = {}
        for _ in range(kv_count):
            key = self.string()
            metadata[key] = self.value(self.scalar("<I"))
        names = []
        for _ in range(tensor_count):
            names.append(self.string())
            dims = self.scalar("<I")
            self.at += 8 * dims + 4 + 8  # the shape, the type, the offset of its data
        return GGUFHeader(metadata, names)

    def value(self, kind: int) -> object:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item == STRING:
                for _ in range(count):
                    self.at += 8 + self.scalar("<Q")
                return Unread(count)
            return [self.value(item) for _ in range(count)]
        if kind not in SCALARS:
            raise GGUFHeaderError(f"{self.path.name} holds a value of unknown GGUF type {kind} at byte {self.at}")
        return self.scalar(SCALARS[kind])

    def scalar(self, fmt: str):
        try:
            (value,) = struct.unpack_from(fmt, self.data, self.at)
        except struct.error:
            raise GGUFHeaderError(f"{self.path.name} ends inside its header (at byte {self.at})") from None
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        raw = self.data[self.at:self.at + length]
        if len(raw) != length:
            raise GGUFHeaderError(f"{self.path.name} ends inside its header (at byte {self.at})")
        self.at += length
        return raw.decode("utf-8", errors="replace")
