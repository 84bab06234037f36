"""Does the cache still answer? Each configuration is asked every item's questions in the regimes the field names;
its answers are written greedily and scored (`kvviz.files.scoring`).

The regimes (`qa.REGIMES`):

- query-agnostic, kvpress's default: the context is prefilled in one forward (a chunk per forward where the
  configuration says prefill_chunk, each chunk compressed) and compressed before any question is seen. The policy
  then stops (`CacheRun.stop_evicting`): a cache that evicts becomes a plain dynamic cache of what it kept, at the
  positions it kept them, so the question is not compressed; the question with its answer prefix, then the answer,
  are fed on it, positions continuing. Each question of an item is asked on its own copy of the compressed context,
  as kvpress asks several questions of one context.
- query-aware, kvpress's `compress_questions`: the context and the question (to the end of its answer prefix) are
  prefilled together and compressed; the policy then stops, as above.
- decode-time, `kvviz eval`'s reading: the context and the question are fed one token at a time, the policy acting
  at each, and on while the answer is written. A cache that evicts only from a prompt (SnapKV) is given the
  context's first half as its prompt, as `kvviz eval` gives it; a cache that keeps every token exactly reads all of
  it in one forward (the same predictions).
- multi-turn, SCBench's: the context is prefilled and compressed, then the questions are asked one after another
  on that one cache, each answer written on it and kept (the model's own, not a reference: SCBench's mode without
  golden answers), the policy acting all along.

Work is shared where the result is the same: a prefill from empty is read once for every cache that can
(`shared_prefill`), the configurations write their answers together, one batch row each (`cache_rows`), and a
decode-time reading feeds each token to all of them in one forward; a quantized cache is dequantized once per
quantization (`dequantize_memo`). An answer ends at the end-of-sequence token,
at its token limit, or, outside the multi-turn regime, as soon as it holds every reference (its score cannot change
after that; what it had written is the answer shown).

When each question comes, kvviz measures whether the cache still holds its needles: the layer-heads (attention
layers x KV heads) holding every token of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from kvviz.engine import cache_rows, dequantize_memo
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.geometry import Geometry
from kvviz.engine.models import LoadedModel
from kvviz.engine.own_caches import feed_refusal
from kvviz.engine.qa_prompt import Rendering
from kvviz.engine.shared_prefill import prefill_together, unshared
from kvviz.engine.strategies import StrategyChoice, capacity_for, get
from kvviz.errors import OptionError, failure
from kvviz.files.qa import REGIMES, AnswerRecord, QAItem, chosen
from kvviz.files.scoring import clean, score
from kvviz.files.trace import heads_holding

ROWS = 24  # answers written per batched forward (as the sweep's rows)


class Stopped(Exception):
    """Raised inside an item's reading when the asking was cancelled: the item is left unanswered."""


def regime_names(text: str) -> list[str]:
    """`--regime NAME[,NAME]`, checked; raises OptionError naming the regimes."""
    return chosen(text, REGIMES, "regime")


@dataclass
class Written:
    """One configuration's answer as it is written: its tokens, whether it is over, and the token it picked last
    and has not fed (the next turn of a conversation feeds it first)."""

    logits: torch.Tensor  # ``[vocab]``: what the next token is picked from
    tokens: list[int]
    done: bool = False
    unfed: int | None = None


