"""transformers' caches with offloading: each layer parked in CPU memory between uses (CUDA only)."""


from kvviz.engine.strategies.base import Strategy, max_cache_len_option
from kvviz.engine.strategies.static import StaticPredictor


class Offloaded(Strategy):
    name = "offloaded"
    description = "DynamicCache with each layer moved to CPU memory between uses (CUDA only)"
    reference = "transformers' DynamicCache(offloading=True)"
    needs_cuda = True
    exact = True

    def make_cache(self, model, options, capacity):
        from transformers import DynamicCache

        return DynamicCache(config=model.config, offloading=True)


class OffloadedStatic(Strategy):
    name = "offloaded-static"
    description = "StaticCache with layers offloaded to CPU memory between uses (CUDA only)"
    reference = "transformers' StaticCache(offloading=True)"
    options = (max_cache_len_option(),)
    needs_cuda = True
    exact = True
    preallocates = True

    def make_cache(self, model, options, capacity):
        from transformers import StaticCache

        return StaticCache(config=model.config, max_cache_len=capacity, offloading=True)

    def predictor(self, options, geometry, capacity):
        return StaticPredictor(geometry, capacity)
