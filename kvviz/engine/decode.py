"""The instrumented decode loop.

An own loop over ``model(...)`` rather than ``generate``: it can stop between any two steps and
replace the cache object between steps. Each step feeds the model (the prompt at the prefill,
then one token), picks the next token, and yields a `StepRecord` with the step's wall time, the
time of every decoder layer and the measured and predicted size of the cache.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from kvviz.engine import allocations, measure
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.fidelity import Reference
from kvviz.engine.geometry import Geometry
from kvviz.engine.layer_timer import LayerTimer
from kvviz.engine.machine import memory_bandwidth
from kvviz.engine.models import LoadedModel
from kvviz.engine.stopped_compiles import leave_running
from kvviz.engine.strategies import StrategyChoice, capacity_for, get
from kvviz.errors import OptionError
from kvviz.files.trace import Pin, StepRecord, Switch, Trace

MAX_SEED = 2**63 - 1  # torch generators take a signed 64-bit seed
ENCODER_PIN = ("a pinned span is a stretch of what the cache reads, and this encoder-decoder's prompt goes to its "
               "encoder, not its cache; pin spans on a decoder-only model")


@dataclass
class GenerationSettings:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0
    seed: int = 0
    raw: bool = False  # send the prompt as is, without the chat template
    stop_at_eos: bool = True  # False: always generate max_new_tokens (benchmarks)

    def check(self) -> None:
        if self.max_new_tokens < 1:
            raise OptionError(f"max new tokens must be at least 1, not {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise OptionError(f"temperature must be 0 (greedy) or a positive finite number, not {self.temperature}")
        if self.top_k < 0:
            raise OptionError(f"top-k must be 0 (off) or a positive integer, not {self.top_k}")
        if not 0 < self.top_p <= 1:  # also refuses NaN
            raise OptionError(f"top-p must be in (0, 1], not {self.top_p}")
        if not 0 <= self.seed <= MAX_SEED:
            raise OptionError(f"the seed must be an integer from 0 to {MAX_SEED}, not {self.seed}")


def encode_prompt(tokenizer, prompt: str, raw: bool) -> list[int]:
    """Token ids of the prompt, wrapped in the chat template unless `raw` or the tokenizer has none."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:  # undecodable bytes of a command-line argument, kept as surrogates
        raise OptionError(
            f"the prompt is not valid UTF-8 text (undecodable bytes at character {exc.start}); "
            "give UTF-8 text, or a file with --prompt-file"
        ) from None
    if not raw and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


