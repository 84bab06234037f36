import pytest
import torch

from kvviz.engine import decode, strategies
from kvviz.engine.stopped_compiles import leave_running, stopped_compiles
from kvviz.engine.strategies import OptionError


def test_every_strategy_listed_with_description_and_options():
    names = [s.name for s in strategies.all_strategies()]
    assert names == ["none", "dynamic", "static", "quantized", "sliding", "sink", "h2o", "tova", "snapkv", "knorm",
                     "expected_attention", "pyramidkv", "keydiff", "lagkv", "kvzip", "think", "random", "offloaded",
                     "offloaded-static"]
    for s in strategies.all_strategies():
        listing = s.to_dict()
        assert listing["description"]
        for option in listing["options"]:
            assert option["help"] and "default" in option


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA the offloaded strategies are available")
def test_offloaded_unavailable_on_cpu_with_reason():
    for name in ("offloaded", "offloaded-static"):
        ok, reason = strategies.get(name).available()
        assert not ok and "CUDA" in reason


@pytest.mark.parametrize(
    "name,options,message",
    [
        ("bogus", {}, "unknown strategy 'bogus'; accepted: none, dynamic"),
        ("sliding", {"windw": "3"}, "has no option 'windw'; its options: prefill_chunk, window"),
        ("sliding", {"window": "0"}, "option 'window' of strategy 'sliding' must be an integer >= 2"),
        ("sink", {"window": "0"}, "option 'window' of strategy 'sink' must be an integer >= 1"),
        ("sliding", {"window": "many"}, "must be an integer >= 2, not 'many'"),
        ("quantized", {"nbits": "3"}, "option 'nbits' of backend 'quanto' must be one of 2, 4, not 3"),
        ("quantized", {"backend": "hqq", "nbits": "5"}, "must be one of 1, 2, 3, 4, 8, not 5"),
        ("quantized", {"backend": "zip"}, "option 'backend' of strategy 'quantized' must be one of quanto, hqq, fp8"),
        ("quantized", {"backend": "fp8", "nbits": "4"}, "backend 'fp8' quantizes per tensor and takes no 'nbits'"),
        ("quantized", {"backend": "hqq", "axis_key": "-1"}, "option 'axis_key' of backend 'hqq' must be one of 0, 1"),
        ("static", {"compile": "maybe"}, "option 'compile' of strategy 'static' must be true or false"),
        ("dynamic", {"window": "4"}, "strategy 'dynamic' has no option 'window'; its options: prefill_chunk"),
    ],
)
def test_bad_options_rejected_with_what_is_accepted(name, options, message):
    with pytest.raises(OptionError) as info:
        strategies.choose(name, options)
    assert message in str(info.value)


def test_options_parsed_and_defaults_filled():
    choice = strategies.choose("quantized", {"backend": "hqq", "nbits": "2", "residual_length": "32"})
    assert choice.options == {
        "backend": "hqq", "nbits": 2, "residual_length": 32, "q_group_size": 64, "axis_key": 0, "axis_value": 0,
        "prefill_chunk": 0,
    }
    assert strategies.choose("static", {"compile": "true"}).options["compile"] is True
    assert strategies.choose("quantized", {"backend": "fp8"}).options == {"backend": "fp8", "prefill_chunk": 0}


def test_set_pairs_parsed():
    assert strategies.parse_assignments(["window=64", " sink_tokens = 4 "]) == {"window": "64", "sink_tokens": "4"}
    with pytest.raises(OptionError, match="a strategy option is KEY=VALUE"):
        strategies.parse_assignments(["window"])


def test_max_cache_len_too_small_rejected_before_generating(tiny_model):
    settings = decode.GenerationSettings(max_new_tokens=50)
    with pytest.raises(OptionError, match="'max_cache_len' of strategy 'static' is 10, smaller than"):
        decode.Decoder(tiny_model, strategies.choose("static", {"max_cache_len": "10"}), settings, "hello")


def test_bad_generation_settings_rejected(tiny_model):
    for settings, message in [
        (decode.GenerationSettings(max_new_tokens=0), "max new tokens must be at least 1"),
        (decode.GenerationSettings(temperature=-1), "temperature must be 0"),
        (decode.GenerationSettings(top_p=0), "top-p must be in"),
    ]:
        with pytest.raises(OptionError, match=message):
            decode.Decoder(tiny_model, strategies.choose("dynamic"), settings, "hello")


