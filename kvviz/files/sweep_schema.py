"""What a sweep file may hold: the declared schema of the kvviz-sweep format and its cross-field rules.

`kvviz.files.formats` reads every kvviz file through the `FILE_FORMAT` declared here; `kvviz.files.sweep.load` is
the short way to it. A refusal names the file, the field path and what was expected.
"""

from __future__ import annotations

from kvviz.files import evaluation
from kvviz.files.file_format import FileFormat
from kvviz.files.first_token import FIRST_TOKEN, FIRST_TOKEN_AT, build, build_at
from kvviz.files.qa import ANSWER_RECORD, ITEM_RECORD, REGIMES, AnswerRecord, build_item
from kvviz.files.schema import MAX_BYTES, Either, Flag, Int, ListOf, Number, Record, Refusal, Text, at, optional
from kvviz.files.sweep import (
    BUDGET_COVERS,
    FORMAT,
    LONGEST_LIMITS,
    QUALITY_KINDS,
    VERSION,
    Asked,
    Configuration,
    Question,
    SpeedRecord,
    Sweep,
    SweepFileError,
    TargetMemory,
    Tolerance,
    swept_so_far,
)
from kvviz.files.trace_schema import MAX_POSITIONS, MODEL_CARD, STRATEGY


def _fidelity_agrees(config: dict, where) -> None:
    records = len(config["evaluation"]["records"]["position"])
    for name in ("kl", "top1"):
        if len(config[name]) != records:
            raise Refusal(at(where, name), f"one value per prediction ({records:,})", config[name])


def _answers_asked(sweep: dict, where) -> None:
    """Every answer is to a question the sweep asked, in a regime it asked."""
    asked = sweep["asked"]
    turns = [len(item["turns"]) for item in asked["items"]] if asked else []
    for c, config in enumerate(sweep["configurations"]):
        for a, answer in enumerate(config["answers"]):
            if not asked or answer["regime"] not in asked["regimes"] or answer["item"] >= len(turns) \
                    or answer["turn"] >= turns[answer["item"]]:
                raise Refusal(at(where, "configurations", c, "answers", a), "an answer to a question of \"asked\"",
                              show_found=False)


def _journal_agrees(sweep: dict, where) -> None:
    """A journal's header lists the configurations' strategies in order (`SweepJournal`)."""
    journaled = sweep["journal"]
    if journaled is None:
        return
    strategies = journaled["strategies"]
    configurations = sweep["configurations"]
    if len(strategies) != len(configurations):
        raise Refusal(at(where, "journal", "strategies"), f"one strategy per configuration ({len(configurations):,})",
                      show_found=False)
    for i, (strategy, config) in enumerate(zip(strategies, configurations, strict=True)):
        if strategy != config["evaluation"]["strategy"]:
            raise Refusal(at(where, "configurations", i, "evaluation", "strategy"),
                          f"the strategy the journal's header lists for configuration {i}", show_found=False)


_BYTES = Int(0, MAX_BYTES, null=True, what="a byte count")
_TOLERANCE = Record({"kind": Text(QUALITY_KINDS), "value": Number(0)}, what="a tolerance")
# what a sweep's journal keeps for a resume to check (`kvviz.engine.sweep_resume.resume_key`)
_RESUME = Record(
    {"model": MODEL_CARD, "tokens_sha256": Text(nonempty=True), "context": Int(1, MAX_POSITIONS),
     "sequences": Int(1), "budget": Either(Text(("free",)), Int(0, MAX_BYTES, what="a byte count")),
     "tolerance": _TOLERANCE, "accuracy_tolerance": Number(0, 1), "grid": ListOf(STRATEGY), "rows": Int(1),
     "quantized_alone": Flag(),
     "questions": Record({"source": Text(), "raw": Flag(), "seed": Int(0, null=True),
                          "length": Int(1, MAX_POSITIONS, null=True), "items_sha256": Text(nonempty=True)},
                         null=True, what="the questions asked (an object)"),
     "regimes": ListOf(Text(REGIMES), null=True),
     "budget_covers": optional(Text(BUDGET_COVERS), "cache"), "first_tokens": optional(Flag(), False)},
    what="what a resume checks (an object)",
)
# a journal's own header fields (`SweepJournal`); absent from a sweep file
_JOURNAL = Record({"strategies": ListOf(STRATEGY), "resume": _RESUME}, null=True,
                  what="the journal's header (an object)")
