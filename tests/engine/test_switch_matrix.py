"""Every live switch between the strategies that run on this machine's CPU, each source run until after it has evicted
(where it evicts): either a refusal with its reason, or position ids that run on by one, measured == predicted bytes
(keys and values, and the policy's own state) at every step, and on the cache map the positions the source held.
Where a reference exists, the continuation equals it: the source's own cache, copied at the switch and left to grow
without evicting again."""

import copy
import itertools

import numpy as np
import pytest
import torch

from kvviz.engine import decode, strategies
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.eviction_layers import EvictionLayer
from kvviz.engine.forward import model_forward
from kvviz.engine.layers import SinkLayer
from kvviz.engine.scorers import Schedule
from kvviz.errors import OptionError
from kvviz.files.trace import SlotState

# Small enough that every evicting source has evicted by the switch (a prompt of 20 tokens, 4 steps more)
OPTIONS = {
    "none": {},
    "dynamic": {},
    "static": {},
    "quantized": {"backend": "fp8"},
    "hqq": {"backend": "hqq", "nbits": "4", "q_group_size": "32", "residual_length": "4"},
    "sliding": {"window": "13"},
    "sink": {"sink_tokens": "2", "window": "10"},
    "h2o": {"budget": "12"},
    "tova": {"budget": "12"},
    "snapkv": {"budget": "12", "window": "4", "kernel": "3"},
    "knorm": {"budget": "12"},  # its default skip_layers=2: layers 0 and 1 of 4 stay whole
}
EVICTING = {"sliding", "sink", "h2o", "tova", "snapkv", "knorm"}
CUT_AT_SWITCH = {"sliding", "sink"}  # targets that drop part of what they are given as they take it
LOSSLESS = {"dynamic", "static"}  # targets that keep what they get exactly and grow
PROMPT, BEFORE, AFTER = 20, 4, 6


# kvpress's presses and wrappers, switched from and to a few of the above (every pair would take minutes)
PRESSES = {
    "expected_attention": ("expected_attention", {"budget": "12"}),
    "pyramidkv": ("pyramidkv", {"budget": "12", "window": "4", "kernel": "3"}),
    "keydiff": ("keydiff", {"budget": "12", "decode_interval": "1"}),
    "lagkv": ("lagkv", {"budget": "12", "lag": "4"}),
    "kvzip": ("kvzip", {"budget": "12"}),
    "think": ("think", {}),
    "random": ("random", {"budget": "12"}),
    "adaptive": ("snapkv", {"budget": "12", "window": "4", "kernel": "3", "adaptive": "true"}),
    "chunk": ("h2o", {"budget": "12", "chunk": "4"}),
    "critical": ("knorm", {"budget": "12", "critical": "true", "skip_layers": "0", "decode_interval": "2",
                           "decode_target": "10"}),
}
EVICTING |= set(PRESSES) - {"think"}


def choice(label):
    if label in PRESSES:
        return strategies.choose(*PRESSES[label])
    name = "quantized" if label == "hqq" else label
    return strategies.choose(name, OPTIONS[label])


AVAILABLE = [label for label in OPTIONS if strategies.get(choice(label).name).available()[0]]


def expected_refusal(source, target):
    """What kvviz must say, from the facts of the pair (not from kvviz's own rule)."""
    if source == "none":
        return "a run without a cache has nothing to convert"
    if target == "none":
        return "switching to no cache would recompute every step"
    if source in EVICTING and target == "static":
        return "has already evicted tokens, and a static cache cannot hold the gaps they leave"
    if source in EVICTING and target == "sink":
        return "the attention sinks are the first tokens, and this run's cache has already evicted them"
    if target == "kvzip":
        return "kvzip scores a prompt by having the model read it again, and a switch moves only keys and values"
    if source in ("adaptive", "kvzip"):
        return "keeps a different number of tokens in each KV head"
    return None


def holdings(layer, kv_heads, seen):
    """How many KV heads hold each position 0 .. seen-1, as the cache map draws it."""
    pairs = layer.head_spans if layer.head_spans is not None else [
        [0 if state in (SlotState.EVICTED, SlotState.PREALLOCATED) else kv_heads, n] for state, n in layer.spans]
    return np.repeat([h for h, _ in pairs], [n for _, n in pairs])[:seen]


def check_step(run, kv_heads):
    """Bytes as predicted, and a cache map that covers every position seen with what each layer holds."""
    records = run.measure()
    assert sum(r.total_bytes for r in records) == run.predicted_bytes
    assert run.policy_bytes() == run.predicted_policy_bytes
    maps = []
    for record in records:
        held = holdings(record, kv_heads, run.seen)
        # KV heads that hold different numbers (adaptive, kvzip) give their mean, floored, as the tokens held
        assert len(held) == run.seen and 0 <= held.sum() - kv_heads * record.seq_len < kv_heads
        maps.append(held)
    return maps


