"""Teacher-forced evaluation: how well a model reads a document through one strategy's cache.

StreamingLLM's evaluation (Xiao et al., 2023): the document goes through the strategy's cache one
token at a time (`CacheRun`), so every token is predicted from what the cache holds at that moment,
with eviction, quantization and re-rotation all acting. Each prediction becomes a `TokenRecord`: the
negative log-likelihood of the true next token (natural log, from a float32 log-softmax), the cache's
measured and predicted bytes, the tokens it holds, and the time it took.

A strategy that evicts only from a prompt (`Strategy.compresses_prompt`: SnapKV) would never evict fed one
token at a time, so it reads the document's first half as its prompt, in one forward (those predictions are a
full cache's, and the prompt is then compressed as on a real one), and the second half token by token from what
it kept; a document whose first half fits its budget is refused, since it would never compress.

A strategy whose predictions equal the full cache's (`Strategy.exact`: it keeps every token in full
precision) is fed `CHUNK` tokens per forward instead, each forward scoring all of them; the NLL is
the same to within 1e-3 nats (tested), and the cache is then measured once per chunk. So is one whose cache only
appends between two changes of what it holds, in forwards that end at the next change at the latest
(`Strategy.feed_span`: a quantized cache between re-quantizations, SnapKV after its prompt), and one whose tokens
fed together can each be made to attend to what it would alone (`Strategy.streamed`: a sliding window's mask,
attention sinks' mask and turned queries); each is tested against its own token-by-token reading. The other
strategies, which change what they hold at every token, read chunks stepped through a token at a time in every
attention layer (`stepped_reading`): the weights are read once per chunk, and each token attends to exactly what it
would fed alone (tested against their token-by-token reading). Fed token by token instead (`stepped` False, or a model
that cannot be stepped), several can read the document together (`evaluate_many.evaluate_all(..., together=True)`):
one batch row each, every forward feeding one token to all of their caches (`cache_rows`), which shares the reading of
the weights that bounds a token-by-token forward; each row's NLL is the same as alone (tested).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator

import torch

from kvviz.engine import cache_rows
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.fidelity import ReferenceStream, divergence
from kvviz.engine.geometry import Geometry
from kvviz.engine.models import LoadedModel
from kvviz.engine.own_caches import feed_refusal
from kvviz.engine.strategies import StrategyChoice, capacity_for, get
from kvviz.errors import OptionError
from kvviz.files.documents import Document
from kvviz.files.evaluation import EvalRun, Journaled, TokenRecord, token_count_problem
from kvviz.files.journal import digest

CHUNK = 128  # the most tokens per forward of a strategy read in chunks (`Strategy.feed_span`)
MAX_TOKENS = 10**7  # a document this long is cut here even for strategies that stream past the context
CHARS_PER_TOKEN = 32  # more than any token of a BPE vocabulary spans: a prefix this long holds enough tokens


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of a document as the model reads raw text (special tokens only where the tokenizer adds them)."""
    return list(tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"])


def tokenize(tokenizer, text: str, limit: int | None = None) -> tuple[list[int], bool]:
    """The document's first `limit` tokens (all if None), and whether it had more.

    A long document is tokenized only as far as needed: a prefix, less its last token (the prefix
    may end inside a word), when that prefix already gives `limit` tokens.
    """
    if limit is not None and len(text) > (limit + 1) * CHARS_PER_TOKEN:
        ids = encode(tokenizer, text[: (limit + 1) * CHARS_PER_TOKEN])[:-1]
        if len(ids) >= limit:
            return ids[:limit], True
    ids = encode(tokenizer, text)
    if limit is not None and len(ids) > limit:
        return ids[:limit], True
    return ids, False


def context_length(model) -> int | None:
    """The positions the model was built for (None when its config does not say)."""
    return Geometry.of(model.config, model.dtype).context


def usable_tokens(model, choices: list[StrategyChoice], available: int) -> int:
    """The most of `available` document tokens that every strategy can number within the model's context.

    Most strategies number every token, so that is the context; a strategy that renumbers what it
    keeps (attention sinks) streams past it, so a document evaluated only by such strategies is not cut.
    """
    context = context_length(model)

    def fits(n: int) -> bool:
        return context is None or all(get(c.name).positions_needed(c.options, n) <= context for c in choices)

    if fits(available):
        return available
    low, high = 0, available  # fits(low), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def prompt_tokens(choice: StrategyChoice, tokens: int) -> int:
    """The document tokens an evaluation of `tokens` tokens feeds `choice` in one forward, as its prompt: the first
    half for a strategy that evicts only from a prompt, else none. Raises OptionError if that prompt would fit the
    strategy's cache (it would never evict: a full cache's evaluation under its name)."""
    strategy = get(choice.name)
    if not strategy.compresses_prompt:
        return 0
    prompt = tokens // 2
    capacity = strategy.prompt_capacity(choice.options)
    if not strategy.prompt_overflows(choice.options, prompt):
        raise OptionError(
            f"{choice.label()} evicts only from a prompt longer than the {capacity:,} tokens it keeps, and an "
            f"evaluation gives it the document's first half as its prompt ({prompt:,} of {tokens:,} tokens), so it "
            f"would never evict; evaluate at least {2 * (capacity + 1):,} tokens, or keep fewer than {prompt:,}"
        )
    return prompt


def feed_sizes(tokens: int, span: Callable[[int], int], prompt: int = 0) -> Iterator[int]:
    """The tokens each forward feeds when an evaluation reads `tokens` tokens: `prompt` first if there is one, then
    `span(fed)` at a time once `fed` are fed (`Strategy.feed_span`; the size rules of `kvviz.engine.target_memory`
    replay the same)."""
    fed = 0
    while fed < tokens:
        size = min(prompt if fed == 0 and prompt else span(fed), tokens - fed)
        yield size
        fed += size


def encoder_decoder_problem(model) -> str | None:
    """Why this model cannot read a document token by token, or None: an encoder-decoder has no such reading."""
    if not model.config.is_encoder_decoder:
        return None
    return (f"{type(model).__name__} is an encoder-decoder: it reads its input whole with the encoder and writes a new "
            "text with the decoder, so it does not predict a document token by token; evaluate a decoder-only model, "
            "or watch this one's cache with kvviz run")


def prepare(loaded: LoadedModel, document: Document, choices: list[StrategyChoice],
            tokens: int | None = None) -> tuple[list[int], dict, str | None]:
    """The token ids to evaluate, the document's record for the files, and a notice for the user (or None).

    The document is cut at `tokens` if given, and at what the strategies can number within the
    model's context (`usable_tokens`). Raises OptionError for a `tokens` below two or a document of
    fewer than two tokens (nothing to predict).
    """
    problem = token_count_problem(tokens) or encoder_decoder_problem(loaded.model)
    if problem:
        raise OptionError(problem)
    usable = usable_tokens(loaded.model, choices, MAX_TOKENS)
    limit = usable if tokens is None else min(tokens, usable)
    ids, cut = tokenize(loaded.tokenizer, document.text, limit)
    if len(ids) < 2:
        raise OptionError(f"the document {document.name} has {len(ids)} token(s); it needs at least 2 to predict one")
    notice = None
    if tokens is not None and len(ids) < min(tokens, usable):
        notice = f"the document has {len(ids):,} tokens, fewer than the {tokens:,} asked for: evaluating all of them"
    elif cut and limit < (tokens or MAX_TOKENS):
        notice = (f"the document is longer than the model's context of {context_length(loaded.model):,} tokens: "
                  f"evaluating its first {len(ids):,} tokens")
    record = document.describe()
    record.update(tokens=len(ids), first_token_id=ids[0], cut=notice)
    return ids, record, notice


class Evaluation:
    """One strategy over one document's tokens: iterate to get a `TokenRecord` per prediction.

    Raises `OptionError` at construction if the strategy cannot run on this model or number that many
    tokens within its context (`prepare` cuts documents to fit). `cancel` (shared
    between evaluations, so that one Stop stops all) is checked between forwards; what was measured
    stays in `result`.
    """

    def __init__(self, loaded: LoadedModel, choice: StrategyChoice, token_ids: list[int], document: dict,
                 cancel: threading.Event | None = None, chunk: int = CHUNK, stepped: bool = True):
        """`reference` may be set before the first forward (a `ReferenceStream` over the same tokens): each prediction
        is then also compared with the exact cache's, in `kl` and `top1` (`fidelity.divergence`). `stepped` False: a
        cache that changes what it holds between two tokens is fed one token per forward (a user's decode's own
        forwards; several such share forwards, `evaluate_many`) instead of stepped through chunks."""
        if len(token_ids) < 2:
            raise OptionError("an evaluation needs at least 2 tokens: one fed, one predicted")
        problem = encoder_decoder_problem(loaded.model)
        if problem:
            raise OptionError(problem)
        usable = usable_tokens(loaded.model, [choice], len(token_ids))
        if usable < len(token_ids):
            raise OptionError(f"{choice.label()} can read at most {usable:,} tokens within the model's context of "
                              f"{context_length(loaded.model):,}, not {len(token_ids):,}; cut the document first")
        self.model = loaded.model
        self.ids = torch.tensor([token_ids], device=self.model.device)
        self.run = CacheRun(self.model, choice, capacity_for(choice, len(token_ids)), tokenizer=loaded.tokenizer)
        self.run.check_memory()
        # a cache that may take many tokens per forward once it holds one (`Strategy.feed_span`) reads in chunks of
        # up to `chunk`, and one that changes what it holds between two tokens steps through each chunk where it does
        # (`Strategy.steps`, `stepped_reading`), unless the model reads many tokens as a new prompt or cannot take
        # the mask or the attention function they need; fed token by token otherwise
        strategy = self.run.strategy
        takes_many = not feed_refusal(self.model)
        own_attention = cache_rows.unsupported(self.model) is None  # takes kvviz's masks and attention functions
        steps = self.run.cache is not None and strategy.steps(choice.options)
        many = (not steps and takes_many and strategy.feed_span(choice.options, 1, 2) > 1
                and (own_attention or not strategy.masks_feeds))
        self.stepped = stepped and steps and takes_many and own_attention
        self.chunk = max(1, chunk) if many or self.stepped else 1
        self.prompt = prompt_tokens(choice, len(token_ids))
        self._cancel = cancel or threading.Event()
        self.started = False
        self.replay = 0  # document tokens fed again, unscored, to rebuild the cache of a resumed evaluation
        self.reference: ReferenceStream | None = None
        self.offers = False  # True: this is the exact cache the reference stands for, and hands it what it reads
        self.kl: list[float] = []
        self.top1: list[bool] = []
        method = {"mode": "token-by-token" if self.chunk == 1 else "chunked", "chunk": self.chunk}
        if self.prompt:
            method["prompt"] = self.prompt
        self.result = EvalRun(
            model=dict(loaded.card),
            strategy={"name": choice.name, "options": dict(choice.options)},
            document=dict(document),
            method=method,
        )

    def cancel(self) -> None:
        """Stop after the forward in progress (and stop every evaluation sharing the event)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def predictions(self) -> int:
        return self.ids.shape[-1] - 1

    @property
    def finished(self) -> bool:
        """Started and over: every token predicted, failed or cancelled."""
        result = self.result
        return self.started and (len(result.records) >= self.predictions or bool(result.error) or result.cancelled)

    def batchable(self) -> bool:
        """Whether this evaluation can share forwards with others (`feed_together`) and predict as it would
        alone: token by token (after its prompt, which it reads alone), through a cache that does not quantize (a
        batched forward's float rounding may move a value to the neighbouring level), on a model that allows it."""
        return (self.chunk == 1 and self.run.cache is not None and not self.run.strategy.quantizes
                and cache_rows.unsupported(self.model) is None)

    def resume(self, kept: EvalRun, ended: bool) -> str:
        """Take up what an earlier process measured (`kept`, from its journal; `ended`: the strategy was over
        there). Returns what was done, in words: kept as it was (ended); continued from the last whole forward
        (a strategy read in chunks: the forwards before it are fed again, in the same chunks and
        unscored, which rebuilds the very same cache, so every later prediction is the one an uninterrupted run
        makes); or started again from the first token (a cache read token by token, which evicts or quantizes, whose
        state its measurements do not hold)."""
        label = self.result.label()
        if ended:
            self.result = kept
            self.started = True
            return f"{label}: kept as measured ({kept.status}, {len(kept.records):,} tokens)"
        done = 0
        if self.chunk > 1 and kept.method == self.result.method:
            done = max((end for _, end in self.feeds() if end <= len(kept.records)), default=0)
        if not done:
            return (f"{label}: starts again from the first token ({len(kept.records):,} measured before; a cache that "
                    "evicts or quantizes cannot be rebuilt from its measurements)")
        self.result.records = kept.records[:done]
        self.replay = done
        return (f"{label}: continues after token {done:,} of {self.predictions:,} (its cache rebuilt by feeding those "
                "again)")

    def start(self) -> None:
        self.started = True
        self.run.warm_up(lambda message: None, self._cancel)  # kernel builds before the first token, not in its time

    def feeds(self) -> Iterator[tuple[int, int]]:
        """The [start, end) of the document tokens each forward feeds (`feed_sizes`)."""
        start = 0
        for size in feed_sizes(self.predictions, self.span, self.prompt):
            yield start, start + size
            start += size

    def span(self, fed: int) -> int:
        """The most tokens the next forward may feed once `fed` are fed (`Strategy.feed_span`, up to `chunk`)."""
        if self.chunk == 1:
            return 1
        span = self.run.strategy.feed_span(self.run.choice.options, fed, self.chunk)
        return self.chunk if span == 1 and self.stepped else span

    def __iter__(self) -> Iterator[TokenRecord]:
        self.start()
        with self.run.strategy.reading(self.run.cache):
            for start, end in self.feeds():
                if self._cancel.is_set():
                    self.result.cancelled = True
                    return
                yield from self.read(start, end)

    def read(self, start: int, end: int) -> list[TokenRecord]:
        """Feed the document tokens [start, end) in one forward, alone, and record their predictions (none where
        they were measured before, `resume`: then only the cache is rebuilt)."""
        if end <= self.replay:
            if self.run.cache is not None:
                self._feed(start, end, scored=False)
            return []
        started = time.perf_counter()
        logits = self._feed(start, end, scored=True)
        self.note_eviction(end)
        return self.take(start, logits, (time.perf_counter() - started) * 1000.0 / (end - start))

    def _feed(self, start: int, end: int, scored: bool) -> torch.Tensor:
        """Feed the document tokens [start, end) (in `Strategy.feed_forwards`), each attending to what it would fed
        alone; the logits of each ``[n, vocab]`` (`scored`), else of the last forward's last."""
        with torch.inference_mode():
            if self.run.cache is None:  # every forward feeds the whole text so far
                return self.run.forward(self.ids[:, :end], logits_to_keep=end - start if scored else 1)[0]
            if start < self.prompt:  # the prompt, read as a prefill (in chunks where the strategy's prefill_chunk says)
                return self.run.prefill(self.ids[:, start:end], logits_to_keep=0 if scored else 1)[0]
            logits = []
            for size in self.run.strategy.feed_forwards(end - start):
                fed = self.ids[:, start : start + size]
                logits.append(self.run.forward(fed, logits_to_keep=size if scored else 1, streamed=True)[0])
                start += size
        return torch.cat(logits) if scored else logits[-1]

    def note_eviction(self, predicted: int) -> None:
        """Once the predictions before position `predicted` are made (or being made): mark where the cache first
        evicted, if one of them was made from a cache holding fewer tokens than it was fed (`CacheRun.evicted_at`)."""
        at = self.run.evicted_at
        if self.result.first_eviction is None and at is not None and at < predicted:
            self.result.first_eviction = at

    def take(self, start: int, logits: torch.Tensor, wall_ms: float) -> list[TokenRecord]:
        """Record the predictions of the tokens fed from `start`, given their logits ``[n, vocab]`` and the time
        per prediction, with the cache measured as the forward left it. Raises if a prediction is not finite."""
        with torch.inference_mode():
            logprobs = torch.log_softmax(logits.float(), dim=-1)  # read by the NLL and the comparison alike
        nll = self._nll(logprobs, start)
        if self.reference is not None:
            if self.offers:
                self.reference.offer(start, logprobs)
            kl, agree = divergence(self.reference.logprobs(start, logits.shape[0]), logprobs)
            self.kl += kl
            self.top1 += agree
        return self._record(start, nll, wall_ms)

    def _nll(self, logprobs: torch.Tensor, start: int) -> list[float]:
        """The NLL of the successors of the tokens fed from `start`, given their log-probabilities ``[n, vocab]``."""
        with torch.inference_mode():
            targets = self.ids[0, start + 1 : start + 1 + logprobs.shape[0]]
            nll = (-logprobs.gather(-1, targets[:, None])[:, 0]).tolist()
        bad = next((i for i, v in enumerate(nll) if not math.isfinite(v)), None)
        if bad is not None:
            raise FloatingPointError(
                f"the prediction of the token at position {start + bad + 1} is not a finite number (the model's "
                "logits hold NaN or infinity); the predictions before it are kept"
            )
        return nll

    def _record(self, start: int, nll: list[float], wall_ms: float) -> list[TokenRecord]:
        """Records for the predictions from `start`, the cache measured after the last (each forward's end)."""
        layers = self.run.measure(slots=False)  # sizes only: an evaluation shows no cache map
        end = start + len(nll)
        records = []
        for position, value in zip(range(start, end), nll, strict=True):
            last = position == end - 1
            record = TokenRecord(
                position=position,
                token_id=int(self.ids[0, position + 1]),
                nll=value,
                cache_bytes=sum(layer.total_bytes for layer in layers) if last else None,
                predicted_cache_bytes=self.run.predicted_bytes if last else None,
                tokens_held=max((layer.seq_len for layer in layers), default=0) if last else None,
                wall_ms=wall_ms,
                policy_bytes=self.run.policy_bytes() if last else None,
            )
            records.append(record)
        self.result.records.extend(records)
        return records


def take_up(evaluation: Evaluation, found: Journaled) -> str:
    """Continue in `evaluation` what a journal a killed or stopped evaluation left holds (`Evaluation.resume`, as
    `kvviz eval --resume` does), after checking it read the same tokens with the same model and strategy; returns
    what was done, in words. Raises OptionError naming each difference."""
    kept, ours = found.run, evaluation.result
    ids = evaluation.ids[0].tolist()
    differing = []
    if kept.model != ours.model:
        differing.append(f"the model ({kept.model.get('name', '?')} there, {ours.model.get('name')} here, or its "
                         "dtype or device)")
    if kept.strategy != ours.strategy:
        differing.append(f"the strategy ({kept.label()} there, {ours.label()} here)")
    digest_there = found.resume.get("tokens_sha256")
    if kept.document.get("tokens") != len(ids) or kept.document.get("first_token_id") != ids[0] \
            or (digest_there is not None and digest_there != digest(ids)):
        differing.append("the document's tokens (another text, or another part of it)")
    if differing:
        raise OptionError("the journal was measured otherwise, so its numbers would not continue: "
                          + "; ".join(differing))
    return evaluation.resume(kept, found.ended in ("finished", "error"))
