"""A sweep: many cache configurations read along one text, each measured for quality, memory and speed, with
the memory each needs at the user's target context and number of sequences; and the file that keeps it.

Plain data only (stdlib + numpy): the engine (`kvviz.engine.sweep`) fills these in, `kvviz choose` and the
window's Choose mode show them, `kvviz.files.frontier` answers the question from them. What a file may hold, field by
field, is declared in `kvviz.files.sweep_schema`.

A sweep file, as JSON:

    {"format": "kvviz-sweep", "version": 1, "model": {...}, "document": {...},
     "question": {"context": int, "sequences": int, "budget_bytes": int or null, "budget": str,
                  "tolerance": {"kind": "perplexity" or "kl", "value": float}, "budget_covers": "cache" or "process"},
     "speed": {"wall_s", "rows_per_forward", "forwards_per_s", "memory_bound_share", "bandwidth_bytes_per_s",
               "answering_s", "first_token_s"},
     "cancelled": bool,
     "asked": {"source": str, "regimes": [str], "raw": bool, "seed": int or null, "length": int or null,
               "items": [{a question item: name, task, context, turns, needles, metric, seed}]} or null,
     "configurations": [{"evaluation": {a kvviz-eval file's fields}, "kl": [...], "top1": [...],
                         "decode_ms": float or null, "measured_rows": int,
                         "target": {"cache_bytes", "policy_bytes", "per_sequence_bytes", "sequences_in_budget",
                                    "longest_context", "longest_limit", "predicted_at_measured",
                                    "first_token": {"tokens", "peak_bytes", "ttft_ms", "predicted"} or null,
                                    "process_bytes"} or null,
                         "answers": [{an answer record: item, turn, regime, answer, score, ...}],
                         "first_token": {"tokens", "token_id", "peak_bytes", "weight_bytes", "cache_bytes",
                                         "ttft_ms", "attention"} or null,
                         "error": str or null}, ...]}

`kl[i]` and `top1[i]` compare the i-th prediction with the exact cache's (`kvviz.engine.fidelity`): the KL
divergence KL(exact || configuration) in nats, and whether the two most likely next tokens agree. `asked` is
present when the sweep also asked questions (`kvviz choose --task` or `--qa`): the items, and per configuration
its answer to each question in each regime, scored 0 to 1 (`kvviz.files.qa`); a configuration's accuracy in a
regime is its mean score there.

While a sweep runs with `kvviz choose --out DIR`, it is kept as a journal beside sweep.json (`SweepJournal`,
`kvviz.files.journal`): each configuration as it finishes, the answers to each item as they are given, so that a
killed sweep loses at most the configurations it was reading, and `kvviz choose --resume` continues it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvviz.files import evaluation
from kvviz.files.evaluation import EvalRun
from kvviz.files.first_token import FirstToken, FirstTokenAt
from kvviz.files.formats import file_format
from kvviz.files.journal import Journal, ended_without_saving, journal_path, read_journal_of
from kvviz.files.jsonfile import KeptFileError, write_json
from kvviz.files.qa import AnswerRecord, QAItem

FORMAT = "kvviz-sweep"
VERSION = 1
QUALITY_KINDS = ("perplexity", "kl")
# what the budget bounds: the caches alone, or the whole process (weights, one request's prefill and the other caches)
BUDGET_COVERS = ("cache", "process")
# why a sequence cannot hold a longer context: the budget, the model's positions, or nothing (a bounded cache)
LONGEST_LIMITS = ("budget", "context", "none")


@dataclass(frozen=True)
class Tolerance:
    """How much quality the user gives up: perplexity up by a share (0.05: 5 %), or a mean KL in nats."""

    kind: str  # one of QUALITY_KINDS
    value: float

    def describe(self) -> str:
        if self.kind == "perplexity":
            return f"perplexity within {100 * self.value:g} % of the exact cache's"
        return f"mean KL divergence from the exact cache within {self.value:g} nats"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value}


@dataclass(frozen=True)
class Question:
    """What the user asks: the context each sequence reaches, how many sequences at once, the cache memory
    they have (None: no budget given) and the quality they accept."""

    context: int
    sequences: int
    budget_bytes: int | None
    budget: str  # as the user gave it ("4 GiB", "free memory of cuda:0"), for messages
    tolerance: Tolerance
    accuracy_tolerance: float = 0.05  # where questions were asked: how far below the exact cache's accuracy (a share)
    budget_covers: str = "cache"  # one of BUDGET_COVERS

    def to_dict(self) -> dict[str, Any]:
        return {"context": self.context, "sequences": self.sequences, "budget_bytes": self.budget_bytes,
                "budget": self.budget, "tolerance": self.tolerance.to_dict(),
                "accuracy_tolerance": self.accuracy_tolerance, "budget_covers": self.budget_covers}


@dataclass
class TargetMemory:
    """A configuration's memory at the question's target, from its size rule (`kvviz.engine.target_memory`)."""

    cache_bytes: int | None  # keys, values and states of `sequences` sequences of `context` tokens
    policy_bytes: int  # what its policy keeps beside them (H2O's attention sums), for those sequences
    per_sequence_bytes: int | None  # cache and policy of one such sequence
    sequences_in_budget: int | None  # how many such sequences fit in the budget (None: no budget, or unknown)
    longest_context: int | None  # the longest context one sequence reaches within the budget (None: unknown)
    longest_limit: str  # what stops it there: one of LONGEST_LIMITS
    predicted_at_measured: int | None  # the size rule at the measured length (equal to the measurement: checked)
    # one request of `context` tokens served up to its first token: the process's peak and the time (None: not known)
    first_token: FirstTokenAt | None = None
    # the process's peak serving `sequences` such sequences: the weights and one request's prefill at its peak, its own
    # cache included, beside the caches of the others (None: not known)
    process_bytes: int | None = None

    @property
    def total_bytes(self) -> int | None:
        return None if self.cache_bytes is None else self.cache_bytes + self.policy_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"cache_bytes": self.cache_bytes, "policy_bytes": self.policy_bytes,
                "per_sequence_bytes": self.per_sequence_bytes, "sequences_in_budget": self.sequences_in_budget,
                "longest_context": self.longest_context, "longest_limit": self.longest_limit,
                "predicted_at_measured": self.predicted_at_measured,
                "first_token": self.first_token.to_dict() if self.first_token else None,
                "process_bytes": self.process_bytes}


@dataclass
class Configuration:
    """One configuration's measurements: its evaluation along the text (NLL, cache bytes, times per prediction),
    its agreement with the exact cache per prediction, its speed alone and its memory at the target."""

    run: EvalRun
    kl: list[float] = field(default_factory=list)
    top1: list[bool] = field(default_factory=list)
    decode_ms: float | None = None  # one decode step alone (batch 1) after the text, median of a few
    measured_rows: int = 1  # configurations sharing its forwards while it read the text
    target: TargetMemory | None = None
    answers: list[AnswerRecord] = field(default_factory=list)  # where the sweep asked questions (`Sweep.asked`)
    first_token: FirstToken | None = None  # one request of the text's length served up to its first token, measured

    def answered(self, regime: str) -> list[AnswerRecord]:
        return [a for a in self.answers if a.regime == regime]

    def accuracy(self, regime: str) -> float | None:
        """The mean score of its answers in `regime` (0 to 1); None when it answered none there, or not all."""
        scores = [a.score for a in self.answered(regime)]
        return sum(scores) / len(scores) if scores and None not in scores else None

    def answer_failures(self) -> dict[str, list[str]]:
        """Why it could not answer where it failed: each reason with the regimes it failed in."""
        reasons: dict[str, list[str]] = {}
        for record in self.answers:
            if record.error and record.regime not in reasons.setdefault(record.error, []):
                reasons[record.error].append(record.regime)
        return reasons

    @property
    def label(self) -> str:
        return self.run.label()

    @property
    def status(self) -> str:
        return self.run.status

    @property
    def finished(self) -> bool:
        return self.run.status == "finished" and bool(self.run.records)

    def summary(self) -> dict[str, Any]:
        s = self.run.summary()
        n = len(self.kl)
        return {
            "perplexity": s["perplexity"],
            "second_half_perplexity": s["second_half_perplexity"],
            "mean_kl": float(np.mean(self.kl, dtype=np.float64)) if n else None,
            "top1": sum(self.top1) / n if n else None,
            "final_cache_bytes": s["final_cache_bytes"],
            "final_policy_bytes": s["final_policy_bytes"],
            "tokens": s["tokens"],
            "sweep_tokens_per_s": s["tokens_per_s"],
            "decode_tokens_per_s": 1000.0 / self.decode_ms if self.decode_ms else None,
        }

    def to_dict(self) -> dict[str, Any]:
        run = {k: v for k, v in self.run.to_dict().items() if k not in ("format", "version", "summary")}
        return {"evaluation": run, "kl": list(self.kl), "top1": list(self.top1), "decode_ms": self.decode_ms,
                "measured_rows": self.measured_rows, "target": self.target.to_dict() if self.target else None,
                "answers": [a.to_dict() for a in self.answers],
                "first_token": self.first_token.to_dict() if self.first_token else None}


@dataclass
class SpeedRecord:
    """How fast the sweep read the text: its time against the compute-bound floor (as many plain batched forwards of
    one token as the text has predictions, for the `floor_rows` configurations that do not keep every token, over a full
    cache of half the text, timed in the same run), rows per batched forward, forwards per second, and the share of
    the memory-bound speed reached (every weight and every row's cache read once per forward at this machine's
    bandwidth); None where not measured."""

    wall_s: float | None = None
    rows_per_forward: float | None = None
    forwards_per_s: float | None = None
    memory_bound_share: float | None = None
    bandwidth_bytes_per_s: float | None = None
    floor_s: float | None = None
    floor_rows: int | None = None
    answering_s: float | None = None  # asking every configuration the questions (None: none were asked)
    first_token_s: float | None = None  # serving a request of the text's length through each configuration

    @property
    def floor_share(self) -> float | None:
        """The sweep's time over the compute-bound floor's (below 1: faster than the floor)."""
        return self.wall_s / self.floor_s if self.wall_s is not None and self.floor_s else None

    def to_dict(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "rows_per_forward": self.rows_per_forward,
                "forwards_per_s": self.forwards_per_s, "memory_bound_share": self.memory_bound_share,
                "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s, "floor_s": self.floor_s,
                "floor_rows": self.floor_rows, "answering_s": self.answering_s, "first_token_s": self.first_token_s}


@dataclass
class Asked:
    """The questions a sweep asked every configuration: the items, the regimes and how the items were written."""

    source: str  # where the items come from: "tasks niah_single_1, vt", a question file's name, a conversation's
    regimes: list[str]  # of qa.REGIMES, in the order asked
    raw: bool  # read as plain text (True) or in the model's chat template
    items: list[QAItem] = field(default_factory=list)
    seed: int | None = None  # of generated tasks
    length: int | None = None  # tokens each generated item was written to fit

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "regimes": list(self.regimes), "raw": self.raw, "seed": self.seed,
                "length": self.length, "items": [item.to_dict() for item in self.items]}


@dataclass
class Sweep:
    model: dict[str, Any]
    document: dict[str, Any]
    question: Question
    configurations: list[Configuration] = field(default_factory=list)
    speed: SpeedRecord = field(default_factory=SpeedRecord)
    cancelled: bool = False
    asked: Asked | None = None  # the questions asked besides the text read (None: none)

    def reference(self) -> Configuration | None:
        """The exact cache's configuration (dynamic), which every other is compared with."""
        return next((c for c in self.configurations if c.run.strategy.get("name") == "dynamic" and c.finished), None)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "model": self.model, "document": self.document,
                "question": self.question.to_dict(), "speed": self.speed.to_dict(), "cancelled": self.cancelled,
                "asked": self.asked.to_dict() if self.asked else None,
                "configurations": [c.to_dict() for c in self.configurations]}

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically and completely, even when Ctrl-C comes during the save (`kvviz.files.jsonfile`)."""
        return write_json(path, self.to_dict)


# -- the journal of a sweep while it runs ------------------------------------------------------------------


class SweepJournal:
    """A sweep kept as it is measured (`kvviz.files.journal`), beside the sweep file it becomes: `answered()` after
    each item is asked, `finished(index)` as each configuration ends (both fsynced: a line is minutes of work),
    `remove()` once the sweep's files are written.

    The header is the sweep's model, document, question and questions asked, the configurations' strategies in
    order, and `resume`: what `kvviz choose --resume` checks before it continues. Each line is either
    ``{"regime": r, "item": i, "answers": [[answer record, ...] for each configuration]}`` (the answers that item
    added) or ``{"configuration": index, "elapsed_s": the sweep's time so far, "data": the configuration}``."""

    def __init__(self, path: str | os.PathLike, sweep: Sweep, resume: dict[str, Any]):
        self.path = Path(path)
        self.sweep = sweep
        self.resume = resume
        self.journal = Journal(journal_path(self.path), FORMAT)
        self._answers = [0] * len(sweep.configurations)  # answers journaled, per configuration

    def carry(self, kept: SweptSoFar) -> None:
        """Start with what an earlier process journaled (a resumed sweep), so that a kill now loses none of it."""
        self._answers = [len(c.answers) for c in self.sweep.configurations]
        self._append(kept.lines)

    def answered(self, regime: str, item: int) -> None:
        configurations = self.sweep.configurations
        new = [[a.to_dict() for a in c.answers[done:]] for c, done in zip(configurations, self._answers, strict=True)]
        self._answers = [len(c.answers) for c in configurations]
        self._append([{"regime": regime, "item": item, "answers": new}])

    def finished(self, index: int, elapsed_s: float) -> None:
        self._append([{"configuration": index, "elapsed_s": elapsed_s,
                       "data": self.sweep.configurations[index].to_dict()}])

    def _append(self, lines: list[Any]) -> None:
        if not self.journal.started:
            sweep = self.sweep
            self.journal.start({"format": FORMAT, "version": VERSION, "model": sweep.model,
                                "document": sweep.document, "question": sweep.question.to_dict(),
                                "asked": sweep.asked.to_dict() if sweep.asked else None,
                                "strategies": [c.run.strategy for c in sweep.configurations],
                                "resume": self.resume}, lines)
        else:
            self.journal.extend(lines)
        self.journal.sync()

    def remove(self) -> None:
        """The sweep's files are written: the journal goes."""
        self.journal.remove()


@dataclass
class SweptSoFar:
    """What a sweep's journal holds: the partial sweep (every configuration, those not finished cancelled), which
    finished (by index), the items answered, the sweep's time so far, what a resume checks, and the lines as read."""

    sweep: Sweep
    finished: list[int]
    answered: list[tuple[str, int]]
    elapsed_s: float
    resume: dict[str, Any]
    lines: list[Any]


def read_journal(path: str | os.PathLike) -> SweptSoFar:
    """A sweep's journal, checked like a sweep file. Raises SweepFileError naming what is wrong."""
    header, lines = read_journal_of(path, FORMAT, "a sweep", SweepFileError)
    return swept_so_far(header, lines, str(path))


def swept_so_far(header: dict, lines: list, source: str) -> SweptSoFar:
    """What a sweep journal's header and lines hold (`read_journal` reads them from its file)."""
    strategies = header.get("strategies")
    if not isinstance(strategies, list) or not strategies:
        raise SweepFileError(f'{source}: the journal\'s header has no "strategies" (a list of the configurations)')
    count = len(strategies)
    answers: list[list[Any]] = [[] for _ in strategies]
    kept: dict[int, Any] = {}
    answered, elapsed = [], 0.0
    for number, line in enumerate(lines, start=2):
        if isinstance(line, dict) and line.keys() == {"regime", "item", "answers"} \
                and isinstance(line["answers"], list) and len(line["answers"]) == count \
                and all(isinstance(added, list) for added in line["answers"]):
            for own, added in zip(answers, line["answers"], strict=True):
                own += added
            answered.append((line["regime"], line["item"]))
        elif isinstance(line, dict) and line.keys() == {"configuration", "elapsed_s", "data"} \
                and type(line["configuration"]) is int and 0 <= line["configuration"] < count \
                and type(line["elapsed_s"]) in (int, float) and 0 <= line["elapsed_s"] <= _MAX_S \
                and isinstance(line["data"], dict):
            kept[line["configuration"]] = line["data"]
            elapsed = float(line["elapsed_s"])
        else:
            raise SweepFileError(f"{source}: line {number:,} of the journal is neither the answers to an item (for "
                                 f"each of its {count:,} configurations) nor a finished configuration (with the "
                                 "sweep's time so far in seconds)")
    ended = ended_without_saving(len(kept), count, "configuration")
    configurations = [kept.get(i) or _not_finished(header, strategy, answers[i], ended)
                      for i, strategy in enumerate(strategies)]
    data = {key: header.get(key) for key in ("format", "version", "model", "document", "question", "asked")}
    data.update(speed=SpeedRecord(wall_s=elapsed if kept else None).to_dict(), cancelled=len(kept) < count,
                configurations=configurations, journal={"strategies": strategies, "resume": header.get("resume")})
    sweep = file_format(FORMAT).parse(data, source)
    items = len(sweep.asked.items) if sweep.asked else 0
    regimes = sweep.asked.regimes if sweep.asked else []
    if not all(regime in regimes and type(item) is int and 0 <= item < items for regime, item in answered):
        raise SweepFileError(f"{source}: a line of answers names an item or regime the sweep did not ask")
    return SweptSoFar(sweep, sorted(kept), answered, elapsed, header["resume"], lines)


_MAX_S = 10**9  # the longest a sweep could have taken, in seconds (NaN and 10^400 are not times)


def _not_finished(header: dict, strategy: Any, answers: list, ended: str) -> dict[str, Any]:
    """A configuration the journal does not hold finished: no records, cancelled, with the answers it gave."""
    evaluation_run = {"model": header.get("model"), "strategy": strategy, "document": header.get("document"),
                      "method": {"mode": "token-by-token", "chunk": 1}, "cancelled": True, "error": ended,
                      "first_eviction": None, "records": {name: [] for name in evaluation.COLUMNS}}
    return {"evaluation": evaluation_run, "kl": [], "top1": [], "decode_ms": None, "measured_rows": 1,
            "target": None, "answers": answers, "first_token": None}


# -- reading -----------------------------------------------------------------------------------------------


class SweepFileError(KeptFileError):
    """A file is not a readable kvviz sweep; the message names the file, the field and what was expected."""


def load(path: str | os.PathLike) -> Sweep:
    return file_format(FORMAT).read(path)
