"""Teacher-forced evaluation through a strategy's cache: exact where the cache keeps everything, and
faithful bookkeeping (evictions, sizes, cancellation, failures) where it does not."""

import contextlib
import copy
import threading

import pytest
import torch
import transformers

from kvviz.engine import evaluate, evaluate_many, strategies
from kvviz.engine.models import LoadedModel, build_random_model, model_card
from kvviz.errors import OptionError
from kvviz.files import documents
from tests.engine.families import COMMON, tiny_family

TOLERANCE = 1e-3  # nats, at every position


def document_ids(loaded, n):
    ids, record, _ = evaluate.prepare(loaded, documents.builtin("alice"), [strategies.choose("dynamic")], n)
    return ids, record


def full_forward_nll(loaded, ids) -> torch.Tensor:
    """The reference: one forward over the whole sequence, NLL of every next token."""
    with torch.inference_mode():
        logits = loaded.model(input_ids=torch.tensor([ids])).logits[0, :-1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        return -logprobs.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].double()


def nll_of(loaded, name, options, ids, record, chunk=evaluate.CHUNK):
    evaluation = evaluate.Evaluation(loaded, strategies.choose(name, options), ids, record, chunk=chunk)
    records = list(evaluation)
    assert [r.position for r in records] == list(range(len(ids) - 1))
    assert [r.token_id for r in records] == ids[1:]
    return torch.tensor([r.nll for r in records], dtype=torch.float64), evaluation


@pytest.fixture(scope="module")
def alice_256(default_model):
    assert default_model.model.dtype == torch.float32
    ids, record = document_ids(default_model, 256)
    return ids, record, full_forward_nll(default_model, ids)


TOKEN_BY_TOKEN = 65  # tokens of the document read one forward per token on the default model: a quarter of it


def first(alice, n):
    """The document's first `n` tokens, its record and the reference NLL of their n - 1 predictions."""
    ids, record, reference = alice
    return ids[:n], {**record, "tokens": n}, reference[: n - 1]


def test_dynamic_token_by_token_equals_one_full_forward(default_model, alice_256):
    ids, record, reference = first(alice_256, TOKEN_BY_TOKEN)
    nll, evaluation = nll_of(default_model, "dynamic", {}, ids, record, chunk=1)
    assert evaluation.result.method == {"mode": "token-by-token", "chunk": 1}
    assert float((nll - reference).abs().max()) < TOLERANCE
    # the cache was measured after every token, and its size is the one predicted
    assert all(r.cache_bytes == r.predicted_cache_bytes == (r.position + 1) * 46080 for r in evaluation.result.records)
    assert all(r.tokens_held == r.position + 1 for r in evaluation.result.records)


def test_chunked_dynamic_equals_one_full_forward(default_model, alice_256):
    ids, record, reference = alice_256
    nll, evaluation = nll_of(default_model, "dynamic", {}, ids, record, chunk=64)
    assert evaluation.result.method == {"mode": "chunked", "chunk": 64}
    assert float((nll - reference).abs().max()) < TOLERANCE
    measured = [r for r in evaluation.result.records if r.cache_bytes is not None]
    assert [r.position for r in measured] == [63, 127, 191, 254]  # once per forward
    assert all(r.cache_bytes == r.predicted_cache_bytes for r in measured)


@pytest.mark.parametrize(
    "name,options", [("static", {}), ("sliding", {"window": 4096}), ("sink", {"sink_tokens": 4, "window": 4096})]
)
def test_strategies_that_keep_every_token_equal_dynamic(default_model, alice_256, name, options):
    ids, record, reference = first(alice_256, TOKEN_BY_TOKEN)
    nll, evaluation = nll_of(default_model, name, options, ids, record)
    assert float((nll - reference).abs().max()) < TOLERANCE
    assert evaluation.result.first_eviction is None


def test_caches_that_take_many_tokens_a_forward_read_in_chunks(tiny_model):
    ids, record = document_ids(tiny_model, 40)
    expected = {"dynamic": "chunked", "static": "chunked", "none": "chunked", "sliding": "chunked",
                "sink": "chunked", "h2o": "chunked", "quantized": "chunked", "snapkv": "chunked"}
    options = {"quantized": {"q_group_size": 32}, "h2o": {"budget": 8}, "snapkv": {"budget": 12, "window": 4}}
    for name, mode in expected.items():
        evaluation = evaluate.Evaluation(tiny_model, strategies.choose(name, options.get(name)), ids, record)
        assert evaluation.result.method["mode"] == mode, name


