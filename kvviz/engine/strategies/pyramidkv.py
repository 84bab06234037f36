"""PyramidKV (Cai et al., 2024, "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling"):
SnapKV's choice with more tokens in the lower layers and fewer in the higher, the same total.

Of a prompt of n tokens, layer i keeps round(top - i * (top - bottom) / (layers - 1)) tokens, where the bottom layer's
share over the window is budget / beta and the top's makes the average the budget (top = 2 budget - bottom, no more
than n - window); where that cannot hold (the shares would not stay above the observation window), every layer keeps
the budget, as SnapKV. The formula is kvpress's PyramidKVPress's (from the authors' KVCache-Factory), whose defaults
these are (window 64, kernel 5, beta 20): at those defaults the pyramid needs a budget of at least
beta x window = 1,280 tokens, and below it PyramidKV is SnapKV with a window of 64.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.engine.scorers import Schedule
from kvviz.engine.strategies.base import Option
from kvviz.engine.strategies.eviction import EvictionStrategy, budget_option, scoring_options
from kvviz.engine.strategies.snapkv import ObservationWindow, check_window, window_options


@dataclass(frozen=True)
class PyramidSchedule(Schedule):
    window: int = 64
    beta: int = 20
    layers: int = 1

    def prompt_budget(self, index: int, tokens: int) -> int:
        bottom = self.budget / self.beta
        top = self.budget * 2 - bottom
        if top >= tokens - self.window:
            top = tokens - self.window
            bottom = self.budget * 2 - top
        if not tokens >= top >= bottom >= self.window:
            return self.budget
        steps = (top - bottom) / (self.layers - 1) if self.layers > 1 else 0.0
        return round(top - index * steps)


class PyramidKV(EvictionStrategy):
    name = "pyramidkv"
    description = "PyramidKV: SnapKV's choice with budgets falling from the lower layers to the higher, the same total"
    reference = ("PyramidKV (Cai et al., 2024), as kvpress's PyramidKVPress (window 64, kernel 5, beta 20: the "
                 "per-layer budgets of the authors' KVCache-Factory)")
    compresses_prompt = True
    options = (
        budget_option(minimum=2),
        *window_options(64),
        Option("beta", "int", 20, "steepness: the bottom layer keeps budget / beta over the window", minimum=1),
        *scoring_options(),
    )
    scorer = ObservationWindow

    def check_options(self, options):
        return check_window(self.name, options) or super().check_options(options)

    def schedule(self, options, geometry):
        return PyramidSchedule(options["budget"], options["decode_interval"], options["decode_target"],
                               options["decode_fraction"], options["window"], options["beta"],
                               geometry.num_layers if geometry is not None else 1)

    def prompt_kept(self, options) -> str:
        return (f"per layer from about {2 * options['budget']:,} tokens (the lowest) down to "
                f"{options['budget'] // options['beta']:,} over its window (the highest), {options['budget']:,} on "
                "average, chosen as SnapKV chooses")

    def make_scorer(self, index, options, model):
        return ObservationWindow(options["window"], options["kernel"], options["pooling"])
