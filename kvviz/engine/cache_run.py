"""One strategy's cache on a model: what is fed, at which positions, and what the cache should hold.

`CacheRun` is shared by everything that feeds a model through a cache token by token (generation in
`decode.py`, teacher-forced evaluation): it builds the strategy's cache and size predictor, numbers
fed tokens with explicit position ids (state: they advance by the tokens fed, and only a strategy that
renumbers after eviction, attention sinks, rewrites them), converts the cache to another strategy between
feeds, and measures it: its bytes, its policy's own bytes, and whether (and when) it has evicted a token,
read from the cache itself (tokens held against tokens seen). Strategy-specific behaviour comes from the
strategy object, never from its name.
"""

from __future__ import annotations

import copy
import threading
import time
from contextlib import nullcontext

import torch
from transformers.cache_utils import DynamicLayer, StaticLayer

from kvviz.engine import attention_scores, measure, stepped_reading
from kvviz.engine.attention_view import AttentionView
from kvviz.engine.convert import convert, refusal
from kvviz.engine.eviction_layers import EvictionLayer
from kvviz.engine.forward import model_forward
from kvviz.engine.geometry import Geometry
from kvviz.engine.held_positions import Carried
from kvviz.engine.machine import free_memory
from kvviz.engine.own_caches import feed_refusal, layers_of
from kvviz.engine.stopped_compiles import wait_for_stopped_compiles
from kvviz.engine.strategies import StrategyChoice, choose, get
from kvviz.errors import OptionError
from kvviz.files.trace import LayerRecord