# Caches that change what they hold between two tokens, yet read in chunks where nothing changes in between or where
# a mask makes each token attend to what it would alone (`Strategy.feed_span`): each against itself read token by token
SPANNED = ["sliding:window=16", "sink:sink_tokens=4:window=12", "sink:sink_tokens=0:window=10",
           "quantized:backend=quanto:nbits=4:q_group_size=32:residual_length=16",
           "quantized:backend=hqq:nbits=8:residual_length=16", "quantized:backend=fp8",
           "snapkv:budget=16:window=8", "snapkv:budget=16:window=8:chunk=4:critical=true", "keydiff:budget=16",
           "lagkv:budget=16", "expected_attention:budget=16", "pyramidkv:budget=16:window=8", "random:budget=16",
           "kvzip:budget=16", "expected_attention:budget=16:adaptive=true", "snapkv:budget=16:window=8:adaptive=true"]


# Caches that change what they hold between two tokens: every attention layer steps through each chunk a token at a
# time (`stepped_reading`)
STEPPED = ["h2o:budget=16", "h2o:budget=16:recent=0:average=true", "tova:budget=16", "knorm:budget=16",
           "think:key_channels=0.5:window=8", "snapkv:budget=16:window=8:decode_interval=4",
           "tova:budget=16:chunk=4:critical=true"]


def test_every_cache_read_in_chunks_is_proven_here(tiny_model):
    """A strategy that reads in chunks without keeping every token exactly is in SPANNED or STEPPED, so that the
    test below proves it (a new one, or one whose rule changed, fails here until it is)."""
    defaults = {s.name: {o.name: o.default for o in s.options} for s in strategies.all_strategies()}
    stepped = {s.name for s in strategies.all_strategies() if s.steps(defaults[s.name])}
    spanned = {s.name for s in strategies.all_strategies()
               if not s.exact and s.name not in stepped and s.feed_span(defaults[s.name], 1, 2) > 1}
    assert stepped <= {spec.split(":")[0] for spec in STEPPED}
    assert spanned <= {spec.split(":")[0] for spec in SPANNED}


@pytest.mark.parametrize("spec", SPANNED + STEPPED)
def test_a_cache_read_in_chunks_predicts_and_holds_as_token_by_token(tiny_model, spec):
    assert_chunks_as_token_by_token(tiny_model, spec)


@pytest.mark.parametrize("family", ["qwen2", "phi3", "phi"])
@pytest.mark.parametrize("spec", ["sliding:window=16", "sink:sink_tokens=4:window=12"])
def test_windows_and_sinks_read_in_chunks_as_token_by_token_on_other_families(tiny_model, family, spec):
    """The masks, and the sinks' queries turned back, hold with other RoPE layouts, and with partial rotary
    embeddings (phi turns half of each head)."""
    if family == "phi":
        model = build_random_model(transformers.PhiConfig(**COMMON, partial_rotary_factor=0.5)).eval()
        loaded = LoadedModel(model=model, tokenizer=tiny_model.tokenizer, card=model_card(model, "phi"), spec="phi")
    else:
        loaded = tiny_family(family, tiny_model.tokenizer)
    assert_chunks_as_token_by_token(loaded, spec)


@pytest.mark.parametrize("spec", ["sliding:window=16", "sink:sink_tokens=4:window=12", "h2o:budget=16",
                                  "kvzip:budget=16", "expected_attention:budget=16:adaptive=true"])
def test_a_reading_in_chunks_resumed_continues_as_an_uninterrupted_one(tiny_model, spec):
    """A resume feeds the whole forwards measured before again, unscored, each token masked or stepped as it was
    (the mask, the sinks' turned queries, the steps, a prompt compressed and the padding of KV heads holding different
    numbers rebuild the very same cache), then goes on."""
    ids, record = document_ids(tiny_model, 100)
    choice = strategies.parse_spec(spec)
    whole = evaluate.Evaluation(tiny_model, choice, ids, record, chunk=32)
    list(whole)
    kept = copy.deepcopy(whole.result)
    kept.records = kept.records[:70]  # killed inside its third chunk
    resumed = evaluate.Evaluation(tiny_model, choice, ids, record, chunk=32)
    said = resumed.resume(kept, ended=False)
    assert resumed.replay == len(resumed.result.records) < 70 and "continues after token" in said
    list(resumed)
    assert [r.nll for r in resumed.result.records] == [r.nll for r in whole.result.records]


