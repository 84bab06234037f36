"""Both sides of a comparison: kvpress's answers (packaging/kvpress/reference.py, run in its own venv) and kvviz's
(its strategies through `CacheRun`, what every kvviz command feeds a model through), on the same token ids."""

from __future__ import annotations

import json
import os
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from .cases import CASES, Case
from .needles import Needle

REFERENCE = Path(__file__).resolve().parents[2] / "packaging" / "kvpress" / "reference.py"
_PYTHON = os.environ.get("KVVIZ_KVPRESS_PYTHON")
KVPRESS_PYTHON = _PYTHON if _PYTHON and Path(_PYTHON).is_file() else None  # the kvpress venv's python
NEW_TOKENS = 12  # the answer after RULER's prefix: ": 1234567." and a little more
TIE = 1e-4  # relative: scores nearer than this are a tie in float32 (`rounding_tie`)


def cases() -> list[Case]:
    """The cases compared: all, or those KVVIZ_KVPRESS_CASES names (e.g. kvzip,think)."""
    named = os.environ.get("KVVIZ_KVPRESS_CASES")
    return [case for case in CASES if not named or case.name in named.split(",")]


def budgets() -> tuple[int, ...]:
    """The budgets compared: 256, or KVVIZ_KVPRESS_BUDGETS (e.g. 128,256,512 for the needle table)."""
    return tuple(int(b) for b in os.environ.get("KVVIZ_KVPRESS_BUDGETS", "256").split(","))


@dataclass
class Answer:
    """What one side kept after the prefill and said: per layer and KV head the positions kept (or, for ThinK, the
    key channels zeroed), and the greedy tokens."""

    kept: list[list[list[int]]] | None
    tokens: list[int]
    channels: list[list[list[int]]] | None = None
    decoded: list[list[list[int]]] | None = None  # what is kept after decoding (a press that compresses then)
    scores: dict | None = None  # kvviz's side: {layer: [per KV head {position: score}]} its prefill ranked by


