"""How an answer is scored against its references: RULER's metrics, written from their definition.

RULER (NVIDIA, Apache-2.0; `scripts/eval/synthetic/constants.py` and `scripts/eval/evaluate.py` of
github.com/NVIDIA/RULER) scores a prediction by whether each reference occurs in it, case-insensitively, after
the prediction's control characters are turned into line breaks and its ends stripped:

- `string_match_all`: the share of the references found (every needle of a multi-value item counts);
- `string_match_part`: 1 when any reference is found (its question-answering tasks).

RULER reports the mean over a task's items times 100, rounded; kvviz keeps each item's share (0-1) and averages
them itself. kvpress scores its RULER runs the same way. SCBench's key-value retrieval scores `label in
prediction`, which is `string_match_all` of its one reference up to case.
"""

from __future__ import annotations

import re

METRICS = ("string_match_all", "string_match_part")
_CONTROL = re.compile(r"[\x00-\x1f]")


def clean(prediction: str) -> str:
    """The prediction as RULER scores it: control characters become line breaks, the ends are stripped."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, references: list[str]) -> float:
    """The share of `references` found in `prediction`, case-insensitively (0 to 1)."""
    if not references:
        raise ValueError("a question needs at least one reference answer to be scored")
    said = clean(prediction).lower()
    return sum(1.0 for r in references if r.lower() in said) / len(references)


def string_match_part(prediction: str, references: list[str]) -> float:
    """1 when any of `references` is found in `prediction`, case-insensitively, else 0."""
    if not references:
        raise ValueError("a question needs at least one reference answer to be scored")
    said = clean(prediction).lower()
    return 1.0 if any(r.lower() in said for r in references) else 0.0


def score(metric: str, prediction: str, references: list[str]) -> float:
    """The prediction's score (0 to 1) by the metric named (one of METRICS)."""
    return {"string_match_all": string_match_all, "string_match_part": string_match_part}[metric](
        prediction, references)