class Asking:
    """Ask every configuration (`choices`) every item's questions in each regime. Iterate to get (regime, item
    index) as each item is done; the records are in `answers`, one list per configuration. A configuration that
    cannot run here, or fails, has records with its error and no score; the others go on. `cancel()` (or the shared
    `cancel` event) stops between forwards."""

    def __init__(self, loaded: LoadedModel, choices: list[StrategyChoice], items: list[QAItem], regimes: list[str],
                 raw: bool, rows: int = ROWS, quantized_alone: bool = False, cancel: threading.Event | None = None):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.choices = choices
        self.rendering = Rendering(self.tokenizer, raw)
        self.items = [self.rendering.placed(item) for item in items]
        self.regimes = regimes
        self.rows = max(1, rows)
        self.quantized_alone = quantized_alone
        self._cancel = cancel or threading.Event()
        self.answers: list[list[AnswerRecord]] = [[] for _ in choices]
        self.seconds = dict.fromkeys(regimes, 0.0)  # time spent in each regime
        self.forwards = 0  # forwards run (shared and batched ones count once)
        self.on_progress: Callable[[], None] = lambda: None  # called after each forward of a decode-time reading
        # called as each answer begins, the question fed: (regime, item index, question index, runs by configuration)
        self.on_answering: Callable[[str, int, int, dict[int, CacheRun]], None] = lambda *args: None
        eos = self.model.generation_config.eos_token_id
        eos = self.tokenizer.eos_token_id if eos is None else eos
        self.eos = set(eos) if isinstance(eos, (list, tuple)) else {eos} - {None}
        self._batched = cache_rows.unsupported(self.model) is None
        self._context = Geometry.of(self.model.config, self.model.dtype).context
        self._read: list[list[int]] = []  # each item's context, as tokens
        self._at = (0, regimes[0] if regimes else "")  # the item and regime being asked
        self.done: set[tuple[str, int]] = set()  # (regime, item index) answered before (`resume`): not asked again

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def questions(self) -> int:
        """Questions each configuration is asked in all."""
        return len(self.regimes) * sum(len(item.turns) for item in self.items)

    def resume(self, answers: list[list[AnswerRecord]], done: list[tuple[str, int]]) -> None:
        """Take up the answers an earlier process gave (per configuration, in the order asked) to the items `done`
        ((regime, item index)): those items are not asked again, and the answers stand in the order asking them
        here would have given."""
        self.answers = [list(given) for given in answers]
        self.done = set(done)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        self._read = [self.rendering.context(item) for item in self.items]
        steps = {"query-agnostic": self._agnostic, "query-aware": self._aware, "decode-time": self._decode_time,
                 "multi-turn": self._multi_turn}
        for regime in self.regimes:
            for index, item in enumerate(self.items):
                if self.cancelled:
                    return
                if (regime, index) in self.done:
                    continue
                self._at = (index, regime)
                started = time.perf_counter()
                try:
                    with torch.inference_mode(), dequantize_memo.memoized():
                        steps[regime](index, item)
                except Stopped:
                    return
                finally:
                    self.seconds[regime] += time.perf_counter() - started
                yield regime, index

    # -- the regimes ---------------------------------------------------------------------------------------------

    def _agnostic(self, index: int, item: QAItem) -> None:
        runs = self._fresh(item)
        self._read_context(runs, index, "query-agnostic")
        for turn, asked in self._copies(runs, index, "query-agnostic"):
            self._ask(index, item, turn, "query-agnostic", asked, self.rendering.question(item, turn), True)

    def _aware(self, index: int, item: QAItem) -> None:
        for turn in range(len(item.turns)):
            runs = self._fresh(item)
            logits = self._prefill(runs, self._read[index] + self.rendering.question(item, turn))
            self._freeze(runs)
            self._answer(index, item, turn, "query-aware", runs, logits, True)

    def _decode_time(self, index: int, item: QAItem) -> None:
        runs = self._fresh(item)
        self._read_context(runs, index, "decode-time")
        for turn, asked in self._copies(runs, index, "decode-time"):
            logits = self._token_by_token(asked, self.rendering.question(item, turn), 0)
            self._answer(index, item, turn, "decode-time", asked, logits, True)

    def _read_context(self, runs: dict[int, CacheRun], index: int, regime: str) -> None:
        """The item's context read as `regime` reads it before a question: prefilled and compressed, the policy
        then stopped (query-agnostic), or one token at a time (decode-time)."""
        context = self._read[index]
        if regime == "decode-time":
            self._token_by_token(runs, context, len(context) // 2)
        else:
            self._prefill(runs, context)
            self._freeze(runs)

    def _copies(self, runs: dict[int, CacheRun], index: int, regime: str) -> Iterator[tuple[int, dict[int, CacheRun]]]:
        """Each question's own copy of the runs, which have read the context (the last question takes the runs
        themselves). A cache that cannot be copied (optimum-quanto's packed tensors refuse a deep copy) reads the
        context again; a configuration that failed on one question is asked no more."""
        turns = len(self.items[index].turns)
        for turn in range(turns):
            asked = dict(runs) if turn == turns - 1 else {}
            for i, run in runs.items():
                if i in asked:
                    continue
                try:
                    asked[i] = run.copy()
                except Exception:  # noqa: BLE001 - read again instead
                    again = {i: self._run(run.choice, run.capacity)}
                    self._read_context(again, index, regime)
                    asked.update(again)
            yield turn, asked
            for i in set(runs) - set(asked):
                del runs[i]

    def _multi_turn(self, index: int, item: QAItem) -> None:
        runs = self._fresh(item)
        self._prefill(runs, self._read[index])
        unfed: dict[int, int | None] = dict.fromkeys(runs)
        for turn in range(len(item.turns)):
            question = self.rendering.question(item, turn, follows_answer=turn > 0)
            written = self._ask(index, item, turn, "multi-turn", runs, question, False, unfed)
            unfed = {i: w.unfed for i, w in written.items()}

    # -- feeding -------------------------------------------------------------------------------------------------

    def _fresh(self, item: QAItem) -> dict[int, CacheRun]:
        """A new run per configuration that can read this item (by configuration index); the others' questions are
        recorded with the reason."""
        total = self.rendering.tokens(item)
        runs = {}
        for i, choice in enumerate(self.choices):
            try:
                needed = get(choice.name).positions_needed(choice.options, total)
                if self._context and needed > self._context:
                    raise OptionError(f"the item takes {needed:,} positions, more than the model's context of "
                                      f"{self._context:,}")
                runs[i] = self._run(choice, capacity_for(choice, total))
                runs[i].warm_up(lambda message: None, self._cancel)
            except Exception as exc:  # noqa: BLE001 - this configuration cannot answer; the others go on
                self._refuse(i, exc)
        return runs

    def _run(self, choice: StrategyChoice, capacity: int) -> CacheRun:
        return CacheRun(self.model, choice, capacity, tokenizer=self.tokenizer)  # KVzip writes its own text to read

    def _refuse(self, i: int, exc: Exception) -> None:
        """Record configuration i's failure for the questions of the item being asked that it has not answered in
        the regime being asked."""
        index, regime = self._at
        item = self.items[index]
        said = failure(f"{self.choices[i].label()} answering {item.name} ({regime})", exc)
        answered = {r.turn for r in self.answers[i] if r.item == index and r.regime == regime}
        self.answers[i] += [AnswerRecord(index, turn, regime, "", None, 0, 0, None, None, None, said)
                            for turn in range(len(item.turns)) if turn not in answered]

    def _prefill(self, runs: dict[int, CacheRun], ids: list[int]) -> dict[int, torch.Tensor]:
        """Feed `ids` to every run from empty: one shared forward for those that can share it, the rest alone;
        returns each run's logits of the last position. A run that fails leaves `runs`."""
        tensor = torch.tensor([ids], device=self.model.device)
        together = [i for i, run in runs.items() if unshared(run) is None]
        logits: dict[int, torch.Tensor] = {}
        if len(together) > 1:
            try:
                shared, failures = prefill_together([runs[i] for i in together], tensor)
                self.forwards += 1
                for k, i in enumerate(together):
                    if k in failures:
                        self._drop(runs, i, failures[k])
                    else:
                        logits[i] = shared
            except Exception:  # noqa: BLE001 - a policy failed inside the shared attention: read each alone instead
                for i in together:
                    runs[i] = self._run(runs[i].choice, runs[i].capacity)
        for i in [i for i in runs if i not in logits]:
            try:
                logits[i] = runs[i].prefill(tensor)[0, -1]
                self.forwards += 1
            except Exception as exc:  # noqa: BLE001 - this configuration's own failure
                self._drop(runs, i, exc)
        return logits

    def _drop(self, runs: dict[int, CacheRun], i: int, exc: Exception) -> None:
        """Configuration i failed: it leaves `runs`, its questions recorded with the reason."""
        del runs[i]
        self._refuse(i, exc)

    def _freeze(self, runs: dict[int, CacheRun]) -> None:
        """Stop every evicting cache's policy (`CacheRun.stop_evicting`)."""
        for i, run in list(runs.items()):
            if run.strategy.evicts:
                try:
                    run.stop_evicting()
                except Exception as exc:  # noqa: BLE001 - this configuration's own failure
                    self._drop(runs, i, exc)

    def _token_by_token(self, runs: dict[int, CacheRun], ids: list[int], prompt: int) -> dict[int, torch.Tensor]:
        """Feed `ids` as a decode-time reading: whole to a cache that keeps every token exactly, the first `prompt`
        tokens at once then one at a time to a cache that evicts only from a prompt, one at a time to the rest
        (together, one batch row each, where they can share forwards)."""
        tensor = torch.tensor([ids], device=self.model.device)
        logits: dict[int, torch.Tensor] = {}
        start: dict[int, int] = {}
        for i, run in list(runs.items()):
            whole = run.strategy.exact and not feed_refusal(self.model)
            first = len(ids) if whole else prompt if run.strategy.compresses_prompt else 0
            if first:
                try:
                    logits[i] = run.prefill(tensor[:, :first])[0, -1]
                    self.forwards += 1
                except Exception as exc:  # noqa: BLE001 - this configuration's own failure
                    self._drop(runs, i, exc)
                    continue
            start[i] = first
        for position in range(min(start.values(), default=len(ids)), len(ids)):
            if self.cancelled:
                raise Stopped
            reading = [i for i in runs if start[i] <= position]
            fed = self._feed(runs, reading, [ids[position]] * len(reading))
            logits.update(fed)
            self.on_progress()
        return logits

    def _feed(self, runs: dict[int, CacheRun], which: list[int], tokens: list[int]) -> dict[int, torch.Tensor]:
        """Feed one token each to these runs: together in batches of up to `rows` where they can share forwards
        (quantized caches too, unless `quantized_alone`), else alone; returns their next logits. A run that fails
        leaves `runs`."""
        device = self.model.device
        shared = [k for k, i in enumerate(which) if self._batched
                  and (not runs[i].strategy.quantizes or not self.quantized_alone)]
        groups = [shared[g : g + self.rows] for g in range(0, len(shared), self.rows)]
        if groups and len(groups[-1]) == 1:
            groups.pop()
        alone = [k for k in range(len(which)) if not any(k in group for group in groups)]
        logits: dict[int, torch.Tensor] = {}
        for group in groups:
            members = [runs[which[k]] for k in group]
            ids = torch.tensor([[tokens[k]] for k in group], device=device)
            with cache_rows.attention_by_rows(self.model):
                out, failures = cache_rows.feed_together(members, ids)
            self.forwards += 1
            for row, k in enumerate(group):
                if row in failures:
                    self._drop(runs, which[k], failures[row])
                else:
                    logits[which[k]] = out[row, -1]
        for k in alone:
            try:
                logits[which[k]] = runs[which[k]].forward(torch.tensor([[tokens[k]]], device=device))[0, -1]
                self.forwards += 1
            except Exception as exc:  # noqa: BLE001 - this configuration's own failure
                self._drop(runs, which[k], exc)
        return logits

    # -- asking and answering ------------------------------------------------------------------------------------

    def _ask(self, index: int, item: QAItem, turn: int, regime: str, runs: dict[int, CacheRun], question: list[int],
             stop_when_right: bool, unfed: dict[int, int | None] | None = None) -> dict[int, Written]:
        """Feed the question to each run (after its unfed token, if any) and write the answers."""
        held = {i: self._needle_held(index, turn, run) for i, run in runs.items()}
        logits = {}
        for i, run in list(runs.items()):
            before = [] if unfed is None or unfed.get(i) is None else [unfed[i]]
            try:
                logits[i] = run.forward(torch.tensor([before + question], device=self.model.device))[0, -1]
                self.forwards += 1
            except Exception as exc:  # noqa: BLE001 - this configuration's own failure
                self._drop(runs, i, exc)
        return self._answer(index, item, turn, regime, runs, logits, stop_when_right, held)

    def _answer(self, index: int, item: QAItem, turn: int, regime: str, runs: dict[int, CacheRun],
                logits: dict[int, torch.Tensor], stop_when_right: bool,
                held: dict | None = None) -> dict[int, Written]:
        """Write every run's answer to question `turn` from its `logits`, together, and record them."""
        held = held or {i: self._needle_held(index, turn, run) for i, run in runs.items()}
        prompt = {i: run.seen for i, run in runs.items()}
        self.on_answering(regime, index, turn, runs)
        asked = item.turns[turn]
        written = {i: Written(logits[i], []) for i in runs}
        while True:
            for w in written.values():
                if w.done:
                    continue
                token = int(w.logits.argmax())
                if token in self.eos:
                    w.done = True
                    continue
                w.tokens.append(token)
                right = stop_when_right and score(item.metric, self._text(w.tokens), asked.answers) == 1.0
                if len(w.tokens) >= asked.max_new_tokens or right:
                    w.done, w.unfed = True, token
            going = [i for i, w in written.items() if not w.done and i in runs]
            if not going or self.cancelled:
                break
            fed = self._feed(runs, going, [written[i].tokens[-1] for i in going])
            for i in going:
                if i in fed:
                    written[i].logits = fed[i]
                else:
                    written[i].done = True  # failed: recorded by `_feed`
        for i, w in written.items():
            if i not in runs:
                continue
            text = clean(self._text(w.tokens))
            self.answers[i].append(AnswerRecord(index, turn, regime, text, score(item.metric, text, asked.answers),
                                                len(w.tokens), prompt[i], *held[i]))
        return written

    def _text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _needle_held(self, index: int, turn: int, run: CacheRun) -> tuple[int | None, int | None, int | None]:
        """(tokens held by the first layer, layer-heads holding every token of the question's needles, layer-heads
        in all) as the question comes; the last two None for an item without needles."""
        layers = run.measure(slots=False)
        tokens_held = layers[0].seq_len if layers else None
        positions = self.items[index].needle_positions(turn)
        if not positions:
            return tokens_held, None, None
        holding = heads_holding(run.held(positions), len(positions))
        return tokens_held, holding.held, holding.layer_heads
