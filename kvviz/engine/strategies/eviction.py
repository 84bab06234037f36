"""What the importance-based eviction strategies share: a token budget per layer, when the budget is applied (the
schedule), the wrappers any scoring policy takes (adaptive, chunk, critical), full-attention models only, kvviz's
attention function installed when a policy reads attention, and the size rule of keys, values and the policy's own
bookkeeping.

Each policy (h2o, tova, snapkv, knorm, expected_attention, ...) is a module of its own: its strategy (an
`EvictionStrategy`: options, checks, what it keeps) and its scorer (an `scorers.Scorer`: what it ranks held
tokens by), which the one `eviction_layers.EvictionLayer` runs. A policy may leave its first layers whole, as plain
DynamicLayers (key norm, as its authors do).

When a layer compresses (`Schedule`): the first feed (the prompt) is cut to `budget` when longer; after it, every
`decode_interval` tokens fed (0: never) the layer is cut to `decode_target` tokens (0: the budget), or to
`decode_fraction` of all the tokens seen when that is set. kvpress's presses compress the prompt only (its
`DecodingPress` and `CompressionRatioDecodingPress` add the decoding part, experimental there); H2O, TOVA and key norm
evict at every step over the budget (decode_interval=1), as their papers do. Budgets are in tokens; kvpress's
compression ratio for a prompt of n tokens is 1 - budget / n (`kvpress_ratio`).

At a live switch the held tokens are handed to the new layers (`EvictionLayer.receive`) without a forward, so there is
no attention to score them with: they count as the prompt, and the first step after the switch compresses them with
its own token, from that step's attention (H2O's sums start there; SnapKV takes that step's query as its observation
window; key norm needs none). That step's record shows the budget.
"""

from __future__ import annotations

from typing import ClassVar

from kvviz.engine.geometry import Geometry
from kvviz.engine.own_caches import layers_of
from kvviz.engine.predict import CachePredictor
from kvviz.engine.scorers import ADAPTIVE_SAFEGUARD, Schedule, ScheduleState, Scorer, chunk_kept
from kvviz.engine.strategies.base import (
    Option,
    Strategy,
    attention_layers_problem,
    keep_own_layers,
    only_full_attention,
)
from kvviz.present import WRAPPERS_OFF

POSITION_BYTES = 8  # an int64 position, what an EvictionLayer keeps per token and KV head
NORM_BYTES = 4  # critical=1: the float32 norm of each held token's value through the output projection, per KV head


def budget_option(minimum: int = 1) -> Option:
    return Option("budget", "int", 256, "tokens each layer keeps (kvpress's compression ratio for a prompt of n "
                  "tokens is 1 - budget / n)", minimum=minimum)


def scoring_options(decode_interval: int = 0) -> tuple[Option, ...]:
    """The options every scoring policy takes beside its own: the wrappers and compression during decoding.
    `decode_interval`: the policy's default (1: every step over the budget; 0: the prompt only)."""
    return (
        Option("adaptive", "bool", False, "AdaKV: the layer's budget shared among its KV heads by score (each keeps at "
               f"least {ADAPTIVE_SAFEGUARD:.0%} of its share), the same total"),
        Option("chunk", "int", 0, "ChunkKV: keep whole chunks of this many tokens, ranked by their mean score over the "
               "KV heads (0: single tokens; kvpress's default length is 20)", minimum=0),
        Option("critical", "bool", False, "CriticalKV: half the budget by the scores, the rest by the scores weighted "
               "by each value's norm through the output projection"),
        Option("decode_interval", "int", decode_interval, "after the prompt, compress every this many tokens fed "
               "(0: never; 1: at every step over the target)", minimum=0),
        Option("decode_target", "int", 0, "tokens kept at each compression after the prompt (0: the budget)",
               minimum=0),
        Option("decode_fraction", "float", 0.0, "if above 0: the share of all tokens seen kept at each compression "
               "after the prompt, instead of decode_target", minimum=0.0, maximum=1.0),
    )


def kvpress_ratio(budget: int, tokens: int) -> float:
    """kvpress's compression ratio that keeps `budget` of a prompt of `tokens` tokens (0 when it keeps them all)."""
    return max(0.0, 1.0 - budget / tokens) if tokens else 0.0


