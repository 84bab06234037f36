"""Many requests through one paged cache: transformers' own continuous batching, measured as it serves.

Requests are sent to `model.init_continuous_batching`'s manager as they arrive (all at once, or Poisson-spaced at a
rate), and its thread schedules them in batches over a pool of blocks (`kvviz.engine.paged_pool`). kvviz hooks the
manager's batch processor on that thread, around each step: after the scheduler allocated the step's blocks (the
pool's state, the batch), after the forward (which requests got a token, when), at each preemption, and at each prefix
match. Its clocks are its own: a preempted request is soft-reset by transformers, which starts its timestamps again.

Greedy: each answer is `generate`'s of that prompt alone, ending at the end-of-sequence token as `generate`'s does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from kvviz.engine import paged_pool
from kvviz.errors import OptionError
from kvviz.files.serve_trace import ServedRequest, ServeRun, ServeSettings, ServeStep


def serve(loaded, prompts: list[tuple[str, list[int]]], settings: ServeSettings,
          on_start: Callable[[ServeRun], None] | None = None, on_step: Callable[[ServeRun], None] | None = None,
          stop: threading.Event | None = None) -> ServeRun:
    """Serve `prompts` ((text, token ids) each) through `loaded`'s model's continuous batching. `on_start(run)` once
    the pool is built (on this thread), `on_step(run)` after each step (on the manager's thread); `stop` set ends the
    run early, the requests still open failed at once and the run said cancelled, what was measured kept. Ctrl-C
    and SIGTERM do the same, then go on up."""
    settings.check()
    with sdpa_for_the_run(loaded.model):
        return _serve(loaded, prompts, settings, on_start, on_step, stop)


@contextmanager
def sdpa_for_the_run(model):
    """kvviz's `kvviz_sdpa` (left on the model by a cache that scores attention: transformers' sdpa with kvviz's
    hook) is not an attention continuous batching takes: plain sdpa for the run, kvviz's again after it (transformers
    itself restores, at the manager's stop, the implementation it found)."""
    from kvviz.engine import attention_scores

    own = model.config._attn_implementation == attention_scores.NAME
    if own:
        model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        if own:
            model.set_attn_implementation(attention_scores.NAME)


def _serve(loaded, prompts, settings: ServeSettings, on_start, on_step, stop) -> ServeRun:
    model = loaded.model
    generation, batching = serving_configs(model, settings)
    attention = model.config._attn_implementation
    try:
        manager = model.init_continuous_batching(generation_config=generation, continuous_batching_config=batching)
        manager.warmup()  # builds the batch processor, its cache and scheduler, which the hooks go on
    except (ValueError, NotImplementedError, TypeError, AttributeError) as exc:
        if model.config._attn_implementation != attention:  # switched for batching, never started: back as it was
            model.set_attn_implementation(attention)
        raise OptionError(f"transformers' continuous batching cannot serve {loaded.card.get('name') or 'this model'} "
                          f"({type(model).__name__}): {exc}") from None
    run = None
    try:
        paged_pool.probe(manager)
        arrivals = settings.arrivals(len(prompts))
        run = ServeRun(loaded.card, settings, paged_pool.groups(manager), paged_pool.pool_blocks(manager),
                       paged_pool.pool_bytes(manager),
                       manager.batch_processor.cache.max_batch_tokens,
                       [ServedRequest(f"r{i}", text, len(ids), at)
                        for i, ((text, ids), at) in enumerate(zip(prompts, arrivals, strict=True))],
                       sized_from_memory=settings.blocks is None)
        _check_fits(run, prompts, settings.max_new_tokens)
        if on_start is not None:
            on_start(run)
        started = time.perf_counter()
        _hook(manager, run, started, on_step)
        manager.start()
        _send_and_collect(manager, run, prompts, loaded.tokenizer, started, stop)
    except BaseException as exc:
        if run is not None:
            run.cancelled = True
            run.error = None if isinstance(exc, KeyboardInterrupt) else str(exc)
        raise
    finally:
        # the requests still open are failed at once rather than served to their end
        open_requests = run is None or any(not r.finished for r in run.requests)
        manager.stop(block=True, hard_stop=open_requests)
        if run is not None and open_requests:
            run.cancelled = True
    return run


