"""Many requests through transformers' continuous batching (kvviz.engine.serve), on the default model: every answer is
greedy `generate`'s of its prompt alone, preempted or not; the pool's bytes are exact; a shared prefix is reused."""

from types import SimpleNamespace

import pytest
import torch

from kvviz.engine import paged_pool
from kvviz.engine.decode import encode_prompt
from kvviz.engine.serve import encoded, serve
from kvviz.errors import OptionError
from kvviz.files.serve_trace import ServeSettings

QUESTIONS = ["What is the capital of France?", "Name three colours.", "Count to five.", "Say hello in Spanish."]
NEW_TOKENS = 16
# a prefix of several blocks, which requests after the first find in the pool
PREFIX = ("You answer questions about a small library. It opens at nine and closes at five, lends up to six books for "
          "three weeks, charges nothing for late returns, keeps a reading room on the first floor, holds story hours "
          "for children on Saturdays, and asks for quiet in every room but the hall.")


def prompts_of(loaded, texts):
    return [(text, encode_prompt(loaded.tokenizer, text, raw=False)) for text in texts]


def alone(loaded, ids):
    """Greedy `generate` of one prompt alone, as a user's code would call it."""
    with torch.inference_mode():
        out = loaded.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def preempted(default_model):
    """Four requests at once through a pool of 6 blocks of 16 tokens: too small for all of them, so some are
    preempted and served again."""
    prompts = prompts_of(default_model, QUESTIONS)
    settings = ServeSettings(max_new_tokens=NEW_TOKENS, page_size=16, blocks=6, max_batch_tokens=64)
    attention = default_model.model.config._attn_implementation  # sdpa, or kvviz's own left by an earlier test
    run = serve(default_model, prompts, settings)
    assert default_model.model.config._attn_implementation == attention  # the manager's switch undone
    return prompts, run


def test_every_answer_is_generate_s_alone_though_the_pool_preempts(default_model, preempted):
    prompts, run = preempted
    assert run.preemptions > 0
    assert all(r.finished for r in run.requests)
    for (_, ids), request in zip(prompts, run.requests, strict=True):
        assert request.tokens == alone(default_model, ids), request.id
        assert len(request.token_times) == len(request.tokens)  # a token time each, across its preemptions
        assert request.ttft_ms > 0 and (request.tpot_ms is None or request.tpot_ms > 0)


def test_the_pool_s_bytes_are_exact(default_model, preempted):
    _, run = preempted
    config = default_model.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_block = 16 * config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 4  # float32
    assert [g.bytes_per_block for g in run.groups] == [per_block]
    assert run.pool_bytes == (run.blocks + 2) * per_block  # transformers keeps two sectors for padding
    assert 0 < run.peak_blocks <= run.blocks
    assert run.peak_bytes == run.peak_blocks * per_block
    assert max(r.peak_blocks for r in run.requests) <= run.peak_blocks


def test_a_shared_prefix_is_reused_and_lowers_the_peak(default_model):
    """Prefills split over steps of 32 tokens: the first request's prefix is complete in the pool before the next is
    scheduled, whatever the machine's speed."""
    prompts = prompts_of(default_model, [PREFIX + "\n\n" + q for q in QUESTIONS[:3]])
    runs = {sharing: serve(default_model, prompts,
                           ServeSettings(max_new_tokens=4, page_size=16, blocks=64, max_batch_tokens=32,
                                         prefix_sharing=sharing))
            for sharing in (True, False)}
    assert runs[True].reused_blocks > 0 and runs[False].reused_blocks == 0
    assert runs[True].peak_blocks < runs[False].peak_blocks
    assert [r.tokens for r in runs[True].requests] == [r.tokens for r in runs[False].requests]


def test_arrivals_are_poisson_spaced_at_the_rate():
    times = ServeSettings(rate=4.0, seed=1).arrivals(400)
    assert times[0] == 0 and times == sorted(times)
    assert 80 < times[-1] < 120  # 399 gaps of 1/4 s on average
    assert ServeSettings().arrivals(3) == [0.0, 0.0, 0.0]


