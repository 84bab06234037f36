"""Asking configurations questions on the tiny model: a shared prefill fills each cache as its own would, each
regime feeds what it says, the exact cache answers as plain `generate` does, answers written together are those
written alone, and the needle held is counted from what each cache holds."""

import pytest
import torch

from kvviz.engine import tasks
from kvviz.engine.answering import Asking, regime_names
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.qa_prompt import Rendering
from kvviz.engine.shared_prefill import prefill_together, unshared
from kvviz.engine.strategies import choose, parse_spec
from kvviz.errors import OptionError
from kvviz.files.qa import REGIMES
from kvviz.files.scoring import clean

FAMILIES = ["dynamic", "h2o:budget=30", "tova:budget=30", "snapkv:budget=40:window=8", "sink:sink_tokens=4:window=26",
            "sliding:window=31", "knorm:budget=30", "quantized:backend=hqq:nbits=4:residual_length=8"]


@pytest.fixture(scope="module")
def items(tiny_model):
    rendering = Rendering(tiny_model.tokenizer, raw=True)
    return tasks.generate(["niah_single_1"], 2, 300, seed=5, turns=2, tokens=rendering.tokens)


def held(layer) -> torch.Tensor:
    """What a cache layer holds, whatever its kind, in full precision."""
    from kvviz.engine.convert import held_states

    return torch.cat(held_states(layer), dim=-1)


def test_a_shared_prefill_fills_each_cache_as_its_own_prefill_would(tiny_model):
    model = tiny_model.model
    ids = torch.randint(0, 1000, (1, 90), generator=torch.Generator().manual_seed(0))
    families = [*FAMILIES, "kvzip:budget=30"]  # KVzip reads the prompt again after the prefill, shared or not
    shared = [CacheRun(model, parse_spec(spec), 200, tiny_model.tokenizer) for spec in families]
    alone = [CacheRun(model, parse_spec(spec), 200, tiny_model.tokenizer) for spec in families]
    assert all(unshared(run) is None for run in shared)
    with torch.inference_mode():
        logits, failures = prefill_together(shared, ids)
        assert not failures
        for mine, theirs in zip(shared, alone, strict=True):
            assert torch.equal(theirs.forward(ids)[0, -1], logits)  # one forward, the same logits
            assert (mine.seen, mine.position) == (theirs.seen, theirs.position)
            for a, b in zip(mine.cache.layers, theirs.cache.layers, strict=True):
                assert torch.equal(held(a), held(b)), mine.choice.label()  # and each cache keeps what it would
            assert mine.held(list(range(90))) == theirs.held(list(range(90)))


def test_the_exact_cache_answers_as_plain_generate(tiny_model, items):
    item = items[0]
    asking = Asking(tiny_model, [choose("dynamic")], [item], list(REGIMES), raw=True)
    list(asking)
    rendering = asking.rendering
    for turn in range(2):
        ids = rendering.context(item) + rendering.question(item, turn)
        with torch.inference_mode():
            out = tiny_model.model.generate(torch.tensor([ids]), do_sample=False,
                                            max_new_tokens=item.turns[turn].max_new_tokens)
        expected = clean(tiny_model.tokenizer.decode(out[0, len(ids):], skip_special_tokens=True))
        for regime in ("query-agnostic", "query-aware", "decode-time"):
            (said,) = [a for a in asking.answers[0] if a.regime == regime and a.turn == turn]
            assert said.answer == expected and said.error is None, regime
        if turn == 0:  # the first question of a conversation is read as any other
            (said,) = [a for a in asking.answers[0] if a.regime == "multi-turn" and a.turn == 0]
            assert said.answer == expected


