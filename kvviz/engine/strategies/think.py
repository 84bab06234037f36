"""ThinK (Xu et al., 2025, "ThinK: Thinner Key Cache by Query-Driven Pruning", ICLR): keep every token, but the
prompt's keys with fewer channels.

At the prompt, per KV head, each key channel is scored by how much the last `window` queries use it (the mean of
q_c^2, averaged over the query heads of the KV head) times how large the prompt's keys are in it (the mean of k_c^2);
the lowest `key_channels` share of the channels is pruned from the prompt's keys. kvviz stores those keys without the
pruned channels (`kvviz.engine.channel_layers`), so the bytes follow the head dimension: the prompt's keys cost
(head_dim - pruned) / head_dim of theirs, values and later keys are whole. Attention sees the pruned channels as zero,
which is what kvpress's ThinKPress computes with (it sets them to zero and keeps them in memory); as kvpress, keys
fed after the prompt are kept whole. kvpress's default share is 0 (nothing pruned); 0.5 here, as the paper's and
kvpress's examples prune half.
"""

from __future__ import annotations

from kvviz.engine.geometry import Geometry
from kvviz.engine.predict import CachePredictor
from kvviz.engine.strategies.base import (
    Option,
    Strategy,
    attention_layers_problem,
    keep_own_layers,
    only_full_attention,
)

CHANNEL_BYTES = 8  # an int64 index per kept key channel and KV head: the policy's state


def pruned_channels(options: dict, head_dim: int) -> int:
    return int(head_dim * options["key_channels"])


class ChannelPredictor(CachePredictor):
    """The first feed (or what a live switch moved in, with the feed after it) is the prompt: its keys lose the pruned
    channels; later tokens are whole."""

    def __init__(self, geometry, pruned: int):
        super().__init__(geometry)
        self.pruned = pruned
        self.prompt = [None] * geometry.num_layers  # per layer: the prompt's tokens once pruned
        self.pending = [0] * geometry.num_layers  # per layer: tokens a switch moved in, pruned with the next feed

    def advance(self, i, new, received) -> None:
        if received:
            self.prompt[i], self.pending[i] = None, new
        elif self.prompt[i] is None:
            self.prompt[i], self.pending[i] = self.pending[i] + new, 0

    def layer_bytes(self, i, window) -> int:
        tokens = self.seen[i] if self.geometry.layer_token_bytes[i] else 0
        if not tokens or self.prompt[i] is None:
            return tokens * self.token_bytes(i)
        geometry = self.geometry
        key_channel = geometry.batch * geometry.kv_heads * geometry.element  # one key channel of one token
        return tokens * self.token_bytes(i) - self.prompt[i] * self.pruned * key_channel

    def policy_bytes(self) -> int:
        geometry = self.geometry
        chosen = sum(1 for i, prompt in enumerate(self.prompt) if prompt is not None and geometry.layer_token_bytes[i])
        return chosen * geometry.batch * geometry.kv_heads * (geometry.head_dim - self.pruned) * CHANNEL_BYTES


class ThinK(Strategy):
    name = "think"
    description = "ThinK: every token kept, the prompt's keys without the key channels its queries use least"
    reference = ("ThinK (Xu et al., ICLR 2025), as kvpress's ThinKPress (window 32; kvpress zeroes the channels in "
                 "memory, kvviz stores the keys without them)")
    options = (
        Option("key_channels", "float", 0.5, "share of each KV head's key channels pruned from the prompt's keys",
               minimum=0.0, maximum=0.99),
        Option("window", "int", 32, "last prompt tokens whose queries score the channels", minimum=1),
    )
    compresses_prompt = True

    def model_problem(self, model, geometry, options):
        from kvviz.engine import attention_scores

        problem = attention_layers_problem(geometry, "prunes key channels")
        return problem or only_full_attention(geometry) or attention_scores.unsupported(model)

    def make_cache(self, model, options, capacity):
        from transformers.cache_utils import Cache

        from kvviz.engine import attention_scores
        from kvviz.engine.channel_layers import ChannelLayer

        attention_scores.install(model)
        n_layers = Geometry.of(model.config, model.dtype).num_layers
        layers = [ChannelLayer(i, options["key_channels"], options["window"]) for i in range(n_layers)]
        return Cache(layers=keep_own_layers(model, layers))

    def predictor(self, options, geometry, capacity):
        return ChannelPredictor(geometry, pruned_channels(options, geometry.head_dim))

    def prompt_overflows(self, options, tokens) -> bool:
        return tokens > 0  # every prompt loses channels (an evaluation gives it one)

    def prompt_note(self, options, tokens):
        return (f"The prompt's keys keep {1 - options['key_channels']:.0%} of their channels per KV head, those its "
                f"last {options['window']} tokens' queries use most; every token is kept, and keys after the prompt "
                "are whole.") if tokens else None
