"""The options of each cache strategy as kept files hold them: name -> the spec of its value.

A kept file names its strategy and options (``{"name": "sink", "options": {"sink_tokens": 4, "window": 252}}``);
the schema checks each option of a strategy this table lists against its declared type and range, so that a
damaged file cannot hand the engine ``"window": "x"``. The engine's strategies (`kvviz.engine.strategies`, which
import torch and so cannot be read here) declare the same options with their help texts;
tests/files/test_strategy_options.py checks that the two agree, so a new option fails the suite until it is
declared here too. Options of a strategy or a name this table does not list (another kvviz version's) are
accepted as plain values.
"""

from __future__ import annotations

from kvviz.files.schema import MAX_INT, Flag, Int, Json, Number, Record, Text, at, maybe


def _int(low: int, high: int = MAX_INT) -> Int:
    return Int(low, high)


_MAX_CACHE_LEN = _int(0)
_POOLING = Text(("average", "max"))
# what every scoring policy takes beside its own options: the wrappers and compression during decoding
_SCORING = {"adaptive": Flag(), "chunk": _int(0), "critical": Flag(), "decode_interval": _int(0),
            "decode_target": _int(0), "decode_fraction": Number(0.0, 1.0)}
PREFILL = {"prefill_chunk": _int(0)}  # what every strategy with a cache takes: its prompt read in chunks

OPTIONS: dict[str, dict] = {
    "none": {},
    "dynamic": {**PREFILL},
    "static": {"max_cache_len": _MAX_CACHE_LEN, "compile": Flag(), **PREFILL},
    "quantized": {"backend": Text(("quanto", "hqq", "fp8")), "nbits": _int(1, 8), "residual_length": _int(1),
                  "q_group_size": _int(1), "axis_key": _int(-1, 1), "axis_value": _int(-1, 1), **PREFILL},
    "sliding": {"window": _int(2), **PREFILL},
    "sink": {"sink_tokens": _int(0), "window": _int(1), **PREFILL},
    "h2o": {"budget": _int(2), "recent": _int(-1), "average": Flag(), **_SCORING, **PREFILL},
    "tova": {"budget": _int(1), **_SCORING, **PREFILL},
    "snapkv": {"budget": _int(2), "window": _int(1), "kernel": _int(1), "pooling": _POOLING, **_SCORING, **PREFILL},
    "knorm": {"budget": _int(1), "skip_layers": _int(0), **_SCORING, **PREFILL},
    "expected_attention": {"budget": _int(1), "future": _int(1), "sink_tokens": _int(0), "covariance": Flag(),
                           "value_norm": Flag(), "epsilon": Number(0.0, None), **_SCORING, **PREFILL},
    "pyramidkv": {"budget": _int(2), "window": _int(1), "kernel": _int(1), "pooling": _POOLING, "beta": _int(1),
                  **_SCORING, **PREFILL},
    "keydiff": {"budget": _int(1), **_SCORING, **PREFILL},
    "lagkv": {"budget": _int(1), "lag": _int(2), "sink_tokens": _int(0), **_SCORING, **PREFILL},
    "kvzip": {"budget": _int(1), "sink_tokens": _int(0), "layerwise": Flag(), "repeat_chunk": _int(1), **PREFILL},
    "think": {"key_channels": Number(0.0, 0.99), "window": _int(1), **PREFILL},
    "random": {"budget": _int(1), "seed": _int(0), **_SCORING, **PREFILL},
    "offloaded": {**PREFILL},
    "offloaded-static": {"max_cache_len": _MAX_CACHE_LEN, **PREFILL},
}


PLAIN = Json(depth=0)  # the value of an option this table does not declare


def _declared(strategy: str) -> Record:
    declared = OPTIONS.get(strategy, {})
    return Record({name: maybe(spec) for name, spec in declared.items()}, extra=PLAIN,
                  what=f"an object of {strategy}'s options" if declared else "an object of options")


_RECORDS = {name: _declared(name) for name in OPTIONS}
_UNDECLARED = _declared("")


def options_rule(name_field: str):
    """A rule for a record that names a strategy in `name_field` and holds its "options": each declared option of
    that strategy of its declared type and range (`OPTIONS`), any other a plain value."""

    def rule(record: dict, where) -> None:
        _RECORDS.get(record[name_field], _UNDECLARED).check(record["options"], at(where, "options"))

    return rule
