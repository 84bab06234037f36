"""What one cell of the cache map (or of the attention view) stands for: the token at its position, and how many
of the layer's KV heads still hold it.

Per-head eviction (H2O, SnapKV, key norm) keeps different positions in different KV heads; a layer's record
then carries `head_spans`, run-length pairs [KV heads holding the position, count]. The cache map draws a
position held by some heads but not all as the image value `RAMP_START + round(share * RAMP_STEPS)`, which the
theme's lookup table maps to full precision's colour, fainter the fewer heads hold it (theme.held_share_colour).
"""

from __future__ import annotations

import numpy as np

from kvviz.files.trace import LayerRecord, Trace

RAMP_START = 128  # image values RAMP_START .. RAMP_START + RAMP_STEPS: a share of KV heads, from 0 to 1
RAMP_STEPS = 127


def token_at(trace: Trace, position: int) -> str | None:
    """The text of the token at absolute `position`: a prompt token, or the token a step produced; None where
    the trace does not say (a file written before kvviz kept prompt pieces, or a position not reached)."""
    if position < 0:
        return None
    if "attention+cross" in ((trace.model or {}).get("cache_kinds") or ()):  # an encoder-decoder's decoder:
        index = position - 1  # its start token (unnamed), then the tokens it generated; the prompt went to the encoder
        return trace.steps[index].token if 0 <= index < len(trace.steps) else None
    if position < trace.prompt_tokens:
        pieces = trace.prompt_pieces
        return pieces[position] if position < len(pieces) else None
    index = position - trace.prompt_tokens
    return trace.steps[index].token if index < len(trace.steps) else None


def quoted(token: str | None) -> str:
    """A token for a readout: quoted, with line breaks and tabs written out; "" when unknown."""
    if token is None:
        return ""
    if token.strip("\ufffd") == "":  # bytes of a character that the next token completes
        return "(part of a character)"
    return "'" + token.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r") + "'"


def cell_name(trace: Trace | None, layer: int, position: int) -> str:
    """Where a cell is, and its token where known: "layer 14, position 79 ' cat'" (plain text)."""
    token = quoted(token_at(trace, position)) if trace is not None else ""
    return f"layer {layer}, position {position}" + (f" {token}" if token else "")


def kv_heads(trace: Trace, layer: LayerRecord) -> int | None:
    """The KV heads of a layer: the model card's count, else the most heads any of its positions is held by."""
    heads = (trace.model or {}).get("num_kv_heads")
    if isinstance(heads, int) and heads > 0:
        return heads
    return max((count for count, _ in layer.head_spans or ()), default=None) or None


def head_counts(layer: LayerRecord) -> np.ndarray | None:
    """Per position 0, 1, ...: how many KV heads hold it; None when every head holds the same positions."""
    if not layer.head_spans:
        return None
    spans = np.asarray(layer.head_spans, dtype=np.int64).reshape(-1, 2)
    return np.repeat(spans[:, 0], np.maximum(spans[:, 1], 0))


def heads_at(layer: LayerRecord, position: int) -> int | None:
    """How many KV heads hold `position` (per-head layers only; None otherwise or past the spans)."""
    start = 0
    for count, run in layer.head_spans or ():
        if position < start + run:
            return count
        start += run
    return None


def shade_partial(row: np.ndarray, counts: np.ndarray, heads: int | None) -> None:
    """Write the ramp value into the cells of `row` (image values of one layer) held by some heads but not all."""
    if not heads:
        return
    n = min(len(row), len(counts))
    counts = counts[:n]
    partial = (counts > 0) & (counts < heads)
    if partial.any():
        share = counts[partial] / heads
        row[:n][partial] = (RAMP_START + np.rint(share * RAMP_STEPS)).astype(np.uint8)