def kvpress_answers(python: str, folder: Path, prompts: list[tuple[str, list[int], list[str]]], work: Path) -> dict:
    """{(prompt, case id): Answer} from kvpress, each prompt (name, token ids, the case ids that read it), and the
    versions it ran."""
    request = {"model": str(folder), "max_new_tokens": NEW_TOKENS,
               "prompts": [{"name": name, "ids": ids, "only": only} for name, ids, only in prompts],
               "cases": [{"id": case.id(budget), "press": case.press(budget)}
                         for case in cases() for budget in budgets()]}
    (work / "request.json").write_text(json.dumps(request))
    done = subprocess.run([python, str(REFERENCE), str(work / "request.json"), str(work / "answer.json")],
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, f"kvpress's reference run failed:\n{done.stderr[-4000:]}"
    answer = json.loads((work / "answer.json").read_text())
    results = {(r["prompt"], r["case"]): Answer(r.get("kept"), r["tokens"], r.get("zeroed_channels"),
                                                r.get("kept_after_decoding")) for r in answer["results"]}
    return {"answers": results, "versions": {k: answer[k] for k in ("kvpress", "transformers", "torch")}}


def kvviz_answer(loaded, ids: list[int], spec: str) -> Answer:
    """kvviz's strategy `spec` on the prompt `ids`: prefilled in one forward, then greedy, as kvpress's pipeline."""
    from kvviz.engine import strategies
    from kvviz.engine.cache_run import CacheRun

    run = CacheRun(loaded.model, strategies.parse_spec(spec), len(ids) + NEW_TOKENS, tokenizer=loaded.tokenizer)
    return greedy(run, ids, loaded.model.config.num_key_value_heads)


def greedy(run, ids: list[int], kv_heads: int) -> Answer:
    """`ids` prefilled through `run`, what each layer kept of them (and the scores it ranked them by), the greedy
    tokens, what each layer holds then."""
    with torch.inference_mode(), prefill_scores() as scores:
        logits = run.forward(torch.tensor([ids]))
        kept = [held_by_head(layer, len(ids), kv_heads) for layer in run.cache.layers]
        channels = [getattr(layer, "zeroed_channels", lambda: None)() for layer in run.cache.layers]
        tokens = [int(logits[0, -1].argmax())]
        for _ in range(NEW_TOKENS - 1):
            tokens.append(int(run.forward(torch.tensor([[tokens[-1]]]))[0, -1].argmax()))
        decoded = [held_by_head(layer, run.seen, kv_heads) for layer in run.cache.layers]
    if all(c is not None for c in channels):
        return Answer(None, tokens, channels)
    return Answer(kept, tokens, decoded=decoded, scores=scores)


@contextmanager
def prefill_scores():
    """{layer: [per KV head {position: score}]}: the scores each eviction layer ranked its tokens by at its first
    compression (the prefill's), filled while the block runs."""
    from kvviz.engine.eviction_layers import EvictionLayer

    scores, keep_top = {}, EvictionLayer.keep_top

    def recorded(layer, ranked):
        if layer.index not in scores:
            heads = ranked.float().expand(layer.positions.shape)[0]
            scores[layer.index] = [dict(zip(p.tolist(), s.tolist(), strict=True))
                                   for p, s in zip(layer.positions[0], heads, strict=True)]
        keep_top(layer, ranked)

    EvictionLayer.keep_top = recorded
    try:
        yield scores
    finally:
        EvictionLayer.keep_top = keep_top


def held_by_head(layer, seen: int, kv_heads: int) -> list[list[int]]:
    """The positions each KV head of a cache layer holds, sorted."""
    from kvviz.engine.layers import KvvizLayer

    if not isinstance(layer, KvvizLayer):  # a layer kept whole (key norm's first layers)
        return [list(range(seen))] * kv_heads
    positions = layer.held_positions().expand(kv_heads, -1)
    return [sorted(p for p in row.tolist() if p < seen) for row in positions]


def differences(kvviz: list[list[list[int]]], kvpress: list[list[list[int]]]) -> list[tuple[int, int, set, set]]:
    """(layer, KV head, kept by kvviz only, kept by kvpress only) wherever the two kept different positions."""
    return [(layer, head, set(mine) - set(theirs), set(theirs) - set(mine))
            for layer, (heads_mine, heads_theirs) in enumerate(zip(kvviz, kvpress, strict=True))
            for head, (mine, theirs) in enumerate(zip(heads_mine, heads_theirs, strict=True)) if mine != theirs]


def rounding_tie(scores: dict | None, difference: tuple[int, int, set, set]) -> bool:
    """Whether a difference after the prefill is a tie at the cut within float32 rounding: as many positions kept by
    each side alone, all of which kvviz scored within `TIE` of one another. Both sides rank sums of about a thousand
    float32 terms (attention weights, norms), computed in another order by kvpress's eager attention than by kvviz's
    own kernels, and each order's rounding, which also depends on the CPU's vector width, moves a sum by up to about
    n * 2**-24 of it (6e-5 at n = 1,000): two scores nearer than that rank either way."""
    layer, head, mine, theirs = difference
    if scores is None or layer not in scores or len(mine) != len(theirs):
        return False
    ranked = [scores[layer][head][p] for p in mine | theirs]
    return max(ranked) - min(ranked) <= TIE * max(abs(r) for r in ranked)


def explained(case: Case, fed: list[int], difference: tuple[int, int, set, set], parted: int | None = None) -> bool:
    """Whether a difference is the documented one of `case` (`Case.differs`); `fed`: the token ids fed, in order.

    "ties" (key norm, compressing while decoding): in the first layer a key depends on its token alone, turned by
    RoPE, which keeps its norm, so the same token at two positions is an exact tie; kvpress holds the keys a
    compression kept in top-k order, kvviz in position order, so a compression during decoding may break it the other
    way. From then on the first layer holds other positions, so every key decoded after that compression differs, in
    every layer, and may rank otherwise. Explained: in layer 0, the tokens kept by one side only are the very tokens
    kept by the other only; in a later layer, the difference involves a position decoded from `parted` on (the first
    position decoded after a compression at which layer 0 parted; None: it never did)."""
    layer, _, mine, theirs = difference
    if case.differs == "newest":  # kvpress keeps the newest token whatever it scores; kvviz ranks it (TOVA's code)
        return theirs == {len(fed) - 1} and len(mine) == 1
    if case.differs == "ties":
        if layer == 0:
            return sorted(fed[p] for p in mine) == sorted(fed[p] for p in theirs)
        return parted is not None and max(mine | theirs) >= parted
    return False


def answered(needle: Needle, tokenizer, tokens: list[int]) -> bool:
    return needle.answered(tokenizer.decode(tokens))
