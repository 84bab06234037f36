"""StreamingLLM attention sinks: the first tokens plus a recent window, kept keys re-rotated."""


from kvviz.engine.geometry import Geometry
from kvviz.engine.predict import CachePredictor
from kvviz.engine.strategies.base import (
    Option,
    Strategy,
    attention_layers_problem,
    keep_own_layers,
    only_full_attention,
    rotary_inv_freq,
)


class SinkPredictor(CachePredictor):
    def __init__(self, geometry, kept: int):
        super().__init__(geometry)
        self.kept = kept

    def layer_bytes(self, i, window) -> int:
        return min(self.seen[i], self.kept) * self.token_bytes(i)


class Sink(Strategy):
    name = "sink"
    description = "StreamingLLM attention sinks: the first tokens plus a recent window, keys re-rotated"
    reference = (
        "StreamingLLM (Xiao et al., ICLR 2024): kept keys re-rotated to consecutive positions, as in the paper and "
        "transformers' former SinkCache"
    )
    options = (
        Option("sink_tokens", "int", 4, "first tokens kept forever", minimum=0),
        Option("window", "int", 252, "most recent tokens kept", minimum=1),
    )
    evicts = True
    renumbers_positions = True
    keeps_first_tokens = True
    masks_feeds = True

    def model_problem(self, model, geometry, options):
        problem = attention_layers_problem(geometry, "re-rotates the keys it keeps")
        if problem:
            return problem
        if rotary_inv_freq(model) is None:
            return "needs a model with one rotary position embedding (RoPE) to re-rotate kept keys; this model has none"
        return only_full_attention(geometry)

    def make_cache(self, model, options, capacity):
        from transformers.cache_utils import Cache

        from kvviz.engine.layers import SinkLayer

        inv_freq = rotary_inv_freq(model)
        n_layers = Geometry.of(model.config, model.dtype).num_layers
        layers = [SinkLayer(options["sink_tokens"], options["window"], inv_freq) for _ in range(n_layers)]
        return Cache(layers=keep_own_layers(model, layers))

    def streamed(self, run, n):
        from kvviz.engine.sink_reading import fed_alone

        return fed_alone(run, n)

    def predictor(self, options, geometry, capacity):
        return SinkPredictor(geometry, options["sink_tokens"] + options["window"])

    def positions_needed(self, options, tokens) -> int:
        # kept keys are re-rotated down after each eviction: positions never pass what is kept
        return min(tokens, options["sink_tokens"] + options["window"] + 1)

    def prompt_capacity(self, options) -> int:
        return options["sink_tokens"] + options["window"]

    def prompt_kept(self, options) -> str:
        return f"its first {options['sink_tokens']:,} tokens (the sinks) and its last {options['window']:,}"
