"""No cache: every step feeds the whole sequence again."""

from kvviz.engine.predict import CachePredictor
from kvviz.engine.strategies.base import Strategy


class NoCachePredictor(CachePredictor):
    def cache_bytes(self) -> int:
        return 0


class NoCache(Strategy):
    name = "none"
    description = "no cache: the whole sequence is recomputed at every step"
    reference = "transformers with use_cache=False"
    has_cache = False
    exact = True
    encoder_decoder = True

    def make_cache(self, model, options, capacity):
        return None

    def predictor(self, options, geometry, capacity):
        return NoCachePredictor(geometry)
