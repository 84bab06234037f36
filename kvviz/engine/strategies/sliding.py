"""A sliding window: keep and attend to only the most recent `window` tokens."""

from contextlib import contextmanager

import torch

from kvviz.engine.geometry import Geometry
from kvviz.engine.predict import CachePredictor
from kvviz.engine.strategies.base import Option, Strategy, attention_layers_problem, keep_own_layers


class SlidingPredictor(CachePredictor):
    def __init__(self, geometry, window: int):
        super().__init__(geometry)
        self.window = window

    def layer_bytes(self, i, native) -> int:
        window = self.window if native is None else min(native, self.window)
        return self.growing_tokens(i, window) * self.token_bytes(i)


class Sliding(Strategy):
    name = "sliding"
    description = "sliding window: attend to and keep only the most recent window tokens"
    reference = "transformers' DynamicSlidingWindowLayer (the window of Longformer and Mistral)"
    options = (Option("window", "int", 256, "tokens each step attends to, the current one included", minimum=2),)
    evicts = True
    masks_feeds = True

    def model_problem(self, model, geometry, options):
        return attention_layers_problem(geometry, "keeps a window of keys and values", latent=True)

    def make_cache(self, model, options, capacity):
        from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

        from kvviz.engine.layers import WindowedFullAttentionLayer

        window = options["window"]
        layers = [
            WindowedFullAttentionLayer(sliding_window=window)
            if native is None
            else DynamicSlidingWindowLayer(sliding_window=min(window, native))
            for native in Geometry.of(model.config, model.dtype).windows
        ]
        return Cache(layers=keep_own_layers(model, layers))

    def feed_forwards(self, size):
        # a DynamicSlidingWindowLayer keeps a view of all a forward returned, more storage than one token at a time
        # leaves: a span's last token fed alone leaves the same
        return [size - 1, 1] if size > 1 else [size]

    @contextmanager
    def streamed(self, run, n):
        window, seen = run.choice.options["window"], run.seen
        first = max(0, seen - (window - 1))  # the position of the first key returned: each layer holds window - 1
        queries = torch.arange(seen, seen + n, device=run.model.device)[:, None]
        keys = torch.arange(first, seen + n, device=run.model.device)[None]
        yield ((keys <= queries) & (keys > queries - window))[None, None]

    def predictor(self, options, geometry, capacity):
        return SlidingPredictor(geometry, options["window"])

    def prompt_capacity(self, options) -> int:
        # the window counts the token being decoded, so a layer holds window - 1 between steps
        return options["window"] - 1

    def prompt_kept(self, options) -> str:
        return f"its last {options['window'] - 1:,} tokens"
