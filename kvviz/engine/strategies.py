"""The registry of cache strategies.

Each strategy has a name, a one-line description, typed options with defaults and ranges,
`available()` (can it run on this machine at all), `unsupported(model)` (can it run with this
model), and `make_cache(model, options, capacity)`. transformers' own cache classes are used
wherever they exist; `sink` uses our `SinkLayer`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, QuantizedCache, StaticCache
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

from kvviz.engine.layers import SinkLayer, WindowedFullAttentionLayer
from kvviz.engine.predict import layer_windows


class OptionError(ValueError):
    """A strategy or option the user asked for that cannot be accepted; the message says why."""


@dataclass(frozen=True)
class Option:
    name: str
    kind: str  # "int", "float", "bool" or "choice"
    default: Any
    help: str
    choices: tuple | None = None
    minimum: float | None = None
    maximum: float | None = None

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.choices)
        if self.kind == "bool":
            return "true or false"
        low = "" if self.minimum is None else f" >= {self.minimum}"
        return f"an integer{low}" if self.kind == "int" else f"a number{low}"

    def parse(self, value: Any, strategy: str) -> Any:
        where = f"option {self.name!r} of strategy {strategy!r}"
        try:
            if self.kind == "bool":
                parsed = _parse_bool(value)
            elif self.kind == "int":
                parsed = _parse_int(value)
            elif self.kind == "float":
                parsed = float(value)
            else:
                parsed = value
                if self.choices and isinstance(self.choices[0], int):
                    parsed = _parse_int(value)
        except (TypeError, ValueError):
            raise OptionError(f"{where} must be {self.describe()}, not {value!r}") from None
        if self.choices is not None and parsed not in self.choices:
            raise OptionError(f"{where} must be {self.describe()}, not {value!r}")
        if self.minimum is not None and parsed < self.minimum:
            raise OptionError(f"{where} must be {self.describe()}, not {value!r}")
        if self.maximum is not None and parsed > self.maximum:
            raise OptionError(f"{where} must be at most {self.maximum}, not {value!r}")
        return parsed

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "default": self.default,
            "help": self.help,
            "choices": list(self.choices) if self.choices else None,
            "minimum": self.minimum,
            "maximum": self.maximum,
        }


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def _parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    return int(value)


@dataclass(frozen=True)
class StrategyChoice:
    """A validated strategy with all of its options filled in."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.name} ({shown})" if shown else self.name


@dataclass(frozen=True)
class Strategy:
    name: str
    description: str
    options: tuple[Option, ...]
    build: Callable[[Any, dict, int], Cache | None]
    needs_cuda: bool = False
    # (options) -> extra validation message or None
    check: Callable[[dict], str | None] = lambda options: None
    # (model, options) -> reason this model cannot use the strategy so, or None
    model_check: Callable[[Any, dict], str | None] = lambda model, options: None

    def available(self) -> tuple[bool, str]:
        if self.needs_cuda and not torch.cuda.is_available():
            return False, "needs a CUDA device (it offloads cache layers from GPU memory to the CPU); none here"
        return True, ""

    def unsupported(self, model, options: dict | None = None) -> str | None:
        """Why `model` cannot use this strategy with `options` (defaults if None), or None."""
        if options is None:
            options = {o.name: o.default for o in self.options}
        return self.model_check(model, options)

    def option(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)

    def make_cache(self, model, options: dict, capacity: int) -> Cache | None:
        return self.build(model, options, capacity)

    def to_dict(self) -> dict[str, Any]:
        ok, reason = self.available()
        return {
            "name": self.name,
            "description": self.description,
            "available": ok,
            "reason": reason,
            "options": [o.to_dict() for o in self.options],
        }


# -- model checks ----------------------------------------------------------------------------------


def _only_full_attention(model) -> str | None:
    windows = layer_windows(model.config)
    if any(w is not None for w in windows):
        return "works only with models whose layers all use full attention; this model has sliding-window layers"
    return None


def rotary_inv_freq(model) -> torch.Tensor | None:
    """The inverse RoPE frequencies shared by all layers, if the model has exactly one rotary embedding."""
    base = getattr(model, "base_model", model)
    rotary = getattr(base, "rotary_emb", None)
    inv_freq = getattr(rotary, "inv_freq", None)
    return inv_freq if isinstance(inv_freq, torch.Tensor) else None


def _sink_model_check(model, options) -> str | None:
    if rotary_inv_freq(model) is None:
        return "needs a model with one rotary position embedding (RoPE) to re-rotate kept keys; this model has none"
    return _only_full_attention(model)


def _quantized_model_check(model, options) -> str | None:
    problem = _only_full_attention(model)
    if problem or options["backend"] == "fp8":
        return problem
    # quanto and HQQ cut a layer's whole [batch, kv_heads, tokens, head_dim] tensor into groups,
    # so a token's values must fill whole groups at every length
    config = model.config.get_text_config(decoder=True)
    per_token = (getattr(config, "num_key_value_heads", None) or config.num_attention_heads) * (
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    if per_token % options["q_group_size"]:
        return (
            f"cannot use q_group_size={options['q_group_size']} with this model: each token has {per_token} key "
            f"values per layer, which must be a multiple of the group size (try a divisor of {per_token})"
        )
    return None


# -- builders --------------------------------------------------------------------------------------


def _dynamic(model, options, capacity):
    return DynamicCache(config=model.config)


def _static(model, options, capacity):
    return StaticCache(config=model.config, max_cache_len=capacity)


def _offloaded(model, options, capacity):
    return DynamicCache(config=model.config, offloading=True)


def _offloaded_static(model, options, capacity):
    return StaticCache(config=model.config, max_cache_len=capacity, offloading=True)


def _quantized(model, options, capacity):
    backend = options["backend"]
    if backend == "fp8":
        return QuantizedCache("fp8", model.config)
    kwargs = {k: options[k] for k in ("nbits", "axis_key", "axis_value", "q_group_size", "residual_length")}
    return QuantizedCache(backend, model.config, **kwargs)


def _sliding(model, options, capacity):
    window = options["window"]
    layers = [
        WindowedFullAttentionLayer(sliding_window=window)
        if native is None
        else DynamicSlidingWindowLayer(sliding_window=min(window, native))
        for native in layer_windows(model.config)
    ]
    return Cache(layers=layers)


def _sink(model, options, capacity):
    inv_freq = rotary_inv_freq(model)
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[SinkLayer(options["sink_tokens"], options["window"], inv_freq) for _ in range(n_layers)])