def assert_chunks_as_token_by_token(loaded, spec):
    ids, record = document_ids(loaded, 100)
    choice = strategies.parse_spec(spec)
    chunked = evaluate.Evaluation(loaded, choice, ids, record, chunk=48)
    single = evaluate.Evaluation(loaded, choice, ids, record, chunk=1)
    assert chunked.result.method["mode"] == "chunked" and single.result.method["mode"] == "token-by-token"
    for evaluation in (chunked, single):
        for _ in evaluation:
            pass
    nll = [torch.tensor([r.nll for r in e.result.records]) for e in (chunked, single)]
    assert float((nll[0] - nll[1]).abs().max()) < TOLERANCE
    assert chunked.result.first_eviction == single.result.first_eviction
    last = [e.result.records[-1] for e in (chunked, single)]
    assert (last[0].cache_bytes, last[0].tokens_held) == (last[1].cache_bytes, last[1].tokens_held)
    assert last[0].cache_bytes == last[0].predicted_cache_bytes


def test_none_is_scored_like_dynamic(tiny_model):
    ids, record = document_ids(tiny_model, 70)
    dynamic, _ = nll_of(tiny_model, "dynamic", {}, ids, record, chunk=32)
    none, evaluation = nll_of(tiny_model, "none", {}, ids, record, chunk=32)
    assert float((none - dynamic).abs().max()) < TOLERANCE
    assert evaluation.result.records[-1].cache_bytes == 0


@pytest.mark.parametrize(
    "name,options,held,first_eviction",
    [("sliding", {"window": 16}, 15, 16), ("sink", {"sink_tokens": 4, "window": 12}, 16, 17)],
)
def test_evicting_strategies_hold_their_budget(tiny_model, name, options, held, first_eviction):
    ids, record = document_ids(tiny_model, 60)
    nll, evaluation = nll_of(tiny_model, name, options, ids, record)
    dynamic, _ = nll_of(tiny_model, "dynamic", {}, ids, record)
    records = evaluation.result.records
    assert evaluation.result.first_eviction == first_eviction
    # before the first eviction the cache held everything: the same predictions as the full cache
    assert float((nll[:first_eviction] - dynamic[:first_eviction]).abs().max()) < TOLERANCE
    assert float((nll[first_eviction:] - dynamic[first_eviction:]).abs().max()) > TOLERANCE
    assert max(r.tokens_held for r in records if r.tokens_held is not None) == held
    assert all(r.cache_bytes == r.predicted_cache_bytes for r in records)


def test_snapkv_reads_the_first_half_as_its_prompt_and_compresses_it(tiny_model):
    """Fed one token at a time SnapKV would never compress: an evaluation gives it the document's first half as a
    prompt, in one forward (a full cache's predictions), then the rest from what it kept, to which it only appends
    (so in chunks: `Strategy.feed_span`)."""
    ids, record = document_ids(tiny_model, 60)
    options = {"budget": 12, "window": 4, "kernel": 3}
    nll, evaluation = nll_of(tiny_model, "snapkv", options, ids, record)
    dynamic, _ = nll_of(tiny_model, "dynamic", {}, ids, record)
    result = evaluation.result
    assert result.method == {"mode": "chunked", "chunk": evaluate.CHUNK, "prompt": 30}
    assert result.first_eviction == 30  # measured: after the prompt the cache held 12 of 30
    assert float((nll[:30] - dynamic[:30]).abs().max()) < TOLERANCE
    assert float((nll[30:] - dynamic[30:]).abs().max()) > TOLERANCE
    held = [r.tokens_held for r in result.records if r.tokens_held is not None]
    assert held == [12, 12 + 29]  # the prompt cut to the budget, then the other 29 tokens appended in one forward
    assert all(r.cache_bytes == r.predicted_cache_bytes for r in result.records if r.cache_bytes is not None)
    summary = result.summary()
    assert summary["before_eviction_perplexity"] is not None and summary["after_eviction_perplexity"] is not None


