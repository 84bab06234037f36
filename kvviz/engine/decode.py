"""The instrumented decode loop.

An own loop over ``model(...)`` rather than ``generate``: it can stop between any two steps and
replace the cache object between steps. Each step feeds the model (the prompt at the prefill,
then one token), picks the next token, and yields a `StepRecord` with the step's wall time, the
time of every decoder layer and the measured and predicted size of the cache.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from kvviz.engine import measure
from kvviz.engine.convert import convert, refusal
from kvviz.engine.fidelity import Reference
from kvviz.engine.models import LoadedModel
from kvviz.engine.predict import CachePredictor, Geometry
from kvviz.engine.strategies import OptionError, StrategyChoice, capacity_for, get
from kvviz.trace import LayerRecord, StepRecord, Switch, Trace


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
        if self.temperature < 0:
            raise OptionError(f"temperature must be 0 (greedy) or positive, not {self.temperature}")
        if self.top_k < 0:
            raise OptionError(f"top-k must be 0 (off) or a positive integer, not {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise OptionError(f"top-p must be in (0, 1], not {self.top_p}")


def encode_prompt(tokenizer, prompt: str, raw: bool) -> list[int]:
    """Token ids of the prompt, wrapped in the chat template unless `raw` or the tokenizer has none."""
    if not raw and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def decoder_layers(model) -> list[torch.nn.Module]:
    """The model's decoder layers, in order: the ModuleList as long as the layer count."""
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers:
            return list(module)
    return []


class LayerTimer:
    """Forward hooks that time every decoder layer.

    On the CPU the layers run synchronously, so wall time around each layer is honest. On CUDA
    kernels run asynchronously, so CUDA events are recorded around each layer and read once the
    step has synchronised. Inside a torch.compile'd forward hooks would be traced into the graph
    and time nothing real, so a compiled run is created with `enabled=False` and reports no
    layer times.
    """

    def __init__(self, model, device: torch.device, enabled: bool = True):
        self.layers = decoder_layers(model) if enabled else []
        self.cuda = device.type == "cuda"
        self.starts: list = [None] * len(self.layers)
        self.ends: list = [None] * len(self.layers)
        self.handles = []
        for i, layer in enumerate(self.layers):
            self.handles.append(layer.register_forward_pre_hook(self._pre(i)))
            self.handles.append(layer.register_forward_hook(self._post(i)))

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _pre(self, i):
        def hook(module, args):
            self.starts[i] = self._now()

        return hook

    def _post(self, i):
        def hook(module, args, output):
            self.ends[i] = self._now()

        return hook

    def collect(self) -> list[float | None]:
        times = []
        for start, end in zip(self.starts, self.ends, strict=True):
            if start is None or end is None:
                times.append(None)
            elif self.cuda:
                times.append(start.elapsed_time(end))
            else:
                times.append((end - start) * 1000.0)
        self.starts = [None] * len(self.layers)
        self.ends = [None] * len(self.layers)
        return times

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