class BudgetPredictor(CachePredictor):
    """Each compressed layer holds what it was fed until its schedule cuts it (`Schedule`); the first `whole` layers
    keep everything (DynamicLayer). Beside keys and values a compressed layer's policy keeps the position of every
    token it holds and of every key the latest feed returned (one tensor when the policy chose nothing in that feed;
    `EvictionLayer`), and `score_bytes` per token held and KV head (H2O's accumulated attention, CriticalKV's norms).
    Once an adaptive layer has chosen, its KV heads hold different numbers of tokens, laid end to end: the positions of
    what it holds and the number each head holds, and no more the positions of what a feed returned."""

    def __init__(self, geometry, schedule: Schedule, score_bytes: int = 0, whole: int = 0, chunk: int = 0,
                 adaptive: bool = False):
        super().__init__(geometry)
        self.schedule = schedule
        self.score_bytes = score_bytes
        self.whole = whole
        self.chunk = chunk
        self.adaptive = adaptive
        n = geometry.num_layers
        self.held = [0] * n  # per layer: tokens held
        self.returned = [0] * n  # per layer: tokens the latest feed returned to attention (held before it, and new)
        self.chose = [False] * n  # per layer: whether the policy gathered what it keeps in the latest feed
        self.scored = [0] * n  # per layer: tokens with a score
        self.states = [ScheduleState() for _ in range(n)]
        self.ragged = [False] * n  # per layer: an adaptive choice made its KV heads hold different numbers

    def advance(self, i, new, received) -> None:
        if received:  # kept as given, unscored, until the next feed (the prompt again) chooses
            self.held[i], self.returned[i], self.chose[i], self.scored[i] = new, new, False, 0
            self.states[i] = ScheduleState()
            self.ragged[i] = False
            return
        self.returned[i] = self.held[i] + new
        target = self.schedule.compress_to(self.states[i], i, self.returned[i], new, self.seen[i])
        self.chose[i] = target is not None
        self.ragged[i] = self.ragged[i] or (self.chose[i] and self.adaptive)
        if target is None:
            self.held[i] = self.returned[i]
        else:
            self.held[i] = chunk_kept(self.returned[i], target, self.chunk) if self.chunk else target
        self.scored[i] = self.held[i]

    def more_prompt(self) -> None:
        for state in self.states:
            state.prompt = True

    def layer_bytes(self, i, window) -> int:
        tokens = self.seen[i] if i < self.whole else self.held[i]
        return tokens * self.token_bytes(i)

    def policy_bytes(self) -> int:
        total = 0
        for i in range(self.whole, self.geometry.num_layers):
            if not self.geometry.layer_token_bytes[i]:  # a state layer: transformers' own, no policy
                continue
            if self.ragged[i]:  # the positions held, and the number each head holds
                positions = self.held[i] + 1
            else:
                positions = self.returned[i] + (self.held[i] if self.chose[i] else 0)
            total += POSITION_BYTES * positions + self.score_bytes * self.scored[i]
        return total * self.geometry.batch * self.geometry.kv_heads