def test_snapkv_whose_prompt_would_fit_is_refused(tiny_model):
    ids, record = document_ids(tiny_model, 40)
    with pytest.raises(OptionError) as refused:
        evaluate.Evaluation(tiny_model, strategies.choose("snapkv", {"budget": 64, "window": 8}), ids, record)
    assert str(refused.value) == (
        "snapkv (budget=64, window=8, kernel=5, pooling=average) evicts only from a prompt longer than the 64 tokens "
        "it keeps, and an evaluation gives it the document's first half as its prompt (20 of 40 tokens), so it would "
        "never evict; evaluate at least 130 tokens, or keep fewer than 20"
    )


# The policy's state in each compressed layer of tiny (4 layers, 2 KV heads), per KV head: the int64 position of each
# key the latest step returned and, once it chose, of each kept; H2O adds a float32 sum per token held
@pytest.mark.parametrize("name,layers,score", [("tova", 4, 0), ("h2o", 4, 4), ("knorm", 2, 0)])  # knorm: 2 left whole
def test_a_policy_s_own_state_is_measured(tiny_model, name, layers, score):
    ids, record = document_ids(tiny_model, 30)
    _, evaluation = nll_of(tiny_model, name, {"budget": 12}, ids, record, chunk=1)  # measured at every token
    records = evaluation.result.records
    assert evaluation.result.first_eviction == 13  # the budget of 12 held against the 13 tokens seen
    assert records[0].policy_bytes == layers * 2 * (8 + score)  # one token, before any choice
    assert records[-1].policy_bytes == layers * 2 * ((13 + 12) * 8 + 12 * score)  # 13 returned, 12 kept
    assert evaluation.result.summary()["final_policy_bytes"] == records[-1].policy_bytes


def test_quantized_is_measured_and_predicted_at_every_token(tiny_model):
    ids, record = document_ids(tiny_model, 50)
    options = {"backend": "hqq", "nbits": 4, "q_group_size": 32, "residual_length": 8}
    _, evaluation = nll_of(tiny_model, "quantized", options, ids, record, chunk=1)
    records = evaluation.result.records
    assert all(r.cache_bytes == r.predicted_cache_bytes for r in records)
    assert records[-1].cache_bytes < (len(ids) - 1) * tiny_model.card["kv_bytes_per_token"]
    assert evaluation.result.first_eviction is None


@pytest.mark.parametrize("backend", ["hqq", "quanto"])
def test_a_quantized_cache_read_dequantizes_once_per_quantization_and_predicts_the_same(tiny_model, monkeypatch,
                                                                                       backend):
    """transformers' QuantizedLayer dequantizes all it holds at every update; reading a text, kvviz keeps that between
    two quantizations (`Strategy.reading`): the same bits, fewer dequantizations, and the decode after it runs
    transformers' own."""
    from transformers.cache_utils import QuantizedLayer

    ids, record = document_ids(tiny_model, 40)
    options = {"backend": backend, "nbits": 4, "q_group_size": 32, "residual_length": 8}
    calls = []
    for cls in {type(layer) for layer in evaluate.Evaluation(tiny_model, strategies.choose("quantized", options), ids,
                                                              record).run.cache.layers}:
        assert issubclass(cls, QuantizedLayer)
        dequantize = cls._dequantize
        monkeypatch.setattr(cls, "_dequantize", lambda self, q, dequantize=dequantize: calls.append(1) or dequantize(
            self, q))
    nll, evaluation = nll_of(tiny_model, "quantized", options, ids, record, chunk=1)  # token by token
    once = len(calls)
    strategy = evaluation.run.strategy
    monkeypatch.setattr(type(strategy), "reading", lambda self, cache: contextlib.nullcontext())
    calls.clear()
    every_time, _ = nll_of(tiny_model, "quantized", options, ids, record, chunk=1)
    assert torch.equal(nll, every_time)
    layers = len(evaluation.run.cache.layers)
    assert len(calls) == 2 * layers * (len(ids) - 2)  # keys and values, at every update but the first
    assert once == 2 * layers * 5  # after each of the 5 quantizations: the first update, then every 8 tokens
    calls.clear()
    with torch.inference_mode():
        evaluation.run.forward(torch.tensor([[ids[-1]]]))
    assert len(calls) == 2 * layers