def test_each_regime_feeds_what_it_says(tiny_model, items):
    item = items[0]
    budget = 48
    seen = {}

    def look(regime, index, turn, runs):
        run = runs[0]
        layers = run.measure(slots=False)
        seen[regime, turn] = (run.strategy.name, run.seen, run.position, [layer.seq_len for layer in layers],
                              run.evicted_at, run.held(list(range(run.seen - question[turn], run.seen))))

    asking = Asking(tiny_model, [choose("h2o", {"budget": budget})], [item], list(REGIMES), raw=True)
    asking.on_answering = look
    rendering = asking.rendering
    context = len(rendering.context(item))
    question = [len(rendering.question(item, t)) for t in range(2)]
    list(asking)
    heads = tiny_model.model.config.num_key_value_heads
    for turn in range(2):
        # query-agnostic: the context compressed, then the policy stops; the question is fed whole after it, at the
        # positions that follow, and every token of it is held by every layer-head
        name, fed, position, layers, evicted, question_held = seen["query-agnostic", turn]
        assert name == "dynamic" and fed == position == context + question[turn]
        assert layers == [budget + question[turn]] * len(layers)
        assert question_held == [[question[turn]] * heads] * len(layers)
        assert evicted == context  # dropped once, at the context's prefill
        # query-aware: context and question compressed together, then the policy stops
        name, fed, position, layers, evicted, _ = seen["query-aware", turn]
        assert name == "dynamic" and fed == context + question[turn] and layers == [budget] * len(layers)
        # decode-time: read one token at a time, the policy evicting as it reads, and acting still
        name, fed, position, layers, evicted, _ = seen["decode-time", turn]
        assert name == "h2o" and fed == context + question[turn] and layers == [budget] * len(layers)
        assert evicted == budget + 1  # the first token past the budget
    # multi-turn: one cache, the policy acting all along; the second question follows the first answer, kept
    _, first, *_ = seen["multi-turn", 0]
    name, second, _, layers, _, _ = seen["multi-turn", 1]
    answer = next(a for a in asking.answers[0] if a.regime == "multi-turn" and a.turn == 0)
    assert name == "h2o" and layers == [budget] * len(layers)
    assert first == context + question[0]
    assert second == first + answer.answer_tokens + len(rendering.question(item, 1, follows_answer=True))


@pytest.mark.parametrize(("regime", "specs"), [
    ("query-agnostic", ["h2o:budget=40", "sink:sink_tokens=4:window=36", "quantized:backend=hqq:nbits=4"]),
    ("decode-time", ["h2o:budget=40", "tova:budget=40"]),
])
def test_answers_written_together_are_those_written_alone(tiny_model, regime, specs):
    rendering = Rendering(tiny_model.tokenizer, raw=True)
    (item,) = tasks.generate(["niah_single_1"], 1, 160, seed=2, turns=1, tokens=rendering.tokens)
    choices = [parse_spec(spec) for spec in specs]
    together = Asking(tiny_model, choices, [item], [regime], raw=True)
    list(together)
    for i, choice in enumerate(choices):
        alone = Asking(tiny_model, [choice], [item], [regime], raw=True)
        list(alone)
        assert [a.answer for a in alone.answers[0]] == [a.answer for a in together.answers[i]], choice.label()


def test_the_needle_held_is_counted_from_what_each_cache_holds(tiny_model, items):
    rendering = Rendering(tiny_model.tokenizer, raw=True)
    item = next(i for i in items if rendering.placed(i).needles[0].tokens[1] < len(rendering.context(i)) - 40)
    window = 16
    asking = Asking(tiny_model, [choose("dynamic"), choose("sliding", {"window": window})], [item],
                    ["query-agnostic"], raw=True)
    list(asking)
    layer_heads = tiny_model.model.config.num_hidden_layers * tiny_model.model.config.num_key_value_heads
    needle_turn = asking.items[0].needles[0].turn
    exact = next(a for a in asking.answers[0] if a.turn == needle_turn)
    slid = next(a for a in asking.answers[1] if a.turn == needle_turn)
    assert exact.needle_held == exact.layer_heads == layer_heads
    assert slid.needle_held == 0 and slid.layer_heads == layer_heads  # the window slid past it
    assert slid.tokens_held == window - 1


def test_a_configuration_that_cannot_answer_says_why_and_the_others_go_on(tiny_model, items):
    asking = Asking(tiny_model, [choose("dynamic"), choose("offloaded")], items[:1], ["query-aware"], raw=True)
    list(asking)
    refused = asking.answers[1]
    assert len(refused) == 2 and all(a.score is None and "CUDA" in a.error for a in refused)
    assert all(a.error is None and a.score is not None for a in asking.answers[0])


def test_regimes_are_named_and_checked():
    assert regime_names("multi-turn, query-agnostic") == ["multi-turn", "query-agnostic"]
    with pytest.raises(OptionError, match="no regime named 'online'; the regimes: query-agnostic"):
        regime_names("online")