def serving_configs(model, settings: ServeSettings):
    """transformers' GenerationConfig and ContinuousBatchingConfig for `settings`: greedy, ending at the model's
    end-of-sequence token; sdpa kept (no switch to flash attention); no CPU swap space, so that a preempted request is
    soft-reset (computed again), as on any machine without pinned memory."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    eos = model.generation_config.eos_token_id
    pad = model.generation_config.pad_token_id
    generation = GenerationConfig(do_sample=False, max_new_tokens=settings.max_new_tokens, eos_token_id=eos,
                                  pad_token_id=pad if pad is not None else eos[0] if isinstance(eos, list) else eos)
    given = {"page_size": settings.page_size, "num_blocks": settings.blocks,
             "max_batch_tokens": settings.max_batch_tokens, "max_requests_per_batch": settings.concurrency}
    batching = ContinuousBatchingConfig(
        **{name: value for name, value in given.items() if value is not None}, scheduler_type=settings.scheduler,
        allow_block_sharing=settings.prefix_sharing, auto_switch_to_flash=False, cpu_offload_space=0.0,
    )
    return generation, batching


def _check_fits(run: ServeRun, prompts, max_new_tokens: int) -> None:
    """A request that the whole pool cannot hold would fail every request (transformers stops its loop)."""
    longest = max(len(ids) for _, ids in prompts) + max_new_tokens
    for group in run.groups:
        needed = -(-longest // group.page)
        if group.name == "full_attention" and needed > group.blocks:
            raise OptionError(
                f"the longest request ({longest:,} tokens with its new tokens) needs {needed} blocks of "
                f"{group.page} tokens, and the pool has {group.blocks}: give at least {needed} blocks, or shorter "
                "prompts or fewer new tokens"
            )


def _hook(manager, run: ServeRun, started: float, on_step) -> None:
    """kvviz's measurements around the batch processor's own steps, on the manager's thread."""
    processor = manager.batch_processor
    scheduler = processor.scheduler
    by_id = {r.id: r for r in run.requests}
    prepare, update = processor.prepare_next_batch, processor.update_batch
    offload, match = processor.offloading_manager.offload_requests, processor.cache.search_prefix_match

    def prepared() -> bool:
        ready = prepare()
        if ready:
            batch = [(f.state.request_id, f.query_length, f.query_length == 1 and f.state.generated_len() > 0)
                     for f in processor.inputs_and_outputs.requests_in_batch]
            pool = paged_pool.pool_state(manager)
            for request in run.requests:
                held = sum(len(tables.get(request.id, ())) for tables in pool.tables.values())
                request.peak_blocks = max(request.peak_blocks, held)
            run.steps.append(ServeStep(time.perf_counter() - started, None, batch, pool,
                                       list(scheduler.waiting_requests_order)))
        return ready

    def updated() -> None:
        now = time.perf_counter() - started
        step = run.steps[-1]
        step.ended = now
        for future in processor.inputs_and_outputs.requests_in_batch:
            if future.has_new_token and future.state.request_id in by_id:
                by_id[future.state.request_id].token_times.append(now)
        update()
        if on_step is not None:
            on_step(run)

    def offloaded() -> bool:
        before = set(scheduler.active_requests)
        done = offload()
        now = time.perf_counter() - started
        for request_id in before - set(scheduler.active_requests):
            if request_id in by_id:
                by_id[request_id].preempted_at.append(now)
        return done

    def matched(request_id: str, prompt_ids: list[int]) -> int:
        tokens = match(request_id, prompt_ids)
        if request_id in by_id:
            by_id[request_id].prefix_tokens += tokens
        return tokens

    processor.prepare_next_batch, processor.update_batch = prepared, updated
    processor.offloading_manager.offload_requests, processor.cache.search_prefix_match = offloaded, matched


def _send_and_collect(manager, run: ServeRun, prompts, tokenizer, started: float, stop) -> None:
    """Send each request at its arrival and collect the answers until every request finished (or `stop`)."""
    waiting = list(zip(run.requests, prompts, strict=True))
    open_requests = {r.id: r for r in run.requests}
    while open_requests and not (stop is not None and stop.is_set()):
        now = time.perf_counter() - started
        while waiting and waiting[0][0].arrival <= now:
            request, (_, ids) = waiting.pop(0)
            request.submitted = time.perf_counter() - started
            manager.add_request(list(ids), request_id=request.id, max_new_tokens=run.settings.max_new_tokens)
        wait = 0.05 if not waiting else max(0.0, min(0.05, waiting[0][0].arrival - now))
        output = manager.get_result(timeout=wait)
        if output is None:
            if not manager.is_running():
                error = manager.background_thread_status.fatal_error
                raise RuntimeError(f"transformers' continuous batching stopped: {error or 'its thread ended'}")
            continue
        request = open_requests.get(output.request_id)
        if request is None or not output.is_finished():
            continue
        if output.error:
            raise RuntimeError(f"request {request.id} failed in transformers' continuous batching: {output.error}")
        request.tokens = list(output.generated_tokens)
        request.text = tokenizer.decode(request.tokens, skip_special_tokens=True)
        request.finished = True
        del open_requests[request.id]


def encoded(tokenizer, texts: list[str], prefix: str = "", raw: bool = False) -> list[tuple[str, list[int]]]:
    """Each request as `serve` takes it: (its own text, the token ids the model reads: the shared prefix, then the
    text, in the chat template's user turn unless `raw`)."""
    from kvviz.engine.decode import encode_prompt

    def read(text: str) -> str:
        return f"{prefix.rstrip()}\n\n{text}" if prefix.strip() else text

    return [(text, encode_prompt(tokenizer, read(text), raw)) for text in texts]


BUILTIN_TEXT = "alice"  # the built-in text whose passages `--requests N` asks about
BUILTIN_ASK = "Summarize this passage in one sentence:\n\n"
BUILTIN_PASSAGE_WORDS = 40  # the least words of a paragraph taken as a passage


def builtin_prompts(n: int) -> list[str]:
    """`n` requests drawn from the built-in text: each asks for a summary of one of its paragraphs, in order,
    starting again from the first when there are more requests than paragraphs."""
    from kvviz.files import documents

    text = documents.builtin(BUILTIN_TEXT).text
    passages = [" ".join(p.split()) for p in text.split("\n\n") if len(p.split()) >= BUILTIN_PASSAGE_WORDS]
    return [BUILTIN_ASK + passages[i % len(passages)] for i in range(n)]
