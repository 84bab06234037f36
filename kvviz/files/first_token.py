"""What serving one request cost up to its first token (`kvviz.engine.first_token` measures it): the process's peak
memory and the time to first token, at the prompt length measured and at another, predicted from it; and how a sweep
keeps both. Plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvviz.files.schema import MAX_BYTES, Flag, Int, Number, Record, Text
from kvviz.files.trace_schema import MAX_POSITIONS


@dataclass
class FirstToken:
    """One request's prefill through a fresh cache, measured: its prompt's length, the token it picked, the process's
    peak memory (the model's weights and buffers and the most the request allocated at once), the cache it left and
    the time to its first token."""

    tokens: int
    token_id: int
    peak_bytes: int | None  # None: not counted on this device
    weight_bytes: int  # the model's parameters and buffers, held before any request
    cache_bytes: int | None  # the cache and its policy's state after the prefill
    ttft_ms: float
    attention: str  # the model's attention implementation (eager's grows with the square of the prompt)

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "token_id": self.token_id, "peak_bytes": self.peak_bytes,
                "weight_bytes": self.weight_bytes, "cache_bytes": self.cache_bytes, "ttft_ms": self.ttft_ms,
                "attention": self.attention}


@dataclass(frozen=True)
class FirstTokenAt:
    """The peak memory and time to first token of one request of `tokens` tokens: measured, or predicted from a
    measurement at another length."""

    tokens: int
    peak_bytes: int | None
    ttft_ms: float | None
    predicted: bool

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "peak_bytes": self.peak_bytes, "ttft_ms": self.ttft_ms,
                "predicted": self.predicted}


_BYTES = Int(0, MAX_BYTES, null=True, what="a byte count")
_MS = Number(0, what="a time in ms")
FIRST_TOKEN = Record(
    {"tokens": Int(1, MAX_POSITIONS), "token_id": Int(0), "peak_bytes": _BYTES,
     "weight_bytes": Int(0, MAX_BYTES, what="a byte count"), "cache_bytes": _BYTES, "ttft_ms": _MS,
     "attention": Text(nonempty=True)},
    null=True, what="a request's prefill, measured (an object)",
)
FIRST_TOKEN_AT = Record({"tokens": Int(1, MAX_POSITIONS), "peak_bytes": _BYTES, "ttft_ms": Number(0, null=True),
                         "predicted": Flag()},
                        null=True, what="a request's peak memory and time to first token (an object)")


def build(data: dict | None) -> FirstToken | None:
    """A checked FIRST_TOKEN record as a `FirstToken` (None for null)."""
    return None if data is None else FirstToken(**data)


def build_at(data: dict | None) -> FirstTokenAt | None:
    return None if data is None else FirstTokenAt(**data)