def test_a_cache_that_cannot_be_copied_reads_the_context_again(tiny_model, items):
    quanto = parse_spec("quantized:backend=quanto:nbits=4:residual_length=8")
    asking = Asking(tiny_model, [quanto, choose("dynamic")], items[:1], ["query-agnostic", "decode-time"], raw=True)
    list(asking)  # two questions of one context: the first on a copy, which optimum-quanto's tensors refuse
    assert len(asking.answers[0]) == 4 and all(a.error is None and a.score is not None for a in asking.answers[0])


UNEVEN = ["knorm:budget=30:skip_layers=1", "pyramidkv:budget=60:window=16", "snapkv:budget=40:window=8:adaptive=true",
          "kvzip:budget=30"]  # layers of different lengths; KV heads of different lengths (AdaKV, KVzip)


@pytest.mark.parametrize("spec", UNEVEN)
def test_a_stopped_cache_of_uneven_layers_reads_tokens_at_once_as_one_at_a_time(tiny_model, spec):
    ids = torch.randint(0, 1000, (1, 96), generator=torch.Generator().manual_seed(1))
    run = CacheRun(tiny_model.model, parse_spec(spec), 200, tiny_model.tokenizer)
    with torch.inference_mode():
        run.forward(ids[:, :90])
        assert run.evicted
        run.stop_evicting()
        kept = run.held(list(range(90)))  # per layer, per KV head
        twin = run.copy()
        at_once = run.forward(ids[:, 90:])[0, -1]  # the mask of the first layer, fitted to each layer
        for position in range(90, 96):
            one_at_a_time = twin.forward(ids[:, position : position + 1])[0, -1]
    assert torch.allclose(at_once, one_at_a_time, atol=1e-4), (at_once - one_at_a_time).abs().max()
    assert run.held(list(range(90))) == kept and kept != twin.held(list(range(90, 96)))  # evicted no more
    assert run.held(list(range(90, 96))) == [[6] * len(heads) for heads in kept], spec  # and held the six fed


def test_every_kind_of_cache_answers_in_every_regime(tiny_model):
    rendering = Rendering(tiny_model.tokenizer, raw=True)
    item = tasks.generate(["niah_single_1"], 1, 200, seed=5, turns=1, tokens=rendering.tokens)
    choices = [parse_spec(spec) for spec in [*UNEVEN, "h2o:budget=40:adaptive=true:critical=true"]]
    asking = Asking(tiny_model, choices, item, list(REGIMES), raw=True)
    evicted = set()  # (regime, configuration) whose cache had evicted when a question came
    asking.on_answering = lambda regime, item, turn, runs: evicted.update((regime, i) for i, run in runs.items()
                                                                          if run.evicted)
    list(asking)
    for i, (choice, answers) in enumerate(zip(choices, asking.answers, strict=True)):
        assert len(answers) == len(REGIMES), choice.label()
        assert all(a.error is None and a.score is not None for a in answers), [a.error for a in answers]
        assert all((regime, i) in evicted for regime in REGIMES), choice.label()


def test_a_configuration_that_reads_its_prompt_in_chunks_prefills_its_context_alone_a_chunk_at_a_time(tiny_model,
                                                                                                      items):
    """prefill_chunk: the context is read a chunk per forward (no shared prefill), each chunk compressed, so the cache
    holds its budget after the context, as the same prefill by hand leaves it."""
    item = items[0]
    chunked = choose("snapkv", {"budget": 40, "window": 8, "prefill_chunk": 64})
    run = CacheRun(tiny_model.model, chunked, 400, tiny_model.tokenizer)
    assert "prefill_chunk" in unshared(run)
    seen = {}

    def look(regime, index, turn, runs):
        seen[turn] = [layer.seq_len for layer in runs[0].measure(slots=False)]

    asking = Asking(tiny_model, [choose("dynamic"), chunked], [item], ["query-agnostic"], raw=True)
    asking.on_answering = lambda regime, index, turn, runs: look(regime, index, turn, {0: runs[1]})
    list(asking)
    question = [len(asking.rendering.question(item, t)) for t in range(2)]
    assert all(seen[turn] == [40 + question[turn]] * len(seen[turn]) for turn in range(2))
    assert all(a.error is None for a in asking.answers[1])