def _none(model, options, capacity):
    return None


# -- option checks ---------------------------------------------------------------------------------

QUANT_NBITS = {"quanto": (2, 4), "hqq": (1, 2, 3, 4, 8)}
QUANT_AXES = {"quanto": (0, -1), "hqq": (0, 1)}
QUANT_PACKAGES = {"quanto": "optimum.quanto", "hqq": "hqq"}
GROUP_WISE = ("nbits", "axis_key", "axis_value", "q_group_size", "residual_length")


def _check_quantized(options: dict) -> str | None:
    backend = options["backend"]
    if backend == "fp8":
        return None
    module = QUANT_PACKAGES[backend]
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return f"backend {backend!r} needs the Python package {module}, which is not installed"
    if options["nbits"] not in QUANT_NBITS[backend]:
        accepted = ", ".join(map(str, QUANT_NBITS[backend]))
        return f"option 'nbits' of backend {backend!r} must be one of {accepted}, not {options['nbits']}"
    for axis in ("axis_key", "axis_value"):
        if options[axis] not in QUANT_AXES[backend]:
            accepted = ", ".join(map(str, QUANT_AXES[backend]))
            return f"option {axis!r} of backend {backend!r} must be one of {accepted}, not {options[axis]}"
    return None


def _max_cache_len_option() -> Option:
    return Option(
        "max_cache_len", "int", 0, "token slots to preallocate; 0 means prompt + max new tokens", minimum=0
    )


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("none", "no cache: the whole sequence is recomputed at every step", (), _none),
        Strategy("dynamic", "DynamicCache: keys and values grow by one token per step", (), _dynamic),
        Strategy(
            "static",
            "StaticCache: all token slots preallocated up front, written in place",
            (
                _max_cache_len_option(),
                Option("compile", "bool", False, "run decode steps under torch.compile (compile time reported apart)"),
            ),
            _static,
        ),
        Strategy(
            "quantized",
            "QuantizedCache (KIVI-style): old tokens quantized, the newest kept in a full-precision residual",
            (
                Option("backend", "choice", "quanto", "quantization library", choices=("quanto", "hqq", "fp8")),
                Option("nbits", "int", 4, "bits per value (quanto: 2, 4; hqq: 1, 2, 3, 4, 8)", minimum=1, maximum=8),
                Option("residual_length", "int", 128, "tokens kept in full precision before quantizing", minimum=1),
                Option("q_group_size", "int", 64, "values sharing one scale and zero point", minimum=1),
                Option("axis_key", "int", 0, "axis along which keys are grouped", minimum=-1, maximum=1),
                Option("axis_value", "int", 0, "axis along which values are grouped", minimum=-1, maximum=1),
            ),
            _quantized,
            check=_check_quantized,
            model_check=_quantized_model_check,
        ),
        Strategy(
            "sliding",
            "sliding window: attend to and keep only the most recent `window` tokens",
            (Option("window", "int", 256, "tokens each step attends to, the current one included", minimum=2),),
            _sliding,
        ),
        Strategy(
            "sink",
            "StreamingLLM attention sinks: the first tokens plus a recent window, keys re-rotated",
            (
                Option("sink_tokens", "int", 4, "first tokens kept forever", minimum=0),
                Option("window", "int", 252, "most recent tokens kept", minimum=1),
            ),
            _sink,
            model_check=_sink_model_check,
        ),
        Strategy(
            "offloaded",
            "DynamicCache with each layer moved to CPU memory between uses (CUDA only)",
            (),
            _offloaded,
            needs_cuda=True,
        ),
        Strategy(
            "offloaded-static",
            "StaticCache with layers offloaded to CPU memory between uses (CUDA only)",
            (_max_cache_len_option(),),
            _offloaded_static,
            needs_cuda=True,
        ),
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
    raw = dict(raw or {})
    known = {o.name for o in strategy.options}
    unknown = sorted(set(raw) - known)
    if unknown:
        accepted = ", ".join(sorted(known)) if known else "none"
        raise OptionError(f"strategy {name!r} has no option {unknown[0]!r}; its options: {accepted}")
    if name == "quantized" and str(raw.get("backend", "")) == "fp8":
        given = [k for k in GROUP_WISE if k in raw]
        if given:
            raise OptionError(
                f"backend 'fp8' quantizes per tensor and takes no {given[0]!r}; "
                "use backend=quanto or backend=hqq for group-wise options"
            )
    options = {o.name: o.parse(raw[o.name], name) if o.name in raw else o.default for o in strategy.options}
    if name == "quantized" and options["backend"] == "fp8":
        options = {"backend": "fp8"}
    problem = strategy.check(options)
    if problem:
        raise OptionError(problem)
    return StrategyChoice(name, options)


def parse_assignments(pairs: list[str]) -> dict[str, str]:
    """``["window=64", "sink_tokens=4"]`` -> dict; raises OptionError on a malformed pair."""
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise OptionError(f"--set expects key=value, got {pair!r}")
        result[key.strip()] = value.strip()
    return result


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