class Decoder:
    """Generates from one prompt with one cache strategy, yielding a record per step.

    Raises `OptionError` at construction for anything the user asked for that cannot run
    (an unavailable strategy, an unsupported model, a too-small max_cache_len, bad settings, a prompt
    plus new tokens longer than the model's context, a cache that would not fit in memory).
    With `reference=True` a full-precision DynamicCache reference runs in lockstep on the same
    tokens, and each step records how far the run's next-token distribution is from it.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        choice: StrategyChoice,
        settings: GenerationSettings,
        prompt: str,
        reference: bool = False,
        notify: Callable[[str], None] | None = None,
        prompt_ids: list[int] | None = None,
        run: CacheRun | None = None,
        pins: list[Pin] | None = None,
    ):
        """`prompt_ids`: the prompt's tokens as given (a conversation's templated history) instead of `prompt`
        encoded; `run`: a cache run that already holds the first `run.seen` of them (a conversation's kept cache),
        continued with only the rest fed (the conversation checks the context and the cache's room per turn);
        `pins`: spans of the prompt's tokens whose holding each step records (`StepRecord.pins_held`)."""
        settings.check()
        self.notify = notify or (lambda message: None)  # what a long one-time pause is doing
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.settings = settings
        self.prompt_ids = encode_prompt(self.tokenizer, prompt, settings.raw) if prompt_ids is None else prompt_ids
        if not self.prompt_ids:
            raise OptionError("the prompt is empty; type some text to continue")
        self.prompt_tokens = len(self.prompt_ids)
        for pin in pins or ():
            if not 0 <= pin.start < pin.end <= self.prompt_tokens:
                raise OptionError(f"the pinned span [{pin.start}, {pin.end}) is not within the prompt's "
                                  f"{self.prompt_tokens:,} tokens; pin a span of the prompt")
        # what this cache does to a prompt it cannot keep whole (None: it keeps it), for the front ends to say
        self.prompt_note = get(choice.name).prompt_note(choice.options, self.prompt_tokens)
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._pending: StrategyChoice | None = None
        self.trace = Trace(
            model=dict(loaded.card),
            strategy={"name": choice.name, "options": dict(choice.options)},
            prompt=prompt,
            prompt_tokens=self.prompt_tokens,
            prompt_pieces=self.tokenizer.batch_decode([[i] for i in self.prompt_ids]),  # what positions are named by
            settings=asdict(settings),
            weight_bytes=loaded.card.get("weight_bytes"),
            bandwidth_bytes_per_s=memory_bandwidth(self.model.device),
            pins=list(pins or ()),
        )
        if run is not None:  # a conversation's next turn continues the cache it kept
            self.capacity, self.run = run.capacity, run
        else:
            if self.model.config.is_encoder_decoder:  # the encoder reads the prompt; the decoder keeps its own tokens
                _check_encoder_decoder_context(self.model, self.prompt_tokens, settings.max_new_tokens)
                total = 1 + settings.max_new_tokens  # its start token and the new tokens
            else:
                total = self.prompt_tokens + settings.max_new_tokens
                _check_context(self.model, get(choice.name).positions_needed(choice.options, total),
                               self.prompt_tokens, settings.max_new_tokens)
            self.capacity = capacity_for(choice, total)
            self.run = CacheRun(self.model, choice, self.capacity, tokenizer=self.tokenizer)
            self.run.check_memory()
        self.encoder_decoder = self.run.geometry.encoder_decoder
        if pins and self.encoder_decoder:
            raise OptionError(ENCODER_PIN)
        if reference and self.encoder_decoder:
            raise OptionError("the exact-cache reference runs decoder-only models; this model is an encoder-decoder, "
                              "and its dynamic cache is already exact: run without the reference (kvviz compare "
                              "--no-reference; in the window, Compare with the exact cache off)")
        self.decoder_start = self._decoder_start() if self.encoder_decoder else None
        self.prefill_logits: torch.Tensor | None = None  # the prefill's next-token logits [vocab] (float32, CPU)
        self.reference = Reference(self.model) if reference else None
        self.eos_ids = self._eos_ids()
        self._processors = self._make_processors()
        self._generator = torch.Generator(device="cpu").manual_seed(settings.seed)
        self._compile = bool(choice.options.get("compile"))

    @property
    def choice(self) -> StrategyChoice:
        return self.run.choice

    def pin_text(self, text: str) -> Pin:
        """Pin the tokens of the first place `text` occurs in the prompt as the model reads it (its chat template
        included), before the run starts; raises OptionError where it does not occur."""
        if self.encoder_decoder:
            raise OptionError(ENCODER_PIN)
        pieces = self.trace.prompt_pieces
        start = "".join(pieces).find(text) if text else -1
        if start < 0:
            raise OptionError(f"the text {text[:40]!r} does not occur in the prompt; pin a stretch of the prompt's own "
                              "words")
        ends = list(itertools.accumulate(len(piece) for piece in pieces))
        first = bisect.bisect_right(ends, start)
        last = bisect.bisect_left(ends, start + len(text))
        pin = Pin(first, last + 1, text)
        self.trace.pins.append(pin)
        return pin

    # -- setup -------------------------------------------------------------------------------------

    def _eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return set()
        return set(eos) if isinstance(eos, (list, tuple)) else {eos}

    def _make_processors(self) -> LogitsProcessorList:
        s = self.settings
        processors = LogitsProcessorList()
        if s.temperature > 0:
            processors.append(TemperatureLogitsWarper(s.temperature))
            if s.top_k > 0:
                processors.append(TopKLogitsWarper(s.top_k))
            if s.top_p < 1.0:
                processors.append(TopPLogitsWarper(s.top_p))
        return processors

    # -- control (safe from any thread) ------------------------------------------------------------

    def cancel(self) -> None:
        """Ask the loop to stop after the step in progress."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def request_switch(self, choice: StrategyChoice) -> None:
        """Switch to `choice` at the next step boundary; raises OptionError if it cannot convert, or if the positions
        the run would number with it pass the model's context. Asked between steps (the window and `kvviz run` ask
        right after a step's record), so that the cache it is checked against is the one it converts."""
        if self._compile or choice.options.get("compile"):
            raise OptionError("runs under torch.compile cannot switch strategy live; start a new run instead")
        with self._lock:
            problem = self.run.switch_refusal(choice) or self._context_refusal(choice)
            if problem:
                raise OptionError(f"cannot switch from {self.run.choice.name!r} to {choice.name!r}: {problem}")
            self._pending = choice

    def _context_refusal(self, choice: StrategyChoice) -> str | None:
        """Why the rest of the run, switched to `choice` now, would pass the model's context, or None."""
        context = self.run.geometry.context
        done = len(self.trace.steps)
        left = self.settings.max_new_tokens - done
        needed = self.run.positions_after(choice, left)
        if not context or needed <= context:
            return None
        return (
            f"the run has numbered {self.run.position:,} positions and has up to {left:,} tokens left to generate, "
            f"{needed:,} positions with {choice.name!r}, more than the model's context of {context:,}; switch within "
            f"runs of at most {done + max(context - self.run.position, 0):,} new tokens, or to a strategy that "
            "renumbers what it keeps (sink)"
        )

    def watch_attention(self, on: bool) -> None:
        """From the next step on, record where the current token's attention goes (the attention view), or stop.
        Raises OptionError if this model's attention cannot be read."""
        if on and self._compile:
            raise OptionError("runs under torch.compile cannot show their attention; start a run without compile")
        self.run.watch_attention(on)

    # -- the loop ----------------------------------------------------------------------------------

    def _pick(self, ids: torch.Tensor, logits: torch.Tensor) -> int:
        if self.settings.temperature == 0:
            return int(logits.argmax(dim=-1).item())
        scores = self._processors(ids, logits.float())
        probs = torch.softmax(scores, dim=-1).cpu()
        return int(torch.multinomial(probs, 1, generator=self._generator).item())

    def take_pending_switch(self) -> StrategyChoice | None:
        """The switch asked for and not taken yet (one asked after the last step: a conversation's next turn takes
        it), no longer pending."""
        with self._lock:
            choice, self._pending = self._pending, None
        return choice

    def _apply_pending_switch(self, index: int) -> None:
        choice = self.take_pending_switch()
        if choice is None:
            return
        old = self.run.choice
        self.run.switch(choice)
        self.trace.switches.append(Switch(index, old.name, choice.name, dict(choice.options)))

    # As a decorator, inference mode is entered at each step and left at each yield. A `with` around the loop
    # stayed entered while the generator waited: the caller's thread ran in inference mode between steps, and a
    # generator left unfinished, freed by the garbage collector on whatever thread it ran, turned that thread's
    # grad mode back on (a compile thread then failed dynamo's "guard failed on the same frame" check).
    @torch.inference_mode()
    def __iter__(self) -> Iterator[StepRecord]:
        device = self.model.device
        prompt = torch.tensor([self.prompt_ids], device=device)
        # what the decoder has read and written: the prompt then each new token, or an encoder-decoder's decoder
        # start token then each new token (its prompt goes to the encoder)
        ids = torch.tensor([[self.decoder_start]], device=device) if self.encoder_decoder else prompt
        first_new = ids.shape[-1]
        timer = LayerTimer(self.model, device, enabled=not self._compile)
        compiled = None
        text = ""
        new = ids[:, self.run.seen :]  # what the next step feeds a cache: the prompt's uncached rest, then each token
        try:
            # before the prefill, apart from its time (and after any compile a Stop left running)
            self.trace.warm_up_ms = self.run.warm_up(self.notify, self._cancel)
            for index in range(self.settings.max_new_tokens):
                if self._cancel.is_set():
                    self.trace.cancelled = True
                    break
                prefill = index == 0
                if not prefill:
                    self._apply_pending_switch(index)
                fed = ids if self.run.cache is None else new
                forward = None
                if self._compile and not prefill:
                    compiled = compiled or self._compile_decode(fed)
                    if compiled is None:  # stopped while compiling
                        self.trace.cancelled = True
                        break
                    forward = compiled
                # the prefill's allocations are counted (about 2 µs an operator, in its time): what serving the
                # request holds at its peak beside the weights and what was there before
                with allocations.counting(device) if prefill else nullcontext() as counted:
                    started = time.perf_counter()
                    if prefill and self.encoder_decoder:
                        self.run.encode(prompt)
                    feed = self.run.prefill if prefill else self.run.forward
                    logits = feed(fed, forward)[:, -1, :]
                    token = self._pick(ids, logits)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    wall_ms = (time.perf_counter() - started) * 1000.0
                layer_ms = timer.collect()
                if prefill:  # kept for a conversation's re-prefill check, outside the step's time
                    self.prefill_logits = logits[0].float().cpu()
                fidelity = None
                if self.reference is not None:
                    fidelity = self.reference.compare(new, logits, token)
                    timer.collect()  # the reference's layer times are not the run's
                # A fresh [1, 1] tensor, not the view ids[:, -1:]: a view's stride grows with ids, and
                # torch.compile guards on strides, so it would recompile at every step.
                new = torch.tensor([[token]], device=device)
                ids = torch.cat([ids, new], dim=-1)
                new_text = self.tokenizer.decode(ids[0, first_new:], skip_special_tokens=False)
                if new_text.endswith("\ufffd"):  # a multi-byte character is not complete yet
                    piece = ""
                else:
                    piece, text = new_text[len(text) :], new_text
                record = self._record(index, prefill, token, piece, wall_ms, layer_ms, fidelity)
                if counted is not None:
                    record.peak_allocated_bytes = counted.peak_bytes
                    record.allocations = [list(point) for point in counted.timeline]
                self.trace.steps.append(record)
                yield record
                if self.settings.stop_at_eos and token in self.eos_ids:
                    break
        finally:
            timer.remove()

    def _decoder_start(self) -> int:
        """The token an encoder-decoder's decoder starts from (T5: the pad token; BART: the end-of-sequence one)."""
        start = self.model.generation_config.decoder_start_token_id
        if start is None:
            start = getattr(self.model.config, "decoder_start_token_id", None)
        if start is None:
            raise OptionError("this encoder-decoder's config names no decoder_start_token_id, the token its decoder "
                              "starts from; set it in the model's generation_config.json")
        return start

    def _compile_decode(self, fed: torch.Tensor):
        """Compile the decode forward once, timed apart, on a throw-away step that is then undone.

        The compile (tens of seconds) runs on a helper thread so that Stop can end the run meanwhile; a
        stopped compile finishes on its own thread and is thrown away. Returns None when stopped.
        """
        self.notify("compiling the decode step with torch.compile (tens of seconds, once per run)")
        compiled = torch.compile(self.model.forward, dynamic=False)
        started = time.perf_counter()
        done = threading.Event()
        failures: list[BaseException] = []

        def warm() -> None:
            try:
                with torch.inference_mode():
                    self.run.call(fed, compiled)
            except BaseException as exc:  # noqa: BLE001 - raised again on the decoding thread
                failures.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=warm, name="kvviz-compile", daemon=True)
        thread.start()
        while not done.wait(0.1) and not self._cancel.is_set():
            pass
        if self._cancel.is_set():
            leave_running(thread)
            return None
        if failures:
            raise failures[0]
        self.run.cache.crop(-fed.shape[-1])
        self.trace.compile_ms = (time.perf_counter() - started) * 1000.0
        self.notify("")
        return compiled

    def _record(self, index, prefill, token, piece, wall_ms, layer_ms, fidelity) -> StepRecord:
        # Without a cache there is nothing to measure, but the layers still take time.
        layers = self.run.measure()
        for layer, ms in zip(layers, layer_ms, strict=False):
            layer.layer_ms = ms
        record = StepRecord(
            index=index,
            phase="prefill" if prefill else "decode",
            token_id=token,
            token=piece,
            wall_ms=wall_ms,
            cache_bytes=sum(layer.total_bytes for layer in layers),
            predicted_cache_bytes=self.run.predicted_bytes,
            policy_bytes=self.run.policy_bytes(),
            predicted_policy_bytes=self.run.predicted_policy_bytes,
            rss_bytes=measure.rss_bytes(),
            strategy=self.run.choice.name,
            layers=layers,
            cuda_bytes=measure.cuda_bytes(self.model.device),
            position=(1 if self.encoder_decoder else self.prompt_tokens) + index,  # after the decoder's start token
            scoring_ms=self.run.scoring_ms,
        )
        if self.trace.pins:
            record.pins_held = [self.run.held(list(range(pin.start, pin.end))) for pin in self.trace.pins]
        if self.run.attention is not None:
            record.attention, record.attention_sink = self.run.attention.rows, self.run.attention.sink_share()
        if fidelity is not None:
            record.kl, record.top1_agree, record.ref_logprob, record.reference_ms = fidelity
        return record


def _check_context(model, positions: int, prompt_tokens: int, new_tokens: int) -> None:
    """Refuse a run whose positions go past what the model was built for."""
    context = Geometry.of(model.config, model.dtype).context
    if context and positions > context:
        raise OptionError(
            f"the prompt ({prompt_tokens} tokens) plus max new tokens ({new_tokens}) is {prompt_tokens + new_tokens} "
            f"tokens, longer than the model's context of {context} tokens; shorten the prompt or ask for at most "
            f"{max(context - prompt_tokens, 0)} new tokens"
        )


def _check_encoder_decoder_context(model, prompt_tokens: int, new_tokens: int) -> None:
    """Refuse an encoder-decoder run whose encoder (the prompt) or decoder (its start token and the new tokens) would
    go past the positions the model was built for."""
    context = Geometry.of(model.config, model.dtype).context
    if context and prompt_tokens > context:
        raise OptionError(f"the prompt ({prompt_tokens} tokens) is longer than the model's context of {context} "
                          "tokens, which its encoder reads whole; shorten the prompt")
    if context and 1 + new_tokens > context:
        raise OptionError(f"max new tokens ({new_tokens}) and the decoder's start token pass the model's context of "
                          f"{context} tokens; ask for at most {context - 1} new tokens")
