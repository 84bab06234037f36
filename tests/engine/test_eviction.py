"""Importance-based eviction (h2o, tova, snapkv, knorm): budgets held, bytes exact, models refused with the reason."""

import gc
import itertools
import weakref

import pytest
import torch

from kvviz.engine import decode, strategies
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.strategies import OptionError, parse_list
from kvviz.files.trace import SlotState

from .families import CONFIGS, tiny_family

PROMPT = " ".join(["The cache grows by one token at every step of decoding."] * 6)  # 72 tokens, raw
POLICIES = {
    "h2o": {"budget": 32, "recent": 8},
    "tova": {"budget": 32},
    "snapkv": {"budget": 32, "window": 8},
    "knorm": {"budget": 32, "skip_layers": 0},  # every layer compressed (its own default leaves two whole: below)
}


def run(loaded, name, options, new_tokens=24):
    settings = decode.GenerationSettings(max_new_tokens=new_tokens, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(loaded, strategies.choose(name, options), settings, PROMPT)
    return list(decoder), decoder


def expected_held(name, budget, prompt_tokens, index):
    """Tokens each layer holds after step `index` (the prefill is step 0)."""
    seen = prompt_tokens + index
    if name == "snapkv":  # the prompt is cut to the budget once; decoded tokens are appended
        return min(prompt_tokens, budget) + index
    return min(seen, budget)


def check_layer(layer, seen, kv_heads):
    """The cache map of one layer: every position seen is accounted for, per head shares add up."""
    assert sum(n for _, n in layer.spans) == seen
    full = sum(n for state, n in layer.spans if state == SlotState.FULL)
    if layer.head_spans is None:
        assert full == layer.seq_len
        return
    assert sum(n for _, n in layer.head_spans) == seen
    assert all(0 <= heads <= kv_heads for heads, _ in layer.head_spans)
    # every KV head holds seq_len positions
    assert sum(heads * n for heads, n in layer.head_spans) == kv_heads * layer.seq_len
    assert full == sum(n for heads, n in layer.head_spans if heads > 0)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_budget_held_and_bytes_exact_on_default_model(default_model, name):
    options = POLICIES[name]
    steps, decoder = run(default_model, name, options)
    kv_heads = default_model.card["num_kv_heads"]
    for step in steps:
        assert step.cache_bytes == step.predicted_cache_bytes, (name, step.index)
        held = expected_held(name, options["budget"], decoder.prompt_tokens, step.index)
        for layer in step.layers:
            assert layer.seq_len == held, (name, step.index)
            check_layer(layer, decoder.prompt_tokens + step.index, kv_heads)
    assert all(step.scoring_ms is not None and step.scoring_ms >= 0 for step in steps)
    # importance, not position: evicted positions are scattered, not one block before a window
    assert len(steps[-1].layers[0].spans) > 2


def test_per_head_policies_keep_different_positions_per_head(default_model):
    steps, _ = run(default_model, "h2o", POLICIES["h2o"], new_tokens=4)
    shares = {heads for layer in steps[-1].layers for heads, _ in layer.head_spans}
    assert shares - {0, default_model.card["num_kv_heads"]}  # some positions held by only some heads
    tova, _ = run(default_model, "tova", POLICIES["tova"], new_tokens=2)
    assert all(layer.head_spans is None for layer in tova[-1].layers)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_families_exact_or_refused_with_reason(tiny_model, family):
    loaded = tiny_family(family, tiny_model.tokenizer)
    hybrid = any(t != "full_attention" for t in loaded.card["layer_types"])
    for name in sorted(POLICIES):
        options = {**POLICIES[name], "budget": 12}
        if name == "snapkv":
            options["window"] = 4
        if hybrid:
            with pytest.raises(OptionError, match=f"'{name}' works only with models whose layers all use full"):
                run(loaded, name, options)
            continue
        steps, decoder = run(loaded, name, options, new_tokens=16)
        assert [s.cache_bytes for s in steps] == [s.predicted_cache_bytes for s in steps], (family, name)
        for step in steps:
            held = expected_held(name, 12, decoder.prompt_tokens, step.index)
            assert all(layer.seq_len == held for layer in step.layers), (family, name, step.index)


def test_a_budget_never_reached_changes_nothing(tiny_model):
    """With room for every token the policies keep everything: logits equal a DynamicCache's, fed one token at a
    time or in chunks (positions and causal masks are right)."""
    ids = torch.tensor([tiny_model.tokenizer(PROMPT)["input_ids"][:40]])
    feeds = [ids[:, :10], *ids[:, 10:20].split(1, dim=-1), *ids[:, 20:].split(5, dim=-1)]
    with torch.inference_mode():
        reference = CacheRun(tiny_model.model, strategies.choose("dynamic"), 40)
        expected = [reference.forward(feed) for feed in feeds]
        for name in POLICIES:
            cache_run = CacheRun(tiny_model.model, strategies.choose(name, {**POLICIES[name], "budget": 64}), 40)
            for feed, logits in zip(feeds, expected, strict=True):
                torch.testing.assert_close(cache_run.forward(feed), logits, msg=name)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_teacher_forced_feeding_keeps_the_budget(tiny_model, name):
    """Fed one token at a time from the start, as a perplexity evaluation does, with no generation loop."""
    ids = torch.tensor([tiny_model.tokenizer(PROMPT)["input_ids"][:30]])
    options = {**POLICIES[name], "budget": 12, **({"window": 4} if name == "snapkv" else {})}
    with torch.inference_mode():
        cache_run = CacheRun(tiny_model.model, strategies.choose(name, options), 30)
        for i in range(30):
            cache_run.forward(ids[:, i : i + 1])
            records = cache_run.measure()
            assert sum(r.total_bytes for r in records) == cache_run.predicted_bytes
            # snapkv compresses only a prompt: a first feed of one token never needs it
            assert records[0].seq_len == (i + 1 if name == "snapkv" else min(i + 1, 12))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_switch_from_dynamic_evicts_to_the_budget_and_back_keeps_it(default_model, name):
    options = {**POLICIES[name], "budget": 16, **({"window": 4} if name == "snapkv" else {})}
    settings = decode.GenerationSettings(max_new_tokens=16, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(default_model, strategies.choose("dynamic"), settings, PROMPT)
    steps = []
    for step in decoder:
        steps.append(step)
        if step.index == 5:
            decoder.request_switch(strategies.choose(name, options))
        if step.index == 10:
            decoder.request_switch(strategies.choose("dynamic"))
    assert [s.strategy for s in steps[5:8]] == ["dynamic", name, name]
    assert all(s.cache_bytes == s.predicted_cache_bytes for s in steps)
    held = [s.layers[0].seq_len for s in steps]
    assert held[5] == decoder.prompt_tokens + 5
    # what it was given is its prompt, compressed with the step's own token to the budget
    assert held[6] == 16
    assert held[11] == held[10] + 1  # back on dynamic: what was kept stays, and grows
    for step in steps:
        assert sum(n for _, n in step.layers[0].spans) == step.position


def test_switching_away_refused_where_evicted_tokens_matter(default_model):
    settings = decode.GenerationSettings(max_new_tokens=4, raw=True, stop_at_eos=False)
    decoder = decode.Decoder(default_model, strategies.choose("tova", {"budget": 16}), settings, PROMPT)
    steps = iter(decoder)
    next(steps)
    with pytest.raises(OptionError, match="'tova' has already evicted tokens, and a static cache cannot"):
        decoder.request_switch(strategies.choose("static"))
    with pytest.raises(OptionError, match="attention sinks are the first tokens"):
        decoder.request_switch(strategies.choose("sink"))


@pytest.mark.parametrize(
    "name,options,message",
    [
        ("h2o", {"budget": "8", "recent": "8"}, "option 'recent' of strategy 'h2o' (8) must be smaller than 'budget'"),
        ("h2o", {"budget": "1"}, "option 'budget' of strategy 'h2o' must be an integer >= 2"),
        ("tova", {"budget": "0"}, "option 'budget' of strategy 'tova' must be an integer >= 1"),
        ("snapkv", {"budget": "16", "window": "16"}, "option 'window' of strategy 'snapkv' (16) must be smaller"),
        ("snapkv", {"kernel": "4"}, "option 'kernel' of strategy 'snapkv' must be an odd number, not 4"),
        ("knorm", {"window": "4"}, "strategy 'knorm' has no option 'window'; its options: adaptive, budget"),
    ],
)
def test_bad_options_rejected(name, options, message):
    with pytest.raises(OptionError) as info:
        strategies.choose(name, options)
    assert message in str(info.value)


def test_listed_with_descriptions_and_accepted_by_compare():
    for name in POLICIES:
        listing = strategies.get(name).to_dict()
        assert listing["available"] and listing["description"]
    assert strategies.choose("h2o").options.items() >= {"budget": 256, "recent": -1, "average": False}.items()
    assert strategies.choose("snapkv").options.items() >= {"budget": 256, "window": 32, "kernel": 5,
                                                           "pooling": "average"}.items()
    assert strategies.choose("knorm").options.items() >= {"budget": 256, "skip_layers": 2}.items()
    choices = parse_list(["h2o:budget=64:recent=16", "tova:budget=64", "snapkv:budget=64", "knorm"])
    assert [c.name for c in choices] == ["h2o", "tova", "snapkv", "knorm"]
    assert choices[0].options.items() >= {"budget": 64, "recent": 16}.items()


def test_keep_selects_per_batch_row_and_head():
    """Rows of a batch keep their own tokens, whether the policy chose per KV head or once per layer."""
    layer = strategies.get("knorm").make_layer(0, strategies.choose("knorm", {"budget": 3}).options)
    keys, values = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    layer.update(keys, values)  # over budget: the three lowest-norm keys of each row and head stay
    for b, h in itertools.product(range(2), range(2)):
        expected = sorted(keys[b, h].norm(dim=-1).topk(3, largest=False).indices.tolist())
        assert layer.positions[b, h].tolist() == expected
        torch.testing.assert_close(layer.values[b, h], values[b, h, expected])
    before = layer.positions.clone()
    layer.keep(torch.tensor([[[0, 2]], [[1, 2]]]))  # one index row per batch row: the same slots in every head
    assert layer.positions.tolist() == [[row[[0, 2]].tolist() for row in before[0]],
                                        [row[[1, 2]].tolist() for row in before[1]]]


def test_an_unanswered_attention_request_ends_with_its_forward(tiny_model):
    """A request lives for one forward: it keeps no keys alive after it, and the policy says attention never came."""
    model = tiny_model.model
    cache_run = CacheRun(model, strategies.choose("h2o", {"budget": 8}), 32)
    ids = torch.tensor([tiny_model.tokenizer(PROMPT)["input_ids"][:12]])
    try:
        with torch.inference_mode():
            cache_run.forward(ids[:, :4])
            model.set_attn_implementation("sdpa")  # attention no longer goes through kvviz: nobody answers
            cache_run.forward(ids[:, 4:5])
            asked_about = weakref.ref(cache_run.cache.layers[0].keys)  # what the unanswered request named
            with pytest.raises(RuntimeError, match="an attention-scored cache got no attention scores"):
                cache_run.forward(ids[:, 5:6])  # the layer replaces its keys, then finds its request unanswered
        gc.collect()
        assert asked_about() is None  # no request outlived its forward to keep them
    finally:
        model.set_attn_implementation("kvviz_sdpa")