def test_a_request_longer_than_the_pool_is_refused_before_it_runs(default_model):
    prompts = prompts_of(default_model, QUESTIONS[:1])
    with pytest.raises(OptionError, match=r"needs \d+ blocks of 16 tokens, and the pool has 2"):
        serve(default_model, prompts,
              ServeSettings(max_new_tokens=NEW_TOKENS, page_size=16, blocks=2))


def test_a_transformers_without_what_kvviz_reads_is_refused_by_version():
    manager = SimpleNamespace(batch_processor=None)
    with pytest.raises(OptionError, match=rf"as transformers {paged_pool.TESTED} lays it out.*lacks manager\.warmup"):
        paged_pool.probe(manager)


def test_each_request_s_phases_follow_its_steps(preempted):
    from kvviz.files.serve_trace import phases

    _, run = preempted
    spans = phases(run)
    for request in run.requests:
        mine = spans[request.id]
        assert all(start < end for _, start, end in mine)
        assert all(a[2] <= b[1] for a, b in zip(mine, mine[1:], strict=False))  # in order, never overlapping
        assert mine[-1][2] == request.token_times[-1]  # none after its last token
        assert "decode" in [phase for phase, _, _ in mine] or len(request.tokens) == 1
        assert ("preempted" in [phase for phase, _, _ in mine]) == (request.preemptions > 0 and any(
            request.id in step.waiting and step.started >= request.preempted_at[0] for step in run.steps))


def test_kvviz_s_own_attention_gives_way_to_sdpa_for_the_run_and_comes_back(default_model):
    """A cache that scores attention leaves kvviz_sdpa on the model, which continuous batching refuses."""
    from kvviz.engine import attention_scores

    model = default_model.model
    attention_scores.install(model)
    try:
        run = serve(default_model, prompts_of(default_model, QUESTIONS[:1]),
                    ServeSettings(max_new_tokens=2, page_size=16, blocks=8))
        assert run.requests[0].finished
        assert model.config._attn_implementation == attention_scores.NAME
    finally:
        model.set_attn_implementation("sdpa")


@pytest.fixture(scope="module")
def tokenizer():
    from kvviz.engine.model_cache import default_tokenizer

    return default_tokenizer()


def test_sliding_layers_are_counted_per_group(tokenizer):
    """Gemma 2 alternates sliding and full attention: a group of blocks each, its blocks holding its layers alone."""
    from tests.engine.families import tiny_family

    loaded = tiny_family("gemma2", tokenizer)
    loaded.model.generation_config.eos_token_id = None  # random weights: every answer its full length
    prompts = encoded(tokenizer, ["Hello there, how are you today?", "Count to ten please."], raw=True)
    run = serve(loaded, prompts, ServeSettings(max_new_tokens=20, page_size=4, blocks=64, max_batch_tokens=64))
    config = loaded.model.config
    sliding = sum(t == "sliding_attention" for t in config.layer_types)
    per_layer = 4 * 2 * config.num_key_value_heads * config.head_dim * 4  # page x keys and values x heads x dim x 4 B
    assert {g.name: (g.layers, g.bytes_per_block) for g in run.groups} == {
        "sliding_attention": (sliding, sliding * per_layer),
        "full_attention": (config.num_hidden_layers - sliding, (config.num_hidden_layers - sliding) * per_layer)}
    assert run.blocks == 64 and run.peak_bytes == max(run.step_bytes(step) for step in run.steps) > 0
    for (_, ids), request in zip(prompts, run.requests, strict=True):
        with torch.inference_mode():
            expected = loaded.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=20)
        assert request.tokens == expected[0, len(ids):].tolist()


def test_a_model_continuous_batching_cannot_serve_is_refused_by_name(tokenizer):
    from tests.engine.families import tiny_architecture

    loaded = tiny_architecture("mamba", tokenizer)
    with pytest.raises(OptionError, match=r"continuous batching cannot serve .*MambaForCausalLM.*linear_attention"):
        serve(loaded, encoded(tokenizer, ["Hello."], raw=True), ServeSettings(max_new_tokens=2, page_size=4, blocks=8))
    assert loaded.model.config._attn_implementation != "paged|eager"