def test_static_compile_reports_compile_time_apart_and_never_recompiles(tiny_model):
    from torch._dynamo.utils import counters

    settings = decode.GenerationSettings(max_new_tokens=20, raw=True, stop_at_eos=False)
    eager = decode.Decoder(tiny_model, strategies.choose("static"), settings, "compile me")
    compiled = decode.Decoder(tiny_model, strategies.choose("static", {"compile": "true"}), settings, "compile me")
    steps = iter(compiled)
    tokens = [next(steps).token_id for _ in range(2)]  # the prefill, then the first compiled decode step
    frames_after_warm_up = counters["frames"]["total"]
    tokens += [s.token_id for s in steps]  # 18 more decode steps
    assert counters["frames"]["total"] == frames_after_warm_up, "dynamo compiled again after the first step"
    assert tokens == [s.token_id for s in eager]
    assert compiled.trace.compile_ms > 0
    assert eager.trace.compile_ms is None
    # the compile pass was undone: the cache holds exactly what was fed
    assert compiled.trace.steps[-1].layers[0].seq_len == compiled.prompt_tokens + 19


def test_a_decoder_leaves_the_grad_mode_of_every_thread_alone_between_steps_and_when_freed(tiny_model):
    """Inference mode holds only while a step runs: the caller's thread is itself between steps, and an unfinished
    decoder that the garbage collector frees on another thread (here one inside inference mode, as a compile thread
    is) leaves that thread's mode as it was."""
    import gc
    import threading

    settings = decode.GenerationSettings(max_new_tokens=5, raw=True, stop_at_eos=False)
    steps = iter(decode.Decoder(tiny_model, strategies.choose("dynamic"), settings, "leave me unfinished"))
    next(steps)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    seen = []

    def collect_inside_inference_mode() -> None:
        with torch.inference_mode():
            gc.collect()
            seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))

    automatic = gc.isenabled()  # off where a window's collector took collection over (kvviz.qt.collector)
    gc.disable()  # the collection must run on the other thread, not on an allocation here
    try:
        cycle = [steps]
        cycle.append(cycle)  # only the garbage collector frees it
        del steps, cycle
        thread = threading.Thread(target=collect_inside_inference_mode, name="kvviz-test-collect")
        thread.start()
        thread.join()
    finally:
        if automatic:
            gc.enable()
    assert seen == [(False, True)]


def test_context_limit_counts_the_positions_a_strategy_uses(tiny_model):
    long_run = decode.GenerationSettings(max_new_tokens=5000, stop_at_eos=False)
    with pytest.raises(OptionError, match="longer than the model's context of 4096 tokens"):
        decode.Decoder(tiny_model, strategies.choose("dynamic"), long_run, "hello")
    # attention sinks renumber what they keep after each eviction: positions stay inside the context
    decoder = decode.Decoder(tiny_model, strategies.choose("sink", {"window": "16"}), long_run, "hello")
    steps = iter(decoder)
    assert [next(steps).index for _ in range(3)] == [0, 1, 2]


def test_stop_while_compiling_ends_the_run_at_once_and_the_next_run_waits_for_the_compile(tiny_model):
    import time

    torch._dynamo.reset()  # a cold compile (seconds), as a user's first one: else the earlier tests' code serves it
    settings = decode.GenerationSettings(max_new_tokens=20, raw=True, stop_at_eos=False)
    notices = []

    def notice(message):  # the user presses Stop as soon as the window says it is compiling
        notices.append(message)
        if "compiling" in message:
            decoder.cancel()

    decoder = decode.Decoder(tiny_model, strategies.choose("static", {"compile": "true"}), settings, "stop me",
                             notify=notice)
    steps = iter(decoder)
    next(steps)  # the prefill; the next step compiles first
    started = time.monotonic()
    assert list(steps) == []
    assert time.monotonic() - started < 5  # did not wait for the compile to finish
    assert decoder.trace.cancelled and decoder.trace.compile_ms is None
    assert any("compiling" in n for n in notices)
    # The stopped compile goes on, on its own thread; while it does, torch says it is compiling on every thread, and
    # transformers would run the next run's model as if traced: that run starts once the compile has finished.
    following = decode.Decoder(tiny_model, strategies.choose("static"), settings, "after the stop")
    for step in following:
        assert not torch.compiler.is_compiling() and stopped_compiles() == [], step.index


