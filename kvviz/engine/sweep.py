"""A sweep: which cache should this model use on this text, at this context, for this many users, in this memory?

Every configuration reads the same text through its own cache as `kvviz eval` reads it (`Evaluation`), and
each prediction is compared with the exact cache's (`fidelity.ReferenceStream`: KL divergence and top-1
agreement), each alone, in chunks where the model allows it (those that evict at every token stepped through each
chunk, `stepped_reading`), else token by token. When a configuration has read the text, a few decode steps are timed
with it alone (its speed as a user would get it, batch 1), one request of the text's length is served through a fresh
cache of it up to the first token (`first_token`: the process's peak memory and the time to first token), and its
memory at the target is derived from its size rule (`target_memory`), checked against the cache measured at the end,
beside that request's peak and time predicted at the target.

Where the user gives questions (`Asked`: tasks kvviz writes, or the user's own), every configuration is asked them
first, in each regime asked (`kvviz.engine.answering`), and its answers are scored beside its perplexity.

Answering questions, configurations share forwards, `rows` at a time (quantized caches too, unless `quantized_alone`:
a batched forward's float rounding may move a value to the neighbouring quantization level, which moves a quantized
configuration's results by about 1 %).
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections.abc import Callable, Iterator

import torch

from kvviz.engine import dequantize_memo, machine
from kvviz.engine.answering import Asking
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.evaluate import Evaluation, prompt_tokens
from kvviz.engine.fidelity import ReferenceStream
from kvviz.engine.first_token import Served, arithmetic, measure_first_token
from kvviz.engine.forward import model_forward
from kvviz.engine.geometry import Geometry
from kvviz.engine.measure import model_bytes
from kvviz.engine.models import LoadedModel
from kvviz.engine.strategies import StrategyChoice, choose, get
from kvviz.engine.target_memory import target_memory
from kvviz.errors import OptionError, failure
from kvviz.files.evaluation import EvalRun, seconds_left
from kvviz.files.first_token import FirstToken
from kvviz.files.frontier import parse_budget, parse_tolerance
from kvviz.files.sweep import BUDGET_COVERS, Asked, Configuration, Question, SpeedRecord, Sweep, SweptSoFar
from kvviz.present import size

# Batched rows per forward answering questions (`answering`). The default model on this 2-core CPU (quiet machine): a
# plain forward of one token costs 28.6 ms for 1 row, 49.3 for 4, 62.5 for 12, 80.1 for 24; with H2O caches over 200
# tokens the rows read 29, 62, 137 and 155 configuration-tokens a second at 1, 4, 12 and 24 rows: more rows still
# pay, a little, up to 24.
ROWS = 24
FRACTIONS = (0.125, 0.25, 0.5)  # of the measured length: the budgets the default grid gives evicting caches
QUANTIZED = (("quanto", 4), ("quanto", 2), ("hqq", 8), ("hqq", 4), ("hqq", 2))
EVICTING = ("h2o", "tova", "snapkv", "knorm")
# the most compressed configurations of a window, a prompt compressor and an evictor at every step read their prompt
# in chunks of this many tokens too: how far a prefill in chunks lowers the peak of serving a request
TWINS, PREFILL_CHUNK = ("sink", "snapkv", "h2o"), 256
DECODE_STEPS = 8  # decode steps timed alone after the text, per configuration (the median is kept)
FLOOR_FORWARDS = 8  # plain batched forwards timed after the text for the compute-bound floor (the median is kept)


def default_grid(model, tokens: int, budgets_of: int | None = None) -> tuple[list[StrategyChoice], list[str]]:
    """The configurations a sweep of `tokens` tokens tries by default, and why others were left out: the exact
    cache; each quantized backend installed at int8, int4 and int2 where it has them; a sliding window, attention
    sinks and each eviction policy keeping an eighth, a quarter and a half of the measured length, or of
    `budgets_of` tokens where given (the questions' length, when questions are asked), but SnapKV, which compresses
    only the text's first half, given as its prompt, never keeping all of it; at an eighth, attention sinks, SnapKV
    and H2O again with their prompt read in chunks (`TWINS`); and at a quarter, the leaders of
    kvpress's leaderboard and its baseline (Expected Attention, alone and AdaKV's, KVzip, random). Those compress the
    first half as their prompt, so each reads the text alone: one budget each keeps a default sweep near its time."""
    specs: list[tuple[str, dict]] = [("dynamic", {})]
    specs += [("quantized", {"backend": backend, "nbits": nbits}) for backend, nbits in QUANTIZED]
    for fraction in FRACTIONS:
        budget = max(8, round(fraction * (budgets_of or tokens)))
        specs += [("sliding", {"window": budget + 1}), ("sink", {"sink_tokens": 4, "window": budget - 4})]
        specs += [(name, {"budget": budget}) for name in EVICTING]
        if fraction == min(FRACTIONS):
            specs += [(name, {**options, "prefill_chunk": PREFILL_CHUNK}) for name, options in specs[-6:]
                      if name in TWINS]
    quarter = max(8, round(0.25 * (budgets_of or tokens)))
    specs += [(name, {"budget": quarter}) for name in ("expected_attention", "kvzip", "random")]
    specs.append(("expected_attention", {"budget": quarter, "adaptive": True}))
    choices, skipped = [], []
    for name, options in specs:
        try:
            choice = choose(name, options)
        except OptionError as exc:
            skipped.append(f"{name} ({', '.join(f'{k}={v}' for k, v in options.items())}): {exc}")
            continue
        ok, reason = get(name).available()
        problem = reason if not ok else get(name).unsupported(model, choice.options)
        try:
            prompt_tokens(choice, tokens)  # SnapKV keeping half the text would keep all its prompt: a full cache
        except OptionError as exc:
            problem = problem or str(exc)
        if problem:
            skipped.append(f"{choice.label()}: {problem}")
        else:
            choices.append(choice)
    return choices, skipped


def ask(model, context: int | None = None, sequences: int = 1, budget: str = "free",
        tolerance: str = "5%", accuracy_tolerance: float = 0.05, budget_covers: str = "cache") -> Question:
    """The user's question, checked: `context` tokens per sequence (None: the model's maximum), `sequences` at once,
    `budget` for what `budget_covers` says, the caches or the whole process ("free": the device's free memory now,
    and for the process the model's own bytes, which it already holds, too), `tolerance`, and where questions are
    asked the accuracy below the exact cache's they accept (a share). Raises OptionError."""
    if budget_covers not in BUDGET_COVERS:
        raise OptionError(f"the budget covers {' or '.join(BUDGET_COVERS)}, not {budget_covers!r}")
    limit = Geometry.of(model.config, model.dtype).context
    if context is None:
        if limit is None:
            raise OptionError("the model's config does not say how many positions it numbers; give the target "
                              "context length")
        context = limit
    if context < 1:
        raise OptionError(f"the target context must be at least 1 token, not {context}")
    if limit is not None and context > limit:
        raise OptionError(f"the target context of {context:,} tokens is more than the {limit:,} positions the model "
                          f"numbers; give at most {limit:,}")
    if sequences < 1:
        raise OptionError(f"the number of sequences must be at least 1, not {sequences}")
    if budget.strip().lower() == "free":
        budget_bytes, said = free_budget(model, budget_covers)
    else:
        budget_bytes, said = parse_budget(budget), budget.strip()
    return Question(context, sequences, budget_bytes, said, parse_tolerance(tolerance), accuracy_tolerance,
                    budget_covers)


def free_budget(model, covers: str) -> tuple[int, str]:
    """A budget of the device's free memory now (and for the process, the model's own bytes too, which it already
    holds): its bytes, and in words."""
    free, where = machine.free_memory(model.device)
    if covers == "process":
        free, where = free + model_bytes(model), f"{where} and the model's own"
    return free, f"{size(free)} ({where})"


def floor_forward_ms(run: CacheRun, token_ids: torch.Tensor, tokens: int, forwards: int) -> list[float] | None:
    """The compute-bound floor of a sweep, timed: `forwards` plain forwards of one token for as many rows as
    `token_ids` ``[rows, 1]`` has, through the model's own attention and a DynamicCache each row of which holds the
    first `tokens` tokens `run`'s cache (the exact cache) holds, cut back to them after each forward. A sweep of n
    tokens through those rows cannot take less than n such forwards over half the text on average, whatever its
    caches do. None where `run`'s cache cannot be cut back (`CacheRun.crop_refusal`), holds fewer tokens, or the
    rows would not fit in the free memory."""
    rows_bytes = token_ids.shape[0] * tokens * run.geometry.kv_bytes_per_token
    if run.crop_refusal() is not None or run.seen < tokens or rows_bytes > machine.free_memory(run.model.device)[0]:
        return None
    floor = run.copy()
    floor.crop(tokens)
    floor.cache.batch_repeat_interleave(token_ids.shape[0])
    positions = torch.full_like(token_ids, tokens)
    times = []
    with torch.inference_mode():
        for _ in range(forwards):
            begun = time.perf_counter()
            model_forward(run.model, token_ids, floor.cache, positions)
            times.append((time.perf_counter() - begun) * 1000.0)
            floor.cache.crop(-1)
    return times


def with_reference(choices: list[StrategyChoice]) -> list[StrategyChoice]:
    """The configurations with the exact cache (dynamic) first, which every other is compared with."""
    rest = [c for c in choices if c != choose("dynamic")]
    return [choose("dynamic"), *rest]


class SweepRun:
    """Run a sweep: iterate to get each `Configuration` as it finishes (in `sweep.configurations`, in the order
    given, from the start: those not yet finished have no records). A configuration that cannot run on this model
    is there at once with its reason. `cancel()` (or the shared `cancel` event) stops after the forward in
    progress; what finished stays."""

    def __init__(self, loaded: LoadedModel, choices: list[StrategyChoice], token_ids: list[int], document: dict,
                 question: Question, cancel: threading.Event | None = None, rows: int = ROWS,
                 quantized_alone: bool = False, floor_forwards: int = FLOOR_FORWARDS, asked: Asked | None = None,
                 first_tokens: bool = True):
        self.loaded = loaded
        self.first_tokens = first_tokens  # serve a request of the text's length through each (`_first_token`)
        self.model = loaded.model
        self.ids = token_ids
        self.question = question
        self.rows = max(1, rows)
        self.quantized_alone = quantized_alone
        self.floor_forwards = floor_forwards
        self._cancel = cancel or threading.Event()
        self.sweep = Sweep(dict(loaded.card), dict(document), question)
        self.evaluations: list[Evaluation | None] = []
        for choice in with_reference(choices):
            try:
                evaluation = Evaluation(loaded, choice, token_ids, document, cancel=self._cancel)
                # the configuration holds the evaluation's own records and comparisons, filled as it reads
                config = Configuration(evaluation.result, evaluation.kl, evaluation.top1)
            except OptionError as exc:
                evaluation = None
                refused = EvalRun(dict(loaded.card), {"name": choice.name, "options": dict(choice.options)},
                                  dict(document), {"mode": "token-by-token", "chunk": 1},
                                  error=failure(f"{choice.label()} in the sweep", exc))
                config = Configuration(refused)
            self.evaluations.append(evaluation)
            self.sweep.configurations.append(config)
        if self.evaluations[0] is None:
            raise OptionError(f"the exact cache cannot read this text: {self.sweep.configurations[0].run.error}")
        self.asking = None if asked is None else Asking(
            loaded, with_reference(choices), asked.items, asked.regimes, asked.raw, self.rows, quantized_alone,
            self._cancel)
        # the items as asked: each needle placed on the tokens the model reads
        self.sweep.asked = None if asked is None else dataclasses.replace(asked, items=self.asking.items)
        self.on_progress: Callable[[], None] = lambda: None  # called after every prediction (`progress` tells how far)
        self.on_answered: Callable[[str, int], None] = lambda regime, item: None  # after each item is asked
        self._kept: set[int] = set()  # configurations an earlier process finished (`resume`): not read again
        self._earlier_s = 0.0  # the time the sweep took in earlier processes
        self._started: float | None = None
        self._forwards = 0  # token-by-token forwards and their time, for the speed figures
        self._forward_ms = 0.0
        self._floor_bytes = 0.0
        self._asking_s: float | None = None
        self._first_token_s = 0.0
        self._speed_at_text = None

    def resume(self, kept: SweptSoFar) -> list[Configuration]:
        """Take up what an earlier process measured (its journal): the configurations it finished stand as they
        were, the items it asked are not asked again. Returns the configurations kept, in the order a sweep finishes
        them. The exact cache reads the text again where any other configuration remains (its predictions, too
        large to journal, are what the others are compared with); a batch of configurations reads again whole, so
        that each row's forwards are the very ones an uninterrupted sweep runs."""
        for i in kept.finished:
            self.sweep.configurations[i] = kept.sweep.configurations[i]
        self._kept = set(kept.finished)
        self._earlier_s = kept.elapsed_s
        if self.asking is not None:
            self.asking.resume([c.answers for c in kept.sweep.configurations], kept.answered)
        return [self.sweep.configurations[i] for i in self.order() if i in self._kept]

    @property
    def elapsed_s(self) -> float:
        """The sweep's time so far, in this process and any it resumes."""
        return self._earlier_s + (time.perf_counter() - self._started if self._started is not None else 0.0)

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def seconds_left(self) -> tuple[float | None, bool]:
        """(seconds, complete) until every configuration has read the text (`evaluation.seconds_left`)."""
        return seconds_left([(e.result, e.predictions) for e in self._to_read()])

    def progress(self) -> tuple[int, int]:
        """(predictions made, predictions in all) over every configuration."""
        live = self._to_read()
        done, total = sum(len(e.result.records) for e in live), sum(e.predictions for e in live)
        if self.asking is not None:  # a question counts as a prediction
            done += sum(len(answers) for answers in self.asking.answers)
            total += self.asking.questions * len(self.asking.choices)
        return done, total

    def _to_read(self) -> list[Evaluation]:
        """The evaluations this process reads (not those refused, nor those an earlier process finished)."""
        return [e for i, e in enumerate(self.evaluations) if e is not None and (i not in self._kept or not i)]

    def order(self) -> list[int]:
        """Indices of the evaluations in the order they read, each alone: the exact cache first, then the others in
        the order given (those that evict at every token step through chunks, `stepped_reading`)."""
        return [i for i, e in enumerate(self.evaluations) if e is not None]

    def __iter__(self) -> Iterator[Configuration]:
        started = self._started = time.perf_counter()
        reference_chunk = self.evaluations[0].chunk
        stream = ReferenceStream(self.model, self.evaluations[0].ids, reference_chunk)
        self.evaluations[0].offers = True  # the exact cache reads the text once, for itself and the stream
        finished = False
        try:
            if self.asking is not None:
                self._ask()
            order = [i for i in self.order() if i not in self._kept]
            if order and order[0] != 0:  # the exact cache, kept, reads the text again: the reference
                order.insert(0, 0)
            for i in order:
                if self.cancelled:
                    break
                e = self.evaluations[i]
                e.reference = stream
                self._read(e)
                if i == 0 and 0 in self._kept:
                    continue
                config = self.sweep.configurations[i]
                if not self.cancelled and not e.result.error:
                    config.decode_ms = self._decode_ms(e)
                    config.first_token = self._first_token(e)
                served = None if config.first_token is None else Served(config.first_token, self._arithmetic())
                config.target = target_memory(self.model, e.run.choice, self.question, reference_chunk,
                                              len(e.result.records) or None, served)
                yield config
            finished = not self.cancelled
        except BaseException:  # Ctrl-C or SIGTERM (a KeyboardInterrupt) or a failure of kvviz's own: stop here
            self._cancel.set()
            raise
        finally:
            wall_s = time.perf_counter() - started
            self._settle()
            self.sweep.speed = self._speed(wall_s, None)
            if finished:
                self.sweep.speed = self._speed(wall_s, self._floor())

    def _ask(self) -> None:
        """Ask every configuration the questions (`Asking`), before the text is read: each configuration's row is
        shown when it has read the text, with its answers."""
        begun = time.perf_counter()
        for i, (config, answers) in enumerate(zip(self.sweep.configurations, self.asking.answers, strict=True)):
            if i not in self._kept:
                config.answers = answers  # filled as the questions are answered: a stop keeps what was
        self.asking.on_progress = self.on_progress
        try:
            for regime, item in self.asking:
                self.on_answered(regime, item)
                self.on_progress()
        finally:
            self._asking_s = time.perf_counter() - begun

    def _settle(self) -> None:
        """After the sweep's end or its stop: each configuration holds as many comparisons as predictions (a stop
        may fall between the two), and one that did not read the whole text says it was cancelled."""
        self.sweep.cancelled = self.cancelled
        for e in self.evaluations:
            if e is None:
                continue
            kept = min(len(e.result.records), len(e.kl))
            del e.result.records[kept:], e.kl[kept:], e.top1[kept:]
            if kept < e.predictions and not e.result.error:
                e.result.cancelled = True

    def _read(self, e: Evaluation) -> None:
        """Read the text through one configuration's cache (a quantized cache dequantized once per quantization:
        `dequantize_memo`)."""
        with dequantize_memo.memoized():
            try:
                for _ in e:
                    self.on_progress()
            except Exception as exc:  # noqa: BLE001 - this configuration's own failure, reported in its row
                e.result.error = failure(f"{e.result.label()} in the sweep", exc)
        if e.started and not e.result.error and len(e.result.records) < e.predictions:
            e.result.cancelled = True
        self._count(e)

    def _count(self, e: Evaluation) -> None:
        """Add a token-by-token reading's forwards (not its prompt's) to the speed figures: its memory-bound floor
        reads every weight and the cache once per forward."""
        if e.chunk != 1:
            return
        fed = e.result.records[e.prompt :]
        self._forwards += len(fed)
        self._forward_ms += sum(r.wall_ms for r in fed)
        weights = self.loaded.card.get("weight_bytes") or 0
        self._floor_bytes += len(fed) * weights + sum(r.cache_bytes or 0 for r in fed)

    def _floor(self) -> tuple[int, float] | None:
        """The rows of the configurations that do not keep every token exactly (every one but the exact cache's kind),
        which read the text token by token were it not for `Strategy.feed_span`, and the median time of a forward of
        the compute-bound floor for them (`floor_forward_ms`, over half the text); None where not measured."""
        rows = sum(1 for i, e in enumerate(self.evaluations) if i and e is not None and not e.run.strategy.exact
                   and (e.finished or i in self._kept))
        if not rows or not self.floor_forwards:
            return None
        exact = self.evaluations[0]
        tokens = exact.ids.shape[-1] // 2
        times = floor_forward_ms(exact.run, exact.ids[:, tokens : tokens + 1].expand(rows, 1), tokens,
                                 self.floor_forwards)
        return (rows, statistics.median(times)) if times else None

    def _first_token(self, e: Evaluation) -> FirstToken | None:
        """One request of the text's length served through a fresh cache of this configuration up to its first token
        (`first_token`): the process's peak and the time to first token; None where not asked for, or where serving
        it failed (said in kvviz's log)."""
        if not self.first_tokens:
            return None
        begun = time.perf_counter()
        try:
            return measure_first_token(self.loaded, e.run.choice, self.ids)
        except Exception as exc:  # noqa: BLE001 - its peak and time stay unknown; its reading stands
            failure(f"serving a request through {e.result.label()}", exc)
            return None
        finally:
            self._first_token_s += time.perf_counter() - begun

    def _arithmetic(self):
        """This machine's arithmetic speed at the text's length (once per sweep): how times to first token scale."""
        if self._speed_at_text is None:
            self._speed_at_text = arithmetic(self.model, len(self.ids))
        return self._speed_at_text

    def _decode_ms(self, e: Evaluation) -> float | None:
        """The median time of a decode step with this configuration's cache alone, right after the text; None where
        the model numbers no more positions."""
        context = Geometry.of(self.model.config, self.model.dtype).context
        if context is not None and e.run.position + DECODE_STEPS > context:
            return None
        token = e.ids[:, -1:]
        times = []
        with torch.inference_mode():
            for _ in range(DECODE_STEPS):
                begun = time.perf_counter()
                e.run.forward(token)
                times.append((time.perf_counter() - begun) * 1000.0)
        return statistics.median(times)

    def _speed(self, wall_s: float, floor: tuple[int, float] | None) -> SpeedRecord:
        bandwidth = machine.memory_bandwidth(self.model.device)
        speed = SpeedRecord(wall_s=self._earlier_s + wall_s, bandwidth_bytes_per_s=bandwidth,
                            answering_s=self._asking_s, first_token_s=self._first_token_s or None)
        if floor is not None:
            speed.floor_rows = floor[0]
            speed.floor_s = floor[1] * self.evaluations[0].predictions / 1000.0
        if self._forwards:
            seconds = self._forward_ms / 1000.0
            floor_s = self._floor_bytes / bandwidth if bandwidth else None
            speed.rows_per_forward = 1.0  # each reads alone
            speed.forwards_per_s = self._forwards / seconds if seconds else None
            speed.memory_bound_share = floor_s / seconds if floor_s and seconds else None
        return speed
