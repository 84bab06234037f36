"""transformers' DynamicCache: keys and values grow by one token per step."""

from kvviz.engine.own_caches import dynamic_cache
from kvviz.engine.strategies.base import Strategy, encoder_decoder_cache


class Dynamic(Strategy):
    name = "dynamic"
    description = "DynamicCache: keys and values grow by one token per step"
    reference = "transformers' DynamicCache"
    exact = True
    encoder_decoder = True

    def make_cache(self, model, options, capacity):
        from transformers import DynamicCache

        if model.config.is_encoder_decoder:  # its layers are built as the decoder's forward reaches them
            return encoder_decoder_cache(model, DynamicCache())
        return dynamic_cache(model.config)