class EvictionStrategy(Strategy):
    evicts = True
    scorer: ClassVar[type[Scorer]]  # what the policy ranks held tokens by
    score_bytes: ClassVar[int] = 0  # what the policy keeps per token held and KV head beside its positions

    @property
    def reads_attention(self) -> bool:
        return self.scorer.reads_attention

    def make_scorer(self, index: int, options: dict, model) -> Scorer:
        """The policy's scorer for decoder layer `index` of `model` (None: a scorer's unit test without a model)."""
        return self.scorer()

    def schedule(self, options: dict, geometry: Geometry) -> Schedule:
        return Schedule.of(options)

    def appends(self, options: dict) -> bool:
        """Whether it compresses only its prompt (its first feed) and then neither compresses nor watches attention:
        it only appends after it, as a full cache does (an adaptive layer's KV heads, which then hold different
        numbers, have each feed's padding masked and are laid end to end again after it, all at once)."""
        return self.compresses_prompt and not options.get("decode_interval") and not self.scorer.every_feed

    def steps(self, options):
        return not self.appends(options)

    def feed_span(self, options, seen, chunk):
        if self.appends(options) and seen:
            return chunk
        # one that evicts at every step over its budget, unwrapped, holds every token it was fed until then: fed
        # together, they are a prompt that fits it (H2O's sums are then every query's attention, causally)
        wrapped = any(options.get(name, off) != off for name, off in WRAPPERS_OFF.items())
        capacity = self.prompt_capacity(options)
        if not self.compresses_prompt and not wrapped and options.get("decode_interval") == 1 and seen < capacity:
            return min(chunk, capacity - seen)
        return 1

    def scores_every_query(self, options):
        return self.scorer.every_feed

    def prompt_continues(self, cache) -> None:
        from kvviz.engine.eviction_layers import EvictionLayer

        for layer in layers_of(cache):
            if isinstance(layer, EvictionLayer):
                layer.state.prompt = True

    def whole_layers(self, options: dict) -> int:
        """The first layers the policy leaves whole (plain DynamicLayers)."""
        return 0

    def check_options(self, options):
        return check_scoring_options(self.name, options)

    def model_problem(self, model, geometry, options):
        from kvviz.engine import attention_scores

        problem = attention_layers_problem(geometry, "evicts keys and values by importance")
        problem = problem or only_full_attention(geometry)
        if problem is None and (self.reads_attention or options.get("adaptive")):
            problem = attention_scores.unsupported(model)
        if problem is None and options.get("critical"):
            try:
                output_projection(model, 0)
            except ValueError as exc:
                problem = f"with critical=true needs each attention's output projection: {exc}"
        return problem

    def make_layer(self, index: int, options: dict, model=None):
        """The EvictionLayer of decoder layer `index` (kvviz.engine.eviction_layers); `model` gives what a scorer or
        wrapper reads of the model itself (rotary embedding, output projection), None where none does."""
        from kvviz.engine.eviction_layers import EvictionLayer

        geometry = None if model is None else Geometry.of(model.config, model.dtype)
        output = output_projection(model, index) if options.get("critical") else None
        return EvictionLayer(index, self.make_scorer(index, options, model), self.schedule(options, geometry),
                             chunk=options.get("chunk", 0), critical=output, adaptive=options.get("adaptive", False))

    def make_cache(self, model, options, capacity):
        from transformers.cache_utils import Cache, DynamicLayer

        from kvviz.engine import attention_scores

        whole = self.whole_layers(options)
        # kvviz's attention masks an adaptive layer's padding, and fits the mask to layers kept whole beside
        # compressed ones (`attention_scores.fitted`)
        if self.reads_attention or options.get("adaptive") or whole:
            attention_scores.install(model)
        n_layers = Geometry.of(model.config, model.dtype).num_layers
        layers = [DynamicLayer() if i < whole else self.make_layer(i, options, model) for i in range(n_layers)]
        return Cache(layers=keep_own_layers(model, layers))

    def predictor(self, options, geometry, capacity):
        score_bytes = self.score_bytes + (NORM_BYTES if options.get("critical") else 0)
        return BudgetPredictor(geometry, self.schedule(options, geometry), score_bytes=score_bytes,
                               whole=self.whole_layers(options), chunk=options.get("chunk", 0),
                               adaptive=options.get("adaptive", False))

    def prompt_capacity(self, options) -> int:
        return options["budget"]

    def prompt_note(self, options, tokens):
        note = super().prompt_note(options, tokens)
        ratio = kvpress_ratio(options["budget"], tokens)
        return note and f"{note} (kvpress's compression ratio for this prompt: {ratio:.2f})"

    def switch_from_problem(self, options):
        if options.get("adaptive"):
            return (f"{self.name!r} with adaptive=true keeps a different number of tokens in each KV head, which no "
                    "other cache can take over; start a new run")
        return None


def check_scoring_options(name: str, options: dict) -> str | None:
    """Why the wrapper and decoding options of policy `name` cannot work together, or None."""
    if options.get("chunk") and options.get("adaptive"):
        return (f"options 'chunk' and 'adaptive' of strategy {name!r} cannot go together: chunk keeps the same whole "
                "chunks in every KV head, adaptive gives each KV head its own tokens; choose one")
    if options.get("chunk", 0) > options["budget"]:
        return (f"option 'chunk' of strategy {name!r} ({options['chunk']}) must be at most 'budget' "
                f"({options['budget']}): a layer keeps whole chunks within its budget")
    if options.get("decode_fraction") and options.get("decode_target"):
        return (f"options 'decode_target' and 'decode_fraction' of strategy {name!r} both set the size after a "
                "compression during decoding; give one")
    if (options.get("decode_target") or options.get("decode_fraction")) and not options.get("decode_interval"):
        return (f"option 'decode_interval' of strategy {name!r} is 0, so nothing is compressed during decoding; set "
                "it (e.g. decode_interval=64) for 'decode_target' or 'decode_fraction' to act")
    return None


def output_projection(model, index: int):
    """The weight of decoder layer `index`'s attention output projection ``[hidden, heads * head_dim]``."""
    for module in model.modules():
        if getattr(module, "layer_idx", None) == index and hasattr(module, "o_proj"):
            return module.o_proj.weight
    raise ValueError(f"layer {index} of {type(model).__name__} has no attention output projection (o_proj)")
