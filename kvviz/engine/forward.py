"""One forward of a model through a cache, whatever transformers calls the cache's keyword and whether the model
computes the logits of its last positions only; and the attention implementation it runs with, for a while."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kvviz.engine import attention_scores
from kvviz.engine.own_caches import module_states


@contextmanager
def attention_implementation(model, name: str) -> Iterator[None]:
    """Inside, `model` attends with the attention implementation `name`; the one before comes back after."""
    previous = model.config._attn_implementation
    if previous == name:
        yield
        return
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@functools.cache
def _forward_parameters(model_class) -> frozenset[str]:
    return frozenset(inspect.signature(model_class.forward).parameters)


def _cache_keyword(model) -> str:
    """The forward keyword that takes the cache: `cache` in new transformers, `past_key_values` before."""
    return "cache" if "cache" in _forward_parameters(type(model)) else "past_key_values"


def _keeps_logits(model) -> bool:
    """Whether the forward accepts `logits_to_keep` (computes logits for the last positions only)."""
    return "logits_to_keep" in _forward_parameters(type(model))


def model_forward(model, input_ids: torch.Tensor, cache, position_ids: torch.Tensor | None, logits_to_keep: int = 1,
                  forward=None, encoder_outputs=None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One forward of `model` (or of `forward`, its compiled form) through `cache` (None: no cache, the whole
    sequence fed) at `position_ids`; the logits of the last `logits_to_keep` positions (0: all). With
    `encoder_outputs` (an encoder-decoder's, of the prompt) `input_ids` are the decoder's, numbered by the cache.
    `attention_mask`: which keys each fed token attends to, ``[1, 1, fed, keys]`` over the keys the cache returns
    (None: the model's own mask, causal over them)."""
    kwargs = {"logits_to_keep": logits_to_keep} if _keeps_logits(model) else {}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    if cache is None:
        kwargs["use_cache"] = False
    else:
        kwargs.update(use_cache=True, **{_cache_keyword(model): cache})
    if encoder_outputs is not None:  # an encoder-decoder's decoder: it numbers its tokens from its cache
        kwargs.update(encoder_outputs=encoder_outputs, decoder_input_ids=input_ids)
    else:
        kwargs.update(input_ids=input_ids, **({} if cache is None else {"position_ids": position_ids}))
    with attention_scores.one_forward(), module_states(model, cache):
        logits = (forward or model)(**kwargs).logits
    return logits if _keeps_logits(model) or not logits_to_keep else logits[:, -logits_to_keep:]