def test_an_evaluation_waits_for_a_stopped_compile_before_its_first_feed_and_a_stop_ends_the_wait(tiny_model):
    """Every way of feeding the model waits for what a Stop left compiling, not only a run: here an evaluation. A
    thread waiting on an event stands for the compile (a real one takes tens of seconds; the run's test has one)."""
    import threading

    from kvviz.engine import evaluate
    from kvviz.files import documents

    dynamic = strategies.choose("dynamic")
    ids, record, _ = evaluate.prepare(tiny_model, documents.builtin("alice"), [dynamic], 16)
    finished = threading.Event()
    compiling = threading.Thread(target=finished.wait, name="kvviz-test-stopped-compile")
    compiling.start()
    leave_running(compiling)
    try:
        cancel = threading.Event()
        stopped = evaluate.Evaluation(tiny_model, dynamic, ids, record, cancel=cancel)
        cancel.set()  # the user's Stop: the wait ends, nothing is fed
        assert list(stopped) == [] and stopped.result.cancelled and stopped_compiles() == [compiling]
        records = []
        waiting = evaluate.Evaluation(tiny_model, dynamic, ids, record)
        reading = threading.Thread(target=lambda: records.extend(waiting), name="kvviz-test-evaluation")
        reading.start()
        reading.join(0.5)
        assert reading.is_alive() and records == [] and waiting.run.seen == 0  # waits, nothing fed
    finally:
        finished.set()
    reading.join(60)
    assert len(records) == len(ids) - 1 and stopped_compiles() == []


def test_quanto_kernels_load_before_the_prefill_and_apart_from_it(tiny_model):
    settings = decode.GenerationSettings(max_new_tokens=3, raw=True, stop_at_eos=False)
    notices = []
    choice = strategies.choose("quantized", {"q_group_size": "32", "residual_length": "2"})
    decoder = decode.Decoder(tiny_model, choice, settings, "warm me", notify=notices.append)
    steps = list(decoder)
    assert decoder.trace.warm_up_ms is not None and len(steps) == 3
    assert any("quanto" in n for n in notices)
    hqq = decode.Decoder(tiny_model, strategies.choose("quantized", {"backend": "hqq", "q_group_size": "32"}),
                         settings, "no warm-up")
    list(hqq)
    assert hqq.trace.warm_up_ms is None


def test_every_strategy_runs_on_the_tiny_model_with_its_default_options(tiny_model):
    settings = decode.GenerationSettings(max_new_tokens=3, raw=True, stop_at_eos=False)
    for strategy in strategies.all_strategies():
        if not strategy.available()[0]:
            continue
        decoder = decode.Decoder(tiny_model, strategies.choose(strategy.name), settings, "defaults")
        assert len(list(decoder)) == 3, strategy.name


@pytest.mark.parametrize("name,options,kept", [
    ("sliding", {"window": 8}, "its last 7 tokens"),
    ("sink", {"sink_tokens": 4, "window": 4}, "its first 4 tokens (the sinks) and its last 4"),
    ("h2o", {"budget": 8}, "per KV head the 8 tokens that drew the most attention, its last 4 among them"),
    ("h2o", {"budget": 8, "recent": 0}, "per KV head the 8 tokens that drew the most attention."),
    ("tova", {"budget": 8}, "the 8 tokens its last token attends to most"),
    ("snapkv", {"budget": 8, "window": 2}, "its last 2 tokens and the 6 that those tokens' queries attend to most"),
    ("knorm", {"budget": 8}, "the 8 keys with the lowest norm (the first 2 layers keep all of it)"),
])
def test_each_strategy_says_what_it_keeps_of_a_long_prompt(name, options, kept):
    choice = strategies.choose(name, options)
    strategy = strategies.get(name)
    assert strategy.prompt_note(choice.options, 8 if name != "sliding" else 7) is None  # kept whole: nothing to say
    note = strategy.prompt_note(choice.options, 100)
    assert note.startswith("The prompt is 100 tokens, more than this cache keeps") and kept in note
    assert "drops the start" not in note


@pytest.mark.parametrize("name", ["dynamic", "static", "quantized", "none"])
def test_caches_that_keep_every_token_say_nothing_of_the_prompt(name):
    assert strategies.get(name).prompt_note(strategies.choose(name).options, 100_000) is None
