"""transformers' StaticCache: every token slot preallocated up front and written in place."""

import os
import shutil

from kvviz.engine.predict import CachePredictor
from kvviz.engine.strategies.base import Option, Strategy, max_cache_len_option


class StaticPredictor(CachePredictor):
    def __init__(self, geometry, capacity: int):
        super().__init__(geometry)
        self.capacity = capacity

    def layer_bytes(self, i, window) -> int:
        slots = self.capacity if window is None else min(window, self.capacity)
        return slots * self.token_bytes(i)


class Static(Strategy):
    name = "static"
    description = "StaticCache: all token slots preallocated up front, written in place"
    reference = "transformers' StaticCache"
    options = (
        max_cache_len_option(),
        Option("compile", "bool", False, "run decode steps under torch.compile (compile time reported apart)"),
    )
    preallocates = True
    exact = True

    def model_problem(self, model, geometry, options):
        if not options["compile"]:
            return None
        if not getattr(model, "_can_compile_fullgraph", False):
            return f"cannot run with compile=true: transformers does not compile {type(model).__name__} as one graph"
        compiler = os.environ.get("CXX") or "g++"
        if model.device.type == "cpu" and not shutil.which(compiler):
            return (
                f"cannot run with compile=true: torch.compile needs a C++ compiler on the CPU and {compiler!r} is not "
                "installed (install g++, or set CXX); run with compile=false instead"
            )
        return None

    def make_cache(self, model, options, capacity):
        from transformers import StaticCache

        return StaticCache(config=model.config, max_cache_len=capacity)

    def predictor(self, options, geometry, capacity):
        return StaticPredictor(geometry, capacity)
