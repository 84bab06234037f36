"""transformers' StaticCache: every token slot preallocated up front and written in place."""

from transformers import StaticCache

from kvviz.engine.predict import CachePredictor
from kvviz.engine.strategies.base import Option, Strategy, max_cache_len_option


class StaticPredictor(CachePredictor):
    def __init__(self, geometry, capacity: int):
        super().__init__(geometry)
        self.capacity = capacity

    def layer_bytes(self, i, window, new) -> int:
        slots = self.capacity if window is None else min(window, self.capacity)
        return slots * self.geometry.token_bytes


class Static(Strategy):
    name = "static"
    description = "StaticCache: all token slots preallocated up front, written in place"
    options = (
        max_cache_len_option(),
        Option("compile", "bool", False, "run decode steps under torch.compile (compile time reported apart)"),
    )
    preallocates = True
    exact = True

    def make_cache(self, model, options, capacity):
        return StaticCache(config=model.config, max_cache_len=capacity)

    def predictor(self, options, geometry, capacity):
        return StaticPredictor(geometry, capacity)