_TARGET = Record(
    {"cache_bytes": _BYTES, "policy_bytes": Int(0, MAX_BYTES, what="a byte count"), "per_sequence_bytes": _BYTES,
     "sequences_in_budget": Int(0, null=True), "longest_context": Int(0, null=True),
     "longest_limit": Text(LONGEST_LIMITS), "predicted_at_measured": _BYTES,
     "first_token": optional(FIRST_TOKEN_AT), "process_bytes": optional(_BYTES)},
    null=True, what="a configuration's memory at the target (an object)",
)
_CONFIGURATION = Record(
    {"evaluation": evaluation.EVAL_RECORD,
     "kl": ListOf(Number(0, what="a KL divergence in nats")),
     "top1": ListOf(Flag()),
     "decode_ms": Number(0, null=True, what="a time in ms"),
     "measured_rows": Int(1),
     "target": _TARGET,
     "answers": optional(ListOf(ANSWER_RECORD), []),
     "first_token": optional(FIRST_TOKEN)},
    rules=(_fidelity_agrees,),
    what="a configuration (an object with its evaluation)",
)
_SPEED = Record({**{name: Number(0, null=True) for name in SpeedRecord().to_dict()},
                 "floor_s": optional(Number(0, null=True)), "floor_rows": optional(Int(1, null=True)),  # absent before
                 "answering_s": optional(Number(0, null=True)), "first_token_s": optional(Number(0, null=True))},
                what="the sweep's speed")
_SWEEP = Record(
    {
        "model": MODEL_CARD,
        "document": evaluation.DOCUMENT,
        "question": Record(
            {"context": Int(1, MAX_POSITIONS), "sequences": Int(1), "budget_bytes": _BYTES, "budget": Text(),
             "tolerance": _TOLERANCE,
             "accuracy_tolerance": optional(Number(0, 1, what="a share of the exact cache's accuracy"), 0.05),
             "budget_covers": optional(Text(BUDGET_COVERS), "cache")},
            what="the question (an object)",
        ),
        "speed": optional(_SPEED, {}),
        "cancelled": Flag(),
        "asked": optional(Record(
            {"source": Text(), "regimes": ListOf(Text(REGIMES)), "raw": Flag(), "seed": Int(0, null=True),
             "length": Int(1, MAX_POSITIONS, null=True), "items": ListOf(ITEM_RECORD)},
            null=True, what="the questions asked (an object)")),
        "configurations": ListOf(_CONFIGURATION),
        "journal": optional(_JOURNAL),
    },
    rules=(_answers_asked, _journal_agrees),
)


def _build(data: dict) -> Sweep:
    q = data["question"]
    question = Question(q["context"], q["sequences"], q["budget_bytes"], q["budget"],
                        Tolerance(q["tolerance"]["kind"], q["tolerance"]["value"]), q["accuracy_tolerance"],
                        q["budget_covers"])
    configurations = []
    for c in data["configurations"]:
        target = TargetMemory(**{**c["target"], "first_token": build_at(c["target"]["first_token"])}) \
            if c["target"] else None
        configurations.append(Configuration(evaluation.build_run(c["evaluation"]), c["kl"], c["top1"],
                                            c["decode_ms"], c["measured_rows"], target,
                                            [AnswerRecord(**a) for a in c["answers"]], build(c["first_token"])))
    speed = SpeedRecord(**{k: v for k, v in (data["speed"] or {}).items() if k in SpeedRecord().to_dict()})
    a = data["asked"]
    asked = Asked(a["source"], a["regimes"], a["raw"], [build_item(i) for i in a["items"]], a["seed"], a["length"]) \
        if a else None
    return Sweep(data["model"], data["document"], question, configurations, speed, data["cancelled"], asked)


def _from_journal(header: dict, lines: list, source: str) -> Sweep:
    """The partial sweep a killed process's journal holds (`SweepJournal`), said so in its configurations' errors."""
    return swept_so_far(header, lines, source).sweep


FILE_FORMAT = FileFormat(name=FORMAT, version=VERSION, kind="kvviz sweep", schema=_SWEEP, build=_build,
                         error=SweepFileError, from_journal=_from_journal)