def test_cancel_stops_between_tokens_and_keeps_what_was_measured(tiny_model):
    ids, record = document_ids(tiny_model, 80)
    cancel = threading.Event()
    evaluations = [evaluate.Evaluation(tiny_model, strategies.choose("tova", {"budget": 16}), ids, record, cancel,
                                       chunk=1) for _ in range(2)]
    for _, r in evaluate_many.evaluate_all(evaluations):
        if r.position == 9:
            evaluations[0].cancel()
    first, second = (e.result for e in evaluations)
    assert first.cancelled and len(first.records) == 10
    assert not evaluations[1].started and second.records == []


def test_a_failing_strategy_does_not_lose_the_others(tiny_model, caplog):
    ids, record = document_ids(tiny_model, 30)
    evaluations = [evaluate.Evaluation(tiny_model, strategies.choose("tova", {"budget": 8}), ids, record, chunk=1)
                   for _ in range(3)]
    forward = evaluations[1].run.forward
    calls = []

    def failing_forward(*args, **kwargs):  # stands in for a failure inside the model at the 6th token
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("out of memory")
        return forward(*args, **kwargs)

    evaluations[1].run.forward = failing_forward
    seen = [index for index, _ in evaluate_many.evaluate_all(evaluations)]
    assert seen == [0] * 29 + [1] * 5 + [2] * 29
    assert evaluations[1].result.error == "RuntimeError: out of memory"
    assert "failing_forward" in caplog.text  # its traceback, in kvviz's log
    assert len(evaluations[1].result.records) == 5
    assert evaluations[0].result.error is None and evaluations[2].result.error is None


def test_prepare_cuts_at_the_context_unless_every_strategy_streams(tiny_model):
    alice = documents.builtin("alice")
    dynamic = strategies.choose("dynamic")
    sink = strategies.choose("sink", {"window": 60})
    ids, record, notice = evaluate.prepare(tiny_model, alice, [dynamic, sink], None)
    assert len(ids) == 4096 and record["tokens"] == 4096
    assert "longer than the model's context of 4,096 tokens" in notice and record["cut"] == notice
    ids, _, notice = evaluate.prepare(tiny_model, alice, [sink], 5000)
    assert len(ids) == 5000 and notice is None  # attention sinks renumber what they keep: no context limit
    ids, _, notice = evaluate.prepare(tiny_model, alice, [dynamic], 100)
    assert len(ids) == 100 and notice is None
    ids, record, _ = evaluate.prepare(tiny_model, alice, [sink], 4100)
    evaluate.Evaluation(tiny_model, sink, ids, record)
    with pytest.raises(OptionError, match="dynamic can read at most 4,096 tokens within the model's context"):
        evaluate.Evaluation(tiny_model, dynamic, ids, record)


def test_prepare_refuses_what_has_nothing_to_predict(tiny_model, tmp_path):
    one_token = tmp_path / "one.txt"
    one_token.write_text("Hello")
    document = documents.from_file(one_token)
    with pytest.raises(OptionError, match="needs at least 2"):
        evaluate.prepare(tiny_model, document, [strategies.choose("dynamic")], None)
    with pytest.raises(OptionError, match="at least 2"):
        evaluate.prepare(tiny_model, documents.builtin("alice"), [strategies.choose("dynamic")], 1)
    short = tmp_path / "short.md"
    short.write_text("A short note of a few words.")
    ids, _, notice = evaluate.prepare(tiny_model, documents.from_file(short), [strategies.choose("dynamic")], 500)
    assert len(ids) < 500 and "fewer than the 500 asked for" in notice


def test_tokenizing_a_prefix_gives_the_whole_text_s_first_tokens(tiny_model):
    text = documents.builtin("alice").text
    whole = evaluate.encode(tiny_model.tokenizer, text)
    assert len(whole) >= 8000  # the shipped document is long enough for the long-context evaluation
    for limit in (10, 1000, 8192):
        ids, cut = evaluate.tokenize(tiny_model.tokenizer, text, limit)
        assert ids == whole[:limit] and cut
    assert evaluate.tokenize(tiny_model.tokenizer, text, None) == (whole, False)
