"""The registry of cache strategies.

Each strategy lives in a module of its own in this package (a subclass of `base.Strategy`: name,
one-line description, typed options, checks, its cache and its size rule); the registry below
lists them in the order the user sees them. A new strategy is a new module plus one line here.
"""

from __future__ import annotations

from typing import Any

from kvviz.engine.strategies.base import Option, Strategy, StrategyChoice
from kvviz.engine.strategies.dynamic import Dynamic
from kvviz.engine.strategies.expected_attention import ExpectedAttention
from kvviz.engine.strategies.h2o import H2O
from kvviz.engine.strategies.keydiff import KeyDiff
from kvviz.engine.strategies.knorm import KeyNorm
from kvviz.engine.strategies.kvzip import KVzip
from kvviz.engine.strategies.lagkv import LagKV
from kvviz.engine.strategies.none import NoCache
from kvviz.engine.strategies.offloaded import Offloaded, OffloadedStatic
from kvviz.engine.strategies.pyramidkv import PyramidKV
from kvviz.engine.strategies.quantized import Quantized
from kvviz.engine.strategies.random import Random
from kvviz.engine.strategies.sink import Sink
from kvviz.engine.strategies.sliding import Sliding
from kvviz.engine.strategies.snapkv import SnapKV
from kvviz.engine.strategies.static import Static
from kvviz.engine.strategies.think import ThinK
from kvviz.engine.strategies.tova import TOVA
from kvviz.errors import OptionError

__all__ = ["Option", "OptionError", "Strategy", "StrategyChoice", "all_strategies", "capacity_for", "choose", "get",
           "parse_assignments", "parse_list", "parse_spec"]

STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        NoCache(),
        Dynamic(),
        Static(),
        Quantized(),
        Sliding(),
        Sink(),
        H2O(),
        TOVA(),
        SnapKV(),
        KeyNorm(),
        ExpectedAttention(),
        PyramidKV(),
        KeyDiff(),
        LagKV(),
        KVzip(),
        ThinK(),
        Random(),
        Offloaded(),
        OffloadedStatic(),
    )
}


def all_strategies() -> list[Strategy]:
    return list(STRATEGIES.values())


def get(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise OptionError(f"unknown strategy {name!r}; accepted: {', '.join(STRATEGIES)}") from None


def choose(name: str, raw: dict[str, Any] | None = None) -> StrategyChoice:
    """Validate a strategy name and options (strings from the command line, or typed values)."""
    strategy = get(name)
    options = strategy.parse_options(dict(raw or {}))
    problem = strategy.check_all(options)
    if problem:
        raise OptionError(problem)
    return StrategyChoice(name, options)


def parse_assignments(pairs: list[str]) -> dict[str, str]:
    """``["window=64", "sink_tokens=4"]`` -> dict; raises OptionError on a malformed pair."""
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise OptionError(f"a strategy option is KEY=VALUE (e.g. window=64), got {pair!r}")
        result[key.strip()] = value.strip()
    return result


def parse_spec(spec: str) -> StrategyChoice:
    """One strategy with its options, the one form every command takes: NAME or NAME:KEY=VALUE:KEY=VALUE
    (``quantized:backend=hqq:nbits=2``); checked."""
    name, *pairs = spec.split(":")
    return choose(name.strip(), parse_assignments(pairs))


def parse_list(specs: list[str]) -> list[StrategyChoice]:
    """Several strategy specs (`parse_spec`), at least one."""
    choices = [parse_spec(spec) for spec in specs]
    if not choices:
        raise OptionError("--strategies names no strategy; e.g. --strategies dynamic,static,sink")
    return choices


def capacity_for(choice: StrategyChoice, needed_tokens: int) -> int:
    """Token slots a preallocating strategy reserves; raises if the user's max_cache_len is too small."""
    requested = choice.options.get("max_cache_len", 0)
    if not requested:
        return needed_tokens
    if requested < needed_tokens:
        raise OptionError(
            f"option 'max_cache_len' of strategy {choice.name!r} is {requested}, smaller than the prompt plus "
            f"max new tokens ({needed_tokens}); use at least {needed_tokens}, or 0 for exactly that"
        )
    return requested