def unbounded(cache):
    """The cache as it would go on with no more eviction."""
    for layer in cache.layers:
        if isinstance(layer, SinkLayer):
            layer.window = 10**9
        elif isinstance(layer, EvictionLayer):
            layer.schedule = Schedule(budget=10**9)  # nothing more compressed after the prompt
    return cache


def switch_and_check(loaded, source, target, ids, before_steps=BEFORE, prompt=PROMPT):
    """Feed `ids` through `source`'s cache (a prompt, then token by token), switch to `target` after `before_steps`
    steps, feed the rest; check every step (see the module docstring)."""
    model, kv_heads = loaded.model, loaded.card["num_kv_heads"]
    with torch.inference_mode():
        run = CacheRun(model, choice(source), ids.shape[-1], tokenizer=loaded.tokenizer)
        run.forward(ids[:, :prompt])
        for i in range(prompt, prompt + before_steps):
            run.forward(ids[:, i : i + 1])
        assert run.evicted == (source in EVICTING)  # measured from the cache: every evicting source has evicted
        problem = run.switch_refusal(choice(target))
        if expected_refusal(source, target):
            assert problem is not None and expected_refusal(source, target) in problem
            return
        assert problem is None
        before = check_step(run, kv_heads)
        position, reference = run.position, unbounded(copy.deepcopy(run.cache))
        run.switch(choice(target))
        after = check_step(run, kv_heads)
        for was, now in zip(before, after, strict=True):
            if target in CUT_AT_SWITCH:
                assert (now <= was).all()
            else:
                np.testing.assert_array_equal(now, was)  # the cache map shows what the source held
        # position ids: kept, or renumbered by a strategy that renumbers what it keeps
        assert run.position == (run.cache.get_seq_length() if target == "sink" else position)
        for k, i in enumerate(range(prompt + before_steps, ids.shape[-1])):
            previous = run.position
            logits = run.forward(ids[:, i : i + 1])
            assert run.position == (run.cache.get_seq_length() if target == "sink" else previous + 1)
            check_step(run, kv_heads)
            if target in LOSSLESS and source not in ("quantized", "hqq", "sliding"):
                expected = model_forward(model, ids[:, i : i + 1], reference, torch.tensor([[position + k]]))
                torch.testing.assert_close(logits, expected)


@pytest.mark.parametrize("source,target", list(itertools.product(AVAILABLE, AVAILABLE)))
def test_switch(tiny_model, source, target):
    ids = torch.randint(0, 1000, (1, PROMPT + BEFORE + AFTER), generator=torch.Generator().manual_seed(0))
    switch_and_check(tiny_model, source, target, ids)


@pytest.mark.parametrize("source,target", [*((press, "dynamic") for press in PRESSES),
                                           *(("dynamic", press) for press in PRESSES), ("h2o", "think")])
def test_switch_from_and_to_kvpress_s_presses(tiny_model, source, target):
    ids = torch.randint(0, 1000, (1, PROMPT + BEFORE + AFTER), generator=torch.Generator().manual_seed(0))
    switch_and_check(tiny_model, source, target, ids)


@pytest.mark.parametrize("source,target", [("sink", "dynamic"), ("h2o", "tova"), ("snapkv", "knorm")])
def test_switch_on_the_default_model(default_model, source, target):
    """The same checks on the default model (30 layers, 3 KV heads), on real text."""
    text = "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do."
    ids = torch.tensor([default_model.tokenizer(text * 2)["input_ids"][: PROMPT + BEFORE + AFTER]])
    switch_and_check(default_model, source, target, ids)


def switched_at_step_3(loaded, new_tokens, target):
    settings = decode.GenerationSettings(max_new_tokens=new_tokens, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(loaded, choice("sink"), settings, "the sink run goes on " * 4)
    steps = iter(decoder)
    for _ in range(3):
        next(steps)
    decoder.request_switch(choice(target))
    return decoder, steps


def test_a_switch_that_would_pass_the_context_is_refused(tiny_model):
    """A sink run numbers few positions and may outlast the model's context (tiny's: 4,096 positions); switched to a
    strategy that numbers every token, the rest of the run must fit."""
    with pytest.raises(OptionError) as refused:
        switched_at_step_3(tiny_model, 5000, "dynamic")
    assert str(refused.value) == (
        "cannot switch from 'sink' to 'dynamic': the run has numbered 12 positions and has up to 4,997 tokens left to "
        "generate, 5,009 positions with 'dynamic', more than the model's context of 4,096; switch within runs of at "
        "most 4,087 new tokens, or to a strategy that renumbers what it keeps (sink)"
    )
    decoder, steps = switched_at_step_3(tiny_model, 4087, "dynamic")  # the most that fits
    assert [next(steps).strategy for _ in range(2)] == ["dynamic", "dynamic"]
    assert decoder.run.position == 14  # on from the sink cache's 12, not from the 24 tokens seen
