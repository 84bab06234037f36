"""transformers' StaticCache: every token slot preallocated up front and written in place."""

import os
import shutil

from kvviz.engine.predict import CachePredictor
from kvviz.engine.strategies.base import Option, Strategy, encoder_decoder_cache, max_cache_len_option


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
    encoder_decoder = True

    def model_problem(self, model, geometry, options):
        encoder_layers = model.config.num_hidden_layers
        if geometry.encoder_decoder and encoder_layers != geometry.num_layers:
            return (f"cannot preallocate this encoder-decoder's cache: transformers' StaticCache sizes it by the "
                    f"encoder's {encoder_layers} layers, not the decoder's {geometry.num_layers}; run dynamic")
        if not options["compile"]:
            return None
        if geometry.encoder_decoder:
            return ("cannot run with compile=true on an encoder-decoder (kvviz compiles decoder-only steps); run with "
                    "compile=false")
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

        if model.config.is_encoder_decoder:  # the decoder's tokens preallocated; the encoder's output as it comes
            return encoder_decoder_cache(model, StaticCache(config=model.config, max_cache_len=capacity))
        return StaticCache(config=model.config, max_cache_len=capacity)

    def predictor(self, options, geometry, capacity):
        return StaticPredictor(geometry, capacity)
