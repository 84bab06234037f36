"""What every cache strategy is: typed options, checks, a cache, and the rule its size follows.

A strategy is a subclass of `Strategy` in a module of its own (this package); the registry in
`__init__.py` lists them. Everything that differs between strategies is an attribute or a method
here, so that no other module compares strategy names.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from kvviz.engine.geometry import KEEPS_TOKENS, Geometry
from kvviz.engine.own_caches import strategy_refusal
from kvviz.engine.predict import CachePredictor
from kvviz.errors import OptionError
from kvviz.present import strategy_label


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
        except (TypeError, ValueError, OverflowError):
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


# Every strategy with a cache takes it (`Strategy.__init_subclass__`): a prompt read a chunk per forward, as
# transformers' generate(prefill_chunk_size=N) reads it, the policy acting after each chunk (`CacheRun.prefill`)
PREFILL_CHUNK = Option("prefill_chunk", "int", 0, "read a prompt this many tokens per forward, the cache's policy "
                       "acting after each, as generate(prefill_chunk_size=N) does (0: the whole prompt in one "
                       "forward)", minimum=0)


@dataclass(frozen=True)
class Forward:
    """One forward that serves a prompt, as `first_token` predicts its cost from its shape."""

    fed: int  # tokens fed
    past: int  # tokens the cache held before it
    score_rows: int = 0  # queries whose attention scores and probabilities are held at once (0: none)...
    score_keys: int = 0  # ... over this many keys each
    extra_pairs: int = 0  # query-key pairs scored beside the attention (a policy's scorer), in all
    unkept: int = 0  # tokens every layer holds during it that it drops once the prompt is served (KVzip's)


@dataclass(frozen=True)
class StrategyChoice:
    """A validated strategy with all of its options filled in."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        return strategy_label({"name": self.name, "options": self.options})