class CacheRun:
    """A model, one strategy's live cache, and the bookkeeping around it.

    Raises `OptionError` at construction if the strategy cannot run here or with this model.
    `capacity` is the number of token slots the run needs (what a static cache preallocates).
    """

    def __init__(self, model, choice: StrategyChoice, capacity: int, tokenizer=None):
        self.model = model
        self.tokenizer = tokenizer  # the model's (a strategy that reads text of its own needs it: KVzip)
        self.geometry = Geometry.of(model.config, model.dtype)
        self.capacity = capacity
        self.position = 0  # the position id the model numbers the next fed token with
        self.seen = 0  # tokens the model has processed
        self.evicted_at: int | None = None  # tokens seen when the cache was first found holding fewer (None: never)
        self.scoring_ms: float | None = None  # of the last feed: time an evicting cache spent choosing what to keep
        self.attention: AttentionView | None = None  # of the last feed, when watching attention
        self._watch_attention = False
        self.encoder_outputs = None  # an encoder-decoder's: its encoder's reading of the prompt (`encode`)
        self.choice, self.strategy, self.cache, self.predictor = self._build(choice)
        self.carried: list[Carried | None] = [None] * self.geometry.num_layers  # what live switches put in

    def _build(self, choice: StrategyChoice):
        strategy = get(choice.name)
        ok, reason = strategy.available()
        if not ok:
            raise OptionError(f"strategy {choice.name!r} is not available here: {reason}")
        problem = strategy.unsupported(self.model, choice.options)
        if problem:
            raise OptionError(f"strategy {choice.name!r} {problem}")
        if strategy.needs_tokenizer and self.tokenizer is None:
            raise OptionError(f"strategy {choice.name!r} has the model read text of its own, and this run was given "
                              "no tokenizer to write it with")
        cache = strategy.make_cache(self.model, choice.options, self.capacity)
        return choice, strategy, cache, strategy.predictor(choice.options, self.geometry, self.capacity)

    @property
    def evicted(self) -> bool:
        """Whether the cache has dropped any token seen, as measured (`measure.tokens_dropped`)."""
        return self.evicted_at is not None

    @property
    def predicted_bytes(self) -> int:
        """Keys and values the cache should hold after the last feed (the strategy's size rule)."""
        return self.predictor.cache_bytes()

    @property
    def predicted_policy_bytes(self) -> int:
        """What the strategy's policy should keep beside keys and values after the last feed."""
        return self.predictor.policy_bytes()

    def check_memory(self) -> None:
        """Refuse a cache that cannot fit: every slot of the run in full precision (evicting caches hold less)."""
        if self.strategy.evicts:
            return
        need = self.capacity * self.geometry.kv_bytes_per_token
        free, where = free_memory(self.model.device)
        if need > free:
            raise OptionError(
                f"the cache for {self.capacity:,} tokens would need up to {need:,} bytes ({need / 2**30:.1f} GiB), "
                f"more than the {free:,} bytes ({free / 2**30:.1f} GiB) of {where}; ask for fewer tokens"
                + (" or a smaller max_cache_len" if self.strategy.preallocates else "")
            )

    def warm_up(self, notify, cancel: threading.Event | None = None) -> float | None:
        """The strategy's one-time preparation (kernel builds), before the first feed: its ms, or None if none.
        Waits first, untimed, for a compile that a Stop left running (`stopped_compiles`), or until `cancel` is set."""
        wait_for_stopped_compiles(notify, cancel)
        started = time.perf_counter()
        if self.strategy.warm_up(self.choice.options, self.model.device, notify):
            return (time.perf_counter() - started) * 1000.0
        return None

    # -- feeding -----------------------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, forward=None, logits_to_keep: int = 1,
                streamed: bool = False) -> torch.Tensor:
        """Feed `input_ids` ``[1, n]`` (the whole sequence when there is no cache); returns the logits
        of the last `logits_to_keep` positions ``[1, kept, vocab]`` (0: every position). `streamed`: each token
        attends to what it would if fed one at a time, not to all the cache returns up to it as in a prompt: through
        the strategy's mask (`Strategy.streamed`), or, for a cache that steps (`Strategy.steps`) and would change
        what it holds within the feed (`Strategy.feed_span`), stepped through a token at a time in every attention
        layer (`stepped_reading`)."""
        n = input_ids.shape[-1]
        if self.cache is not None and self.seen and n > 1 and feed_refusal(self.model):
            raise OptionError(f"cannot feed {n} tokens at once after the first {self.seen}: {feed_refusal(self.model)}")
        total = n if self.cache is None else self.seen + n
        view = None
        if self._watch_attention:
            view = AttentionView(self.cache, self.carried, self.geometry.num_layers, total)
        with attention_scores.watching(view):
            logits = self.call(input_ids, forward, logits_to_keep, streamed)
        if self.cache is not None:
            self.strategy.after_forward(self, input_ids)
        self.attention = view
        self.fed(n)
        return logits

    def prefill(self, input_ids: torch.Tensor, forward=None, logits_to_keep: int = 1) -> torch.Tensor:
        """Feed a prompt ``[1, n]`` as a prefill: in one `forward`, or where the strategy's prefill_chunk is set, a
        chunk per forward (`Strategy.prompt_forwards`), as transformers' generate(prefill_chunk_size=...) feeds it,
        each later chunk taken by the policy as more of its prompt (`Strategy.prompt_continues`: a cache that
        compresses its prompt compresses it chunk by chunk). Returns the logits of the prompt's last `logits_to_keep`
        positions ``[1, kept, vocab]`` (0: every position), however many forwards they came from."""
        sizes = [input_ids.shape[-1]] if self.cache is None else \
            self.strategy.prompt_forwards(self.choice.options, input_ids.shape[-1])
        first_kept = 0 if not logits_to_keep else max(0, input_ids.shape[-1] - logits_to_keep)
        logits, start = [], 0
        for size in sizes:
            if start:
                self.strategy.prompt_continues(self.cache)
                self.predictor.more_prompt()
            kept = start + size - max(start, first_kept)  # of this chunk's positions, those asked for (maybe none)
            out = self.forward(input_ids[:, start : start + size], forward, max(kept, 1))
            if kept > 0:
                logits.append(out)
            start += size
        return logits[0] if len(logits) == 1 else torch.cat(logits, dim=1)

    def fed(self, n: int) -> None:
        """The bookkeeping after `n` tokens went through the cache (by `forward`, or in a batch of runs): positions
        advance by the tokens fed, unless the strategy renumbers what it keeps (then they go on from there)."""
        self.scoring_ms = measure.scoring_ms(self.cache)
        if self.cache is None:  # the whole sequence is fed every time
            self.seen = self.position = n
        else:
            self.seen += n
            self.position = self.cache.get_seq_length() if self.strategy.renumbers_positions else self.position + n
        self.predictor.feed(n)
        self._note_eviction()

    def _note_eviction(self) -> None:
        if self.evicted_at is None and measure.tokens_dropped(self.cache, self.seen, self.geometry.windows) > 0:
            self.evicted_at = self.seen

    def encode(self, prompt_ids: torch.Tensor) -> None:
        """An encoder-decoder's encoder reads the prompt ``[1, n]`` once; every later forward feeds the decoder,
        which attends to this reading (its cross-attention keys and values go into the cache at the first)."""
        self.encoder_outputs = self.model.get_encoder()(input_ids=prompt_ids)
        if self.cache is not None:
            self.predictor.encoded(prompt_ids.shape[-1])

    def positions(self, n: int, device) -> torch.Tensor:
        """The position ids ``[1, n]`` of the next `n` tokens fed."""
        return torch.arange(self.position, self.position + n, device=device)[None]

    def call(self, input_ids: torch.Tensor, forward=None, logits_to_keep: int = 1,
             streamed: bool = False) -> torch.Tensor:
        """One forward through the cache (what `forward` and compile warm-ups use), with no bookkeeping but where a
        stepped one first found the cache holding fewer tokens than it was fed (`evicted_at`)."""
        n = input_ids.shape[-1]
        positions = None if self.cache is None else self.positions(n, input_ids.device)
        stepped = (streamed and n > 1 and self.cache is not None and self.strategy.steps(self.choice.options)
                   and self.strategy.feed_span(self.choice.options, self.seen, n) < n)
        if stepped:
            with stepped_reading.stepping(self.model, self.cache, self.seen, self.evicted_at is None) as steps:
                logits = model_forward(self.model, input_ids, steps, positions, logits_to_keep, forward)
            if steps.first_drop is not None:
                self.evicted_at = self.seen + steps.first_drop + 1
            return logits
        alone = self.strategy.streamed(self, n) if streamed and n > 1 and self.cache is not None else nullcontext()
        with alone as mask:
            return model_forward(self.model, input_ids, self.cache, positions, logits_to_keep, forward,
                                 self.encoder_outputs, mask)

    def watch_attention(self, on: bool) -> None:
        """Record the current token's attention per layer at each feed (`attention`), or stop (costs nothing)."""
        if on and self.geometry.encoder_decoder:
            raise OptionError("the attention view reads a decoder-only model's attention; this model is an "
                              "encoder-decoder, whose decoder also attends to the encoder's output")
        if on:
            problem = attention_scores.unsupported(self.model)
            if problem:
                raise OptionError(f"the attention view {problem}")
            attention_scores.install(self.model)
        self._watch_attention = on

    # -- switching ---------------------------------------------------------------------------------

    def switch_refusal(self, choice: StrategyChoice) -> str | None:
        """Why this cache cannot become `choice` now, or None (the model's context is `positions_after`'s to check)."""
        return refusal(self.choice, choice, self.model, self.evicted)

    def positions_after(self, choice: StrategyChoice, tokens: int) -> int:
        """The positions a run switched to `choice` now numbers its tokens with, once `tokens` more are fed."""
        return get(choice.name).positions_needed(choice.options, self.position + tokens)

    def switch(self, choice: StrategyChoice) -> None:
        """Convert the live cache to `choice` (checked with `switch_refusal` first); evicted tokens stay gone, and
        what is kept keeps its positions (the tokens it belongs to, and the position ids the model numbered them
        with: the next token goes on from there, unless the new strategy renumbers)."""
        new_choice, strategy, cache, predictor = self._build(choice)
        moved, self.carried = convert(self.cache, cache, self.carried, self.position, self.seen)
        predictor.receive(moved)
        self.choice, self.strategy, self.cache, self.predictor = new_choice, strategy, cache, predictor
        if strategy.renumbers_positions:
            self.position = cache.get_seq_length()
        self._note_eviction()

    def stop_evicting(self) -> None:
        """The policy evicts no more: the cache becomes a plain dynamic cache of what it kept, at the positions it kept
        them (a live switch). A cache whose KV heads hold different numbers of tokens (AdaKV, KVzip), which no dynamic
        cache can hold, keeps its own layers instead, and they only append from now on (`EvictionLayer.stop`)."""
        dynamic = choose("dynamic")
        refused = self.switch_refusal(dynamic)
        stoppable = [layer for layer in layers_of(self.cache) if isinstance(layer, EvictionLayer)]
        if refused is None or not stoppable:  # a cache without eviction layers is switched, as it always was
            self.switch(dynamic)
            return
        for layer in stoppable:
            layer.stop()

    # -- going back and copying (conversations) -----------------------------------------------------

    def crop_refusal(self) -> str | None:
        """Why this cache cannot be cropped back to an earlier token, or None. transformers' full-attention layers
        crop (DynamicLayer, StaticLayer); a cache that has evicted, quantized, slid or been filled by a switch no
        longer holds its earlier state as it was, so it has to be prefilled again instead."""
        if self.cache is None:
            return None
        if self.evicted:
            return "it has evicted tokens"
        if any(c is not None for c in self.carried):
            return "a live switch filled it"
        kinds = {type(layer) for layer in layers_of(self.cache)}  # a state kept beside the layers too (MiniMax)
        if not kinds <= {DynamicLayer, StaticLayer}:
            return f"its layers ({', '.join(sorted(k.__name__ for k in kinds))}) cannot be cropped"
        return None

    def crop(self, keep: int) -> None:
        """Keep only the first `keep` tokens fed (checked with `crop_refusal` first): the cache, positions and size
        rule go back to where they were after them."""
        if self.cache is not None and keep < self.seen:
            self.cache.crop(keep - self.seen)
        self.seen = self.position = keep
        self.predictor = self.strategy.predictor(self.choice.options, self.geometry, self.capacity)
        if keep:
            self.predictor.feed(keep)

    def copy(self) -> CacheRun:
        """A run of its own on a deep copy of this cache (prefix caching, as transformers' docs do it): the copy's
        memory is as large again as the original's."""
        twin = copy.copy(self)
        twin.cache, twin.predictor, twin.carried = copy.deepcopy((self.cache, self.predictor, self.carried))
        twin.attention = None
        return twin

    # -- measuring ---------------------------------------------------------------------------------

    def measure(self, slots: bool = True) -> list[LayerRecord]:
        """The cache as really allocated, one record per layer (empty records when there is no cache); `slots`
        False leaves out which positions an evicting layer holds (only sizes are wanted)."""
        records = measure.measure_cache(self.cache, self.seen, slots, self.carried)
        return records or [LayerRecord(0, 0, 0, 0) for _ in range(self.geometry.num_layers)]

    def held(self, positions: list[int]) -> list[list[int] | None]:
        """Per layer, per KV head: how many of these token positions (0 .. seen-1) the cache still holds, after any
        eviction and live switch (`measure.positions_held`)."""
        return measure.positions_held(self.cache, self.seen, positions, self.geometry.kv_heads, self.carried)

    def policy_bytes(self) -> int:
        """What the cache's policy keeps beside keys and values, as allocated (its state)."""
        return measure.policy_bytes(self.cache)
