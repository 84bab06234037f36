"""Many requests through one paged cache: transformers' own continuous batching, measured as it serves.

Requests are sent to `model.init_continuous_batching`'s manager as they arrive (all at once, or Poisson-spaced at a
rate), and its thread schedules them in batches over a pool of blocks (`kvviz.engine.paged_pool`). kvviz hooks the
manager's batch processor on that thread, around each step: after the scheduler allocated the step's blocks (the
pool's state, the batch), after the forward (which requests got a token, when), at each preemption, and at each prefix
match. Its clocks are its own: a preempted request is soft-reset by transformers, which starts its timestamps again.

Greedy: each answer is `generate`'s of that prompt alone, ending at the end-of-sequence token as `generate`'s does.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from kvviz.engine import paged_pool
from kvviz.errors import OptionError

SCHEDULERS = ("fifo", "prefill_first")


@dataclass
class ServeSettings:
    max_new_tokens: int = 64
    page_size: int | None = None  # tokens per block; None: transformers' default
    blocks: int | None = None  # the pool's blocks; None: sized from free memory, as transformers sizes it
    max_batch_tokens: int | None = None  # query tokens per step; None: transformers' choice
    concurrency: int | None = None  # requests per batch; None: transformers' choice
    scheduler: str = "fifo"
    prefix_sharing: bool = True
    rate: float | None = None  # requests per second, Poisson-spaced; None: all at once
    seed: int = 0

    def check(self) -> None:
        for name in ("max_new_tokens", "page_size", "blocks", "max_batch_tokens", "concurrency"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionError(f"{name.replace('_', ' ')} must be at least 1, got {value}")
        if self.page_size is not None and self.page_size < 4:
            raise OptionError(f"the page size must be at least 4 tokens (transformers' least), got {self.page_size}")
        if self.scheduler not in SCHEDULERS:
            raise OptionError(f"unknown scheduler {self.scheduler!r}: give {' or '.join(SCHEDULERS)}")
        if self.rate is not None and not self.rate > 0:
            raise OptionError(f"the rate must be above 0 requests per second, got {self.rate}")

    def arrivals(self, n: int) -> list[float]:
        """Seconds after the start at which each of `n` requests arrives: at once, or with exponential gaps."""
        if self.rate is None:
            return [0.0] * n
        draw, at, times = random.Random(self.seed), 0.0, []
        for _ in range(n):
            times.append(at)
            at += draw.expovariate(self.rate)
        return times


@dataclass
class ServedRequest:
    """One request as served; times in seconds from the run's start."""

    id: str
    prompt: str
    prompt_tokens: int
    arrival: float
    submitted: float | None = None
    token_times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    preemptions: int = 0
    peak_blocks: int = 0  # the most blocks it held at once, every group counted
    prefix_tokens: int = 0  # of its prompt, found in blocks already in the pool (not computed again)
    finished: bool = False

    @property
    def ttft_ms(self) -> float | None:
        if self.submitted is None or not self.token_times:
            return None
        return (self.token_times[0] - self.submitted) * 1000.0

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first; None for a single token."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1) * 1000.0


@dataclass
class ServeStep:
    """One forward of the batch."""

    started: float
    ended: float | None
    batch: list[tuple[str, int, bool]]  # (request, query tokens, decoding)
    pool: paged_pool.PoolState
    waiting: list[str]

    @property
    def prefill_tokens(self) -> int:
        return sum(tokens for _, tokens, decoding in self.batch if not decoding)

    @property
    def decode_tokens(self) -> int:
        return sum(tokens for _, tokens, decoding in self.batch if decoding)


@dataclass
class ServeRun:
    settings: ServeSettings
    groups: list[paged_pool.Group]
    pool_bytes: int
    max_batch_tokens: int
    requests: list[ServedRequest]
    steps: list[ServeStep] = field(default_factory=list)
    sized_from_memory: bool = False  # the pool's blocks were transformers' choice from free memory
    interrupted: KeyboardInterrupt | None = None  # Ctrl-C or SIGTERM ended the run before every request finished

    @property
    def page_size(self) -> int:
        return self.groups[0].page

    @property
    def blocks(self) -> int:
        return self.groups[0].blocks

    @property
    def bytes_per_block(self) -> int:
        """Every group's block together: what a request's block of positions costs across all layers."""
        return sum(group.bytes_per_block for group in self.groups)

    def step_bytes(self, step: ServeStep) -> int:
        return sum(step.pool.held(group.name) * group.bytes_per_block for group in self.groups)

    @property
    def peak_blocks(self) -> int:
        """The most blocks held at once (a block shared by several requests once), every group counted."""
        return max((sum(step.pool.held(g.name) for g in self.groups) for step in self.steps), default=0)

    @property
    def peak_bytes(self) -> int:
        return max((self.step_bytes(step) for step in self.steps), default=0)

    @property
    def reused_blocks(self) -> int:
        """Blocks a request took from the pool by a prefix match instead of computing them again."""
        return sum(r.prefix_tokens // g.page for r in self.requests for g in self.groups)

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(len(r.token_times) for r in self.requests)

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens over the time from the first request's submission to the last token."""
        times = [t for r in self.requests for t in r.token_times]
        submitted = [r.submitted for r in self.requests if r.submitted is not None]
        if not times or not submitted or max(times) <= min(submitted):
            return None
        return len(times) / (max(times) - min(submitted))


def serve(model, tokenizer, prompts: list[tuple[str, list[int]]], settings: ServeSettings,
          on_step=None, stop: threading.Event | None = None) -> ServeRun:
    """Serve `prompts` ((text, token ids) each) through the model's continuous batching; `on_step(run)` after each
    step (on the manager's thread); `stop` set ends the run early, what was measured kept."""
    settings.check()
    generation, batching = serving_configs(model, settings)
    manager = model.init_continuous_batching(generation_config=generation, continuous_batching_config=batching)
    run = None
    try:
        manager.warmup()  # builds the batch processor, its cache and scheduler, which the hooks go on
        paged_pool.probe(manager)
        run = ServeRun(settings, paged_pool.groups(manager), paged_pool.pool_bytes(manager),
                       manager.batch_processor.cache.max_batch_tokens,
                       [ServedRequest(f"r{i}", text, len(ids), at)
                        for i, ((text, ids), at) in enumerate(zip(prompts, settings.arrivals(len(prompts)),
                                                                      strict=True))],
                       sized_from_memory=settings.blocks is None)
        _check_fits(run, prompts, settings.max_new_tokens)
        started = time.perf_counter()
        _hook(manager, run, started, on_step)
        manager.start()
        _send_and_collect(manager, run, prompts, tokenizer, started, stop)
    except KeyboardInterrupt as interrupt:  # Ctrl-C or SIGTERM: what was measured is kept
        if run is None:
            raise
        run.interrupted = interrupt
    finally:
        # the requests still open are failed at once rather than served to their end
        manager.stop(block=True, hard_stop=run is None or any(not r.finished for r in run.requests))
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
        for request_id in before - set(scheduler.active_requests):
            if request_id in by_id:
                by_id[request_id].preemptions += 1
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