class Decoder:
    """Generates from one prompt with one cache strategy, yielding a record per step.

    Raises `OptionError` at construction for anything the user asked for that cannot run
    (an unavailable strategy, an unsupported model, a too-small max_cache_len, bad settings).
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
    ):
        settings.check()
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.settings = settings
        self.prompt_ids = encode_prompt(self.tokenizer, prompt, settings.raw)
        if not self.prompt_ids:
            raise OptionError("the prompt is empty; type some text to continue")
        self.prompt_tokens = len(self.prompt_ids)
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._pending: StrategyChoice | None = None
        self.trace = Trace(
            model=dict(loaded.card),
            strategy={"name": choice.name, "options": dict(choice.options)},
            prompt=prompt,
            prompt_tokens=self.prompt_tokens,
            settings=asdict(settings),
        )
        self.choice = choice
        self.cache = self._build(choice)
        self.position = 0  # the position the model numbers the next fed token with
        self.seen = 0  # tokens the model has processed
        self.evicted = False
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in parameters else "past_key_values"
        self._keeps_logits = "logits_to_keep" in parameters
        self.reference = Reference(self.model, self._cache_kw, self._keeps_logits) if reference else None
        self.eos_ids = self._eos_ids()
        self._processors = self._make_processors()
        self._generator = torch.Generator(device="cpu").manual_seed(settings.seed)
        self._compile = bool(choice.options.get("compile"))

    # -- setup -------------------------------------------------------------------------------------

    def _build(self, choice: StrategyChoice):
        """Check `choice` against this model and run, build its empty cache and its predictor."""
        strategy = get(choice.name)
        ok, reason = strategy.available()
        if not ok:
            raise OptionError(f"strategy {choice.name!r} is not available here: {reason}")
        problem = strategy.unsupported(self.model, choice.options)
        if problem:
            raise OptionError(f"strategy {choice.name!r} {problem}")
        self.capacity = capacity_for(choice, self.prompt_tokens + self.settings.max_new_tokens)
        geometry = Geometry.of(self.model.config, self.model.dtype)
        self.predictor = CachePredictor(choice.name, choice.options, geometry, self.capacity)
        return strategy.make_cache(self.model, choice.options, self.capacity)

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
        """Switch to `choice` at the next step boundary; raises OptionError if it cannot convert."""
        if self._compile or choice.options.get("compile"):
            raise OptionError("runs under torch.compile cannot switch strategy live; start a new run instead")
        with self._lock:
            problem = refusal(self.choice.name, choice, self.model, self.evicted)
            if problem:
                raise OptionError(f"cannot switch from {self.choice.name!r} to {choice.name!r}: {problem}")
            self._pending = choice

    # -- the loop ----------------------------------------------------------------------------------

    def _forward(self, input_ids: torch.Tensor, forward=None) -> torch.Tensor:
        kwargs = {"logits_to_keep": 1} if self._keeps_logits else {}
        if self.cache is None:
            kwargs["use_cache"] = False
        else:
            n = input_ids.shape[-1]
            kwargs.update(use_cache=True, **{self._cache_kw: self.cache})
            kwargs["position_ids"] = torch.arange(self.position, self.position + n, device=input_ids.device)[None]
        out = (forward or self.model)(input_ids=input_ids, **kwargs)
        return out.logits[:, -1, :]

    def _advance(self, fed: int) -> None:
        self.seen += fed
        if self.choice.name == "sink":  # positions inside a sink cache restart after each eviction
            self.position = self.cache.get_seq_length()
            self.evicted = self.evicted or self.seen > self.position
        else:
            self.position += fed
            if self.choice.name == "sliding":
                self.evicted = self.evicted or self.seen >= self.choice.options["window"]

    def _pick(self, ids: torch.Tensor, logits: torch.Tensor) -> int:
        if self.settings.temperature == 0:
            return int(logits.argmax(dim=-1).item())
        scores = self._processors(ids, logits.float())
        probs = torch.softmax(scores, dim=-1).cpu()
        return int(torch.multinomial(probs, 1, generator=self._generator).item())

    def _apply_pending_switch(self, index: int) -> None:
        with self._lock:
            choice, self._pending = self._pending, None
        if choice is None:
            return
        old = self.choice
        new_cache = self._build(choice)
        moved = convert(self.cache, new_cache, self.position, self.seen)
        self.predictor = CachePredictor(choice.name, choice.options, self.predictor.geometry, self.capacity)
        self.predictor.after_step(moved)
        self.cache, self.choice = new_cache, choice
        if choice.name == "sink":
            self.position = self.cache.get_seq_length()
        self.trace.switches.append(Switch(index, old.name, choice.name, dict(choice.options)))

    def __iter__(self) -> Iterator[StepRecord]:
        device = self.model.device
        ids = torch.tensor([self.prompt_ids], device=device)
        timer = LayerTimer(self.model, device, enabled=not self._compile)
        compiled = None
        text = ""
        try:
            with torch.inference_mode():
                for index in range(self.settings.max_new_tokens):
                    if self._cancel.is_set():
                        self.trace.cancelled = True
                        break
                    prefill = index == 0
                    if not prefill:
                        self._apply_pending_switch(index)
                    fed = ids if self.cache is None or prefill else ids[:, -1:]
                    forward = None
                    if self._compile and not prefill:
                        compiled = compiled or self._compile_decode(fed)
                        forward = compiled
                    started = time.perf_counter()
                    logits = self._forward(fed, forward)
                    token = self._pick(ids, logits)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    wall_ms = (time.perf_counter() - started) * 1000.0
                    layer_ms = timer.collect()
                    self._advance(fed.shape[-1])
                    fidelity = None
                    if self.reference is not None:
                        fidelity = self.reference.compare(fed if prefill else ids[:, -1:], logits, token)
                        timer.collect()  # the reference's layer times are not the run's
                    ids = torch.cat([ids, torch.tensor([[token]], device=device)], dim=-1)
                    new_text = self.tokenizer.decode(ids[0, self.prompt_tokens :], skip_special_tokens=False)
                    if new_text.endswith("\ufffd"):  # a multi-byte character is not complete yet
                        piece = ""
                    else:
                        piece, text = new_text[len(text) :], new_text
                    record = self._record(index, prefill, token, piece, wall_ms, fed.shape[-1], layer_ms, fidelity)
                    self.trace.steps.append(record)
                    yield record
                    if self.settings.stop_at_eos and token in self.eos_ids:
                        break
        finally:
            timer.remove()

    def _compile_decode(self, fed: torch.Tensor):
        """Compile the decode forward once, timed apart, on a throw-away step that is then undone."""
        compiled = torch.compile(self.model.forward, dynamic=False)
        started = time.perf_counter()
        self._forward(fed, compiled)
        self.cache.crop(-fed.shape[-1])
        self.trace.compile_ms = (time.perf_counter() - started) * 1000.0
        return compiled

    def _record(self, index, prefill, token, piece, wall_ms, fed_tokens, layer_ms, fidelity) -> StepRecord:
        predicted = self.predictor.after_step(fed_tokens)
        # Without a cache there is nothing to measure, but the layers still take time.
        layers = measure.measure_cache(self.cache, self.seen) or [LayerRecord(0, 0, 0, 0) for _ in layer_ms]
        for layer, ms in zip(layers, layer_ms, strict=False):
            layer.layer_ms = ms
        record = StepRecord(
            index=index,
            phase="prefill" if prefill else "decode",
            token_id=token,
            token=piece,
            wall_ms=wall_ms,
            cache_bytes=sum(layer.total_bytes for layer in layers),
            predicted_cache_bytes=predicted,
            rss_bytes=measure.rss_bytes(),
            strategy=self.choice.name,
            layers=layers,
            cuda_bytes=measure.cuda_bytes(self.model.device),
            position=self.prompt_tokens + index,
        )
        if fidelity is not None:
            record.kl, record.top1_agree, record.ref_logprob, record.reference_ms = fidelity
        return record
