"""transformers' DynamicCache: keys and values grow by one token per step."""

from kvviz.engine.strategies.base import Strategy


class Dynamic(Strategy):
    name = "dynamic"
    description = "DynamicCache: keys and values grow by one token per step"
    reference = "transformers' DynamicCache"
    exact = True

    def make_cache(self, model, options, capacity):
        from transformers import DynamicCache

        return DynamicCache(config=model.config)