class Strategy:
    """One cache strategy. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    description: ClassVar[str]  # what it keeps, in one line
    reference: ClassVar[str] = ""  # the paper or code it follows, and where kvviz departs from it
    options: ClassVar[tuple[Option, ...]] = ()
    needs_cuda: ClassVar[bool] = False
    has_cache: ClassVar[bool] = True  # False: every step recomputes the whole sequence
    evicts: ClassVar[bool] = False  # may drop tokens it has seen
    preallocates: ClassVar[bool] = False  # reserves every slot up front, indexed by absolute position
    # True: after an eviction the cache renumbers what it keeps, so the next token's position is the
    # number of tokens held rather than the number seen
    renumbers_positions: ClassVar[bool] = False
    keeps_first_tokens: ClassVar[bool] = False  # needs the start of the sequence (attention sinks)
    # True: predictions equal a full-precision cache's, whatever the length (nothing dropped, nothing
    # quantized), so an evaluation may feed many tokens per forward
    exact: ClassVar[bool] = False
    # True: evicts only from a prompt fed in one forward (SnapKV): fed one token at a time it never evicts, so an
    # evaluation gives it a prompt
    compresses_prompt: ClassVar[bool] = False
    # True: rounds what it keeps to a few bits, so a difference in float rounding (a batched forward's) can
    # move a value to the neighbouring level; an evaluation feeds it alone
    quantizes: ClassVar[bool] = False
    # True: many tokens fed together each attend to what they would alone inside `streamed` (a sliding window's band
    # of a mask, attention sinks' mask and turned queries), which needs a model that takes a mask of its own
    # (`cache_rows.unsupported`); `feed_span` then feeds a chunk at a time, the first ending where it first evicts
    masks_feeds: ClassVar[bool] = False
    # True: also runs an encoder-decoder's cache (self-attention keys and values beside cross-attention ones)
    encoder_decoder: ClassVar[bool] = False
    # True: its cache reads text of its own (KVzip asks the model to repeat the prompt): a run needs the tokenizer
    needs_tokenizer: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # its own options, then prefill_chunk where it keeps a cache (kept last however its options were composed)
        own = tuple(o for o in cls.options if o.name != PREFILL_CHUNK.name)
        cls.options = own + ((PREFILL_CHUNK,) if cls.has_cache else ())

    def prefill_chunk_problem(self, options: dict) -> str | None:
        """Why this strategy cannot read a prompt in chunks of `prefill_chunk` (set above 0), or None."""
        return None

    def prompt_continues(self, cache) -> None:
        """The next forward feeds `cache` more of the prompt it is reading in chunks (`CacheRun.prefill`): a policy that
        compresses its prompt compresses that chunk too."""

    def scores_every_query(self, options: dict) -> bool:
        """Whether the cache's policy scores every query of a prefill against every key it reads, beside the
        attention (H2O's sums), for `first_token`'s predictions: no."""
        return False

    def after_prefill_forwards(self, options: dict, tokens: int) -> list[Forward]:
        """The forwards the cache runs of its own after a prefill of `tokens` tokens (KVzip's reading again), for
        `first_token`'s predictions: none."""
        return []

    def prompt_forwards(self, options: dict, tokens: int) -> list[int]:
        """The tokens each forward of a prefill of `tokens` tokens feeds: all of them, or chunks of prefill_chunk."""
        chunk = options.get(PREFILL_CHUNK.name) or tokens
        return [min(chunk, tokens - start) for start in range(0, tokens, chunk)] if tokens else []

    def predict_prompt(self, predictor: CachePredictor, options: dict, tokens: int) -> None:
        """Replay on `predictor` a prompt of `tokens` tokens read as a prefill (`CacheRun.prefill`)."""
        for k, size in enumerate(self.prompt_forwards(options, tokens)):
            if k:
                predictor.more_prompt()
            predictor.feed(size)

    def feed_span(self, options: dict, seen: int, chunk: int) -> int:
        """The most tokens, at most `chunk`, that an evaluation's next forward may feed a cache of these options once
        it has been fed `seen` (its prompt first, where it has one), for the cache to end as one fed them a token at a
        time would, each of them attending to what it would have attended to: the whole `chunk` for a cache that
        keeps every token exactly or `masks_feeds` (the first chunk that evicts ending at the token that one token at
        a time would first evict at, so that an evaluation marks that token), else 1 (a cache that changes what it
        holds between two tokens)."""
        if self.masks_feeds:
            first_eviction = self.prompt_capacity(options) + 1
            return min(chunk, first_eviction - seen) if seen < first_eviction else chunk
        return chunk if self.exact else 1

    def steps(self, options: dict) -> bool:
        """Whether a cache of these options changes what it holds between two tokens, once it evicts, in a way no
        span or mask follows (where `feed_span` says 1): an evaluation in chunks then steps every attention layer
        through each chunk a token at a time (`stepped_reading`)."""
        return not (self.exact or self.masks_feeds or self.quantizes)

    def feed_forwards(self, size: int) -> list[int]:
        """The forwards in which an evaluation feeds the `size` tokens of one span (`feed_span`): one."""
        return [size]

    def streamed(self, run, n: int) -> AbstractContextManager[torch.Tensor | None]:
        """Around a forward that feeds `run`'s cache `n` tokens together, for each to attend to what it would if fed
        alone (`masks_feeds`): gives the mask of which keys the cache returns each attends to, ``[1, 1, n, keys]``;
        None: the model's causal mask, all the cache returns up to the token."""
        return nullcontext()

    # -- options -------------------------------------------------------------------------------------

    def option(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)

    def parse_options(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Every option filled in: parsed from `raw` (strings or typed values) or its default."""
        known = {o.name for o in self.options}
        unknown = sorted(set(raw) - known)
        if unknown:
            accepted = ", ".join(sorted(known)) if known else "none"
            raise OptionError(f"strategy {self.name!r} has no option {unknown[0]!r}; its options: {accepted}")
        return {o.name: o.parse(raw[o.name], self.name) if o.name in raw else o.default for o in self.options}

    def check_options(self, options: dict[str, Any]) -> str | None:
        """Why these (parsed) options cannot work together, or None."""
        return None

    def check_all(self, options: dict[str, Any]) -> str | None:
        """Why these (parsed) options cannot work together, the options every strategy shares included, or None."""
        if options.get(PREFILL_CHUNK.name):
            problem = self.prefill_chunk_problem(options)
            if problem:
                return f"strategy {self.name!r} with prefill_chunk={options[PREFILL_CHUNK.name]}: {problem}"
        return self.check_options(options)

    # -- this machine and this model -----------------------------------------------------------------

    def available(self) -> tuple[bool, str]:
        if self.needs_cuda and not torch.cuda.is_available():
            return False, "needs a CUDA device (it offloads cache layers from GPU memory to the CPU); none here"
        return True, ""

    def unsupported(self, model, options: dict | None = None) -> str | None:
        """Why `model` cannot use this strategy with `options` (defaults if None), or None."""
        if options is None:
            options = {o.name: o.default for o in self.options}
        geometry = Geometry.of(model.config, model.dtype)
        if geometry.encoder_decoder and not self.encoder_decoder:
            return ("acts on a decoder-only model's keys and values, and this model is an encoder-decoder (its decoder "
                    "attends to the encoder's output through cross-attention keys and values kept whole); run "
                    "dynamic, static or none")
        problem = strategy_refusal(model)
        if problem and self.name not in ("dynamic", "none"):
            return problem
        return self.model_problem(model, geometry, options)

    def model_problem(self, model, geometry: Geometry, options: dict) -> str | None:
        return None

    def switch_to_problem(self, options: dict) -> str | None:
        """Why a live cache cannot be switched to this strategy with `options`, or None."""
        return None

    def after_forward(self, run, input_ids: torch.Tensor) -> None:
        """What the cache does once a forward of `input_ids` through it has run (`CacheRun.forward`): KVzip reads the
        prompt again there. It acts after the prompt's forward only: an evaluation reads the tokens that follow in
        chunks (`EvictionStrategy.appends`), which would skip an action between two of them."""

    def switch_from_problem(self, options: dict) -> str | None:
        """Why a cache of this strategy with `options` that has evicted tokens cannot be switched to another, or
        None."""
        return None

    # -- the cache -----------------------------------------------------------------------------------

    def make_cache(self, model, options: dict, capacity: int):
        """A new, empty cache for `model` (None for no cache); `capacity` is the token slots a run needs."""
        raise NotImplementedError

    def warm_up(self, options: dict, device: torch.device, notify) -> bool:
        """One-time preparation before the first step (kernel builds), timed apart from the steps;
        `notify(message)` says what is happening while it lasts. True if there was any."""
        return False

    def reading(self, cache) -> AbstractContextManager:
        """Around an evaluation's reading of a text through `cache` (nothing timed as a user's decode): the cache may
        skip work whose result it already holds, as long as every bit it returns is the same."""
        return nullcontext()

    def predictor(self, options: dict, geometry: Geometry, capacity: int) -> CachePredictor:
        """The size this strategy's cache should have after each step, from the config alone."""
        return CachePredictor(geometry)

    def positions_needed(self, options: dict, tokens: int) -> int:
        """The positions a run of `tokens` tokens numbers its tokens with (checked against the model's context)."""
        return tokens

    def prompt_capacity(self, options: dict) -> int | None:
        """The most tokens a prompt may have for this cache to keep it whole (None: any prompt): a prediction from
        the options alone, to warn before a run (a run measures what its cache really dropped: `CacheRun.evicted`)."""
        return None

    def prompt_overflows(self, options: dict, tokens: int) -> bool:
        """Whether part of a prompt of `tokens` tokens is gone before the first new token (`prompt_capacity`)."""
        capacity = self.prompt_capacity(options)
        return capacity is not None and tokens > capacity

    def prompt_kept(self, options: dict) -> str:
        """Which of a long prompt's tokens this cache keeps after the prefill ("its last 255 tokens"), for
        `prompt_note`; strategies with a `prompt_capacity` say it."""
        raise NotImplementedError

    def prompt_note(self, options: dict, tokens: int) -> str | None:
        """What this cache does to a prompt of `tokens` tokens when it cannot keep all of it (None: it keeps it
        whole), said before a run in the window and on the command line."""
        if not self.prompt_overflows(options, tokens):
            return None
        chunk = options.get(PREFILL_CHUNK.name)
        read = (f"the prefill reads it {chunk:,} tokens at a time, the cache keeping after each chunk"
                if chunk and chunk < tokens else "the prefill reads all of it, then the cache keeps")
        return (f"The prompt is {tokens:,} tokens, more than this cache keeps ({self.prompt_capacity(options):,}): "
                f"{read} {self.prompt_kept(options)}. The first new token attends to those alone; the rest of the "
                "prompt reaches it only through them.")

    def to_dict(self) -> dict[str, Any]:
        ok, reason = self.available()
        return {
            "name": self.name,
            "description": self.description,
            "reference": self.reference,
            "available": ok,
            "reason": reason,
            "options": [o.to_dict() for o in self.options],
        }


def rotary_embedding(model):
    """The model's rotary position embedding module (`rotary_emb`), or None."""
    base = getattr(model, "base_model", model)
    return getattr(base, "rotary_emb", None)


def rotary_inv_freq(model) -> torch.Tensor | None:
    """The inverse RoPE frequencies shared by all layers, if the model has exactly one rotary embedding."""
    inv_freq = getattr(rotary_embedding(model), "inv_freq", None)
    return inv_freq if isinstance(inv_freq, torch.Tensor) else None


def only_full_attention(geometry: Geometry) -> str | None:
    if geometry.hybrid:
        return "works only with models whose layers all use full attention; this model has sliding-window layers"
    return None


def encoder_decoder_cache(model, self_attention):
    """An encoder-decoder's cache: `self_attention` (a cache of the decoder's own tokens) beside a DynamicCache
    that the first forward fills with the cross-attention keys and values of the encoder's output, as generate
    builds it."""
    from transformers import DynamicCache, EncoderDecoderCache

    return EncoderDecoderCache(self_attention, DynamicCache())


def max_cache_len_option() -> Option:
    return Option("max_cache_len", "int", 0, "token slots to preallocate; 0 means prompt + max new tokens", minimum=0)


def attention_layers_problem(geometry: Geometry, acts: str, latent: bool = False) -> str | None:
    """Why a strategy that `acts` on attention layers of plain keys and values (and leaves linear-attention and
    state-space layers to transformers, as they are) cannot run on this model, or None. `latent`: it also works on
    multi-head latent attention's cached latent."""
    if not any(kind in KEEPS_TOKENS for kind in geometry.kinds):
        return (f"{acts}, and this model has no attention layers: its cache is the fixed-size state of "
                "linear-attention or state-space layers, which nothing can shrink; run dynamic or static")
    kinds = [kind for kind in geometry.kinds if kind not in ("attention", "sliding", "state")]
    if kinds or (geometry.latent is not None and not latent):
        return f"{acts}, and this model has {geometry.unusual_layers(('state',), latent)}; run dynamic or static"
    return None


def keep_own_layers(model, layers: list) -> list:
    """`layers` (one per decoder layer, a strategy's) with transformers' own cache layer in place of each layer
    that keeps no keys and values (linear-attention and state-space layers, KV-shared layers), as DynamicCache
    builds them: a strategy acts on attention layers and leaves those alone."""
    from transformers import DynamicCache

    kinds = Geometry.of(model.config, model.dtype).kinds
    own = DynamicCache(config=model.config).layers
    return [layer if kind in KEEPS_TOKENS else mine for layer, kind, mine in zip(layers, kinds, own, strict=True)]
