"""A conversation: chat turns through one cache kept across them, and a cached prefix new chats start from.

Iterative generation as transformers' cache docs describe it: every turn renders the whole history with the
chat template and only the tokens the cache does not hold yet are fed. Unlike `generate`, which feeds the tokens
past the cache's length without looking at the ones before, every turn here compares the rendered history with
the tokens the cache holds (`cached`): where they differ (a template that rewrites earlier turns, a reply whose
text tokenizes differently from the tokens generated, an edited message) the cache is cropped back to the first
differing token and the rest is fed again; a cache that cannot be cropped (it has evicted, quantized, slid, or
a live switch filled it) is prefilled again from the start. The cache never runs on tokens that are not the text.

Prefix caching: the template's opening with the system prompt is prefilled once (`Prefix`), and each new chat
starts from a deep copy of that cache (as transformers' docs do it: the copy is as large again).

Each turn is a `Decoder` over the history with the conversation's `CacheRun`, so sampling, stopping, live
switches and per-step measurement are those of `kvviz run`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch

from kvviz.engine import measure
from kvviz.engine.cache_run import CacheRun
from kvviz.engine.decode import Decoder, GenerationSettings
from kvviz.engine.geometry import Geometry
from kvviz.engine.models import LoadedModel
from kvviz.engine.own_caches import feed_refusal
from kvviz.engine.strategies import StrategyChoice
from kvviz.errors import OptionError
from kvviz.files.conversation import (
    ConversationStep,
    ConversationTrace,
    MessageRecord,
    PrefixRecord,
    TurnRecord,
)
from kvviz.files.trace import StepRecord

CHAT_TEMPLATE = "the tokenizer's chat template"
# A tokenizer without a chat template (a base model) gets turns written as plain lines, said in the trace
PLAIN_FORMAT = "plain lines ('System: ...', 'User: ...', 'Assistant: ...'): this tokenizer has no chat template"
_PROBES = ("a", "b")
# The slots a static cache reserves when max_cache_len does not say: the model's context, at most this many (every
# decode step of a static cache reads all of its slots)
STATIC_SLOTS = 4096  # two first messages whose rendered histories share exactly the prefix new chats reuse


@dataclass
class Message:
    role: str  # "system", "user" or "assistant"
    content: str


def render(tokenizer, messages: list[Message], plain: bool, reply: bool = True) -> list[int]:
    """The history's token ids, with the prompt of the next reply if `reply`: the chat template, or plain lines."""
    if not plain:
        ids = tokenizer.apply_chat_template([asdict(m) for m in messages], add_generation_prompt=reply, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    text = "".join(f"{m.role.capitalize()}: {m.content}\n\n" for m in messages) + ("Assistant:" * reply)
    return tokenizer(text, add_special_tokens=True)["input_ids"]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many first tokens `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class Prefix:
    """The cached prefix: its tokens, a run holding them (never fed further: chats take copies) and its cost."""

    ids: list[int]
    run: CacheRun
    record: PrefixRecord


class Turn:
    """One turn being generated: iterate it for its steps; `record` is its TurnRecord once the iteration ends."""

    def __init__(self, conversation: Conversation, decoder: Decoder, kind: str, start: int, kept: int,
                 note: str | None, dropped_before: int):
        self.conversation, self.decoder, self.kind = conversation, decoder, kind
        self.start, self.kept, self.note, self.dropped_before = start, kept, note, dropped_before
        self.record: TurnRecord | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.decoder.prompt_tokens

    def __iter__(self) -> Iterator[StepRecord]:
        conversation = self.conversation
        try:
            for step in self.decoder:
                conversation.trace.steps.append(_light_step(len(conversation.trace.turns), step))
                yield step
        except BaseException:
            conversation.stale = True  # stopped inside a forward: the cache may hold part of a token
            self.decoder.trace.cancelled = True
            raise
        finally:
            self.record = conversation.finish(self)


class Conversation:
    """Turns of a chat through one strategy's cache, kept across turns.

    Raises `OptionError` at construction for what cannot run in a conversation (torch.compile: it compiles a run's
    decode step once; a reference run). `settings.max_new_tokens` bounds each reply; `settings.raw` writes turns as
    plain lines instead of the chat template. A preallocating cache (static) is sized for the conversation: its
    `max_cache_len`, or else the model's context up to `STATIC_SLOTS`; a turn that would pass it is refused.
    """

    def __init__(self, loaded: LoadedModel, choice: StrategyChoice, settings: GenerationSettings, system: str = "",
                 notify: Callable[[str], None] | None = None):
        settings.check()
        if choice.options.get("compile"):
            raise OptionError("a conversation cannot run under torch.compile (it compiles one run's decode step); "
                              "use static with compile=false")
        if loaded.model.config.is_encoder_decoder:
            raise OptionError("a conversation keeps one decoder's cache across turns; this model is an "
                              "encoder-decoder, whose encoder reads each input anew: chat with a decoder-only model")
        problem = feed_refusal(loaded.model)
        if problem:
            raise OptionError(f"a conversation feeds each turn's new tokens into the cache it kept, and {problem}; "
                              "generate from one prompt instead")
        self.loaded, self.settings, self.notify = loaded, settings, notify or (lambda message: None)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.plain = settings.raw or not getattr(self.tokenizer, "chat_template", None)
        self.system = system.strip()
        self.messages: list[Message] = [Message("system", self.system)] if self.system else []
        self.context = Geometry.of(self.model.config, self.model.dtype).context
        self.run = self._new_run(choice)
        self.cached: list[int] = []  # the tokens the cache holds, as fed (len == run.seen)
        self.stale = False  # a turn stopped inside a forward: the next one prefills again
        self.chat = 0
        self.prefix: Prefix | None = None
        self.pending_copy_bytes: int | None = None  # a new chat's copy of the prefix, for its first turn's record
        self.turn: Turn | None = None  # the turn being generated
        self.trace = ConversationTrace(
            model=dict(loaded.card),
            strategy={"name": choice.name, "options": dict(choice.options)},
            system=self.system,
            template=PLAIN_FORMAT if self.plain else CHAT_TEMPLATE,
            settings=asdict(settings),
            capacity=self.run.capacity,
        )

    # -- the cache ---------------------------------------------------------------------------------

    def _new_run(self, choice: StrategyChoice) -> CacheRun:
        capacity = choice.options.get("max_cache_len") or min(self.context or STATIC_SLOTS, STATIC_SLOTS)
        run = CacheRun(self.model, choice, capacity, tokenizer=self.tokenizer)
        if run.strategy.preallocates:
            run.check_memory()
        return run

    @property
    def choice(self) -> StrategyChoice:
        return self.run.choice

    def request_switch(self, choice: StrategyChoice) -> None:
        """Switch the cache to `choice`: at the next step of the turn being generated, or now between turns.
        Raises OptionError when this cache cannot become `choice` (what `kvviz run` refuses)."""
        if choice.options.get("compile"):
            raise OptionError("a conversation cannot run under torch.compile; use static with compile=false")
        if self.turn is not None and self.turn.record is None:
            self.turn.decoder.request_switch(choice)
            return
        problem = self.run.switch_refusal(choice)
        if problem:
            raise OptionError(f"cannot switch from {self.run.choice.name!r} to {choice.name!r}: {problem}")
        self.run.switch(choice)

    def cancel(self) -> None:
        """Stop the turn being generated after its step in progress; the turn keeps what it generated."""
        if self.turn is not None:
            self.turn.decoder.cancel()

    # -- turns -------------------------------------------------------------------------------------

    def send(self, text: str) -> Turn:
        """Add the user's message and return the turn that answers it (iterate it)."""
        self._check_message(text)
        self.messages.append(Message("user", text))
        try:
            return self._turn("send", None)
        except OptionError:
            self.messages.pop()  # refused: the history is as it was
            raise

    def regenerate(self) -> Turn:
        """The last answer again: the cache is cropped back to the end of the user's message."""
        if not self.messages or self.messages[-1].role != "assistant":
            raise OptionError("there is no answer to regenerate yet; send a message first")
        removed = self.messages.pop()
        try:
            return self._turn("regenerate", None)
        except OptionError:
            self.messages.append(removed)
            raise

    def edit(self, index: int, text: str) -> Turn:
        """Change the user's message at `index` of `messages`, drop what came after it, and answer it again: the
        cache is cropped back to the first changed token and only the rest is fed."""
        if not 0 <= index < len(self.messages) or self.messages[index].role != "user":
            users = [i for i, m in enumerate(self.messages) if m.role == "user"]
            raise OptionError(f"message {index} is not a user message of this chat; user messages: {users or 'none'}")
        self._check_message(text)
        before = self.messages
        self.messages = [*before[:index], Message("user", text)]
        try:
            return self._turn("edit", None)
        except OptionError:
            self.messages = before
            raise

    def new_chat(self) -> None:
        """Start a new chat from the cached prefix (the system prompt, prefilled once; each chat gets a copy)."""
        self.chat += 1
        self.messages = [Message("system", self.system)] if self.system else []
        if self.prefix is None or self.prefix.run.choice != self.run.choice:
            self.prefix = self._prefill_prefix()
        if self.prefix is None:  # nothing the chats share: start empty
            self.run, self.cached, self.pending_copy_bytes = self._new_run(self.run.choice), [], None
            return
        try:
            self.run = self.prefix.run.copy()
        except RuntimeError:  # torch refuses to deep-copy some tensor subclasses (quanto's packed tensors)
            self.notify(f"a {self.run.choice.name!r} cache cannot be copied here; the new chat prefills the "
                        "system prompt again")
            self.run, self.cached, self.pending_copy_bytes = self._new_run(self.run.choice), [], None
            return
        self.cached = list(self.prefix.ids)
        self.pending_copy_bytes = sum(layer.total_bytes for layer in self.run.measure(slots=False))
        self.stale = False

    def _prefill_prefix(self) -> Prefix | None:
        """Prefill what every chat's first turn starts with (the template's opening and the system prompt)."""
        system = [Message("system", self.system)] if self.system else []
        first = [render(self.tokenizer, [*system, Message("user", probe)], self.plain) for probe in _PROBES]
        ids = first[0][: common_prefix(*first)]
        if not ids:
            return None
        run = self._new_run(self.run.choice)
        started = time.perf_counter()
        with torch.inference_mode():
            run.prefill(torch.tensor([ids], device=self.model.device))
        prefill_ms = (time.perf_counter() - started) * 1000.0
        cache_bytes = sum(layer.total_bytes for layer in run.measure(slots=False))
        record = PrefixRecord(tokens=len(ids), cache_bytes=cache_bytes, prefill_ms=prefill_ms)
        self.trace.prefix = record
        return Prefix(ids, run, record)

    @staticmethod
    def _check_message(text: str) -> None:
        if not text.strip():
            raise OptionError("the message is empty; type some text to send")

    def _turn(self, kind: str, note: str | None) -> Turn:
        if self.turn is not None and self.turn.record is None:
            raise OptionError("a turn is being generated; stop it or wait for it to end")
        ids = render(self.tokenizer, self.messages, self.plain)
        earlier = self.messages[:-1]  # where the user's message begins: after the history before it
        start = common_prefix(render(self.tokenizer, earlier, self.plain, reply=False), ids) if earlier else 0
        shared = common_prefix(self.cached, ids)
        keep = min(shared, len(ids) - 1)  # at least one token is fed: its logits give the first new token
        if self.stale:
            keep, action = 0, "stale"
        elif keep == len(self.cached):
            action = "continue"
        elif self.run.crop_refusal() is None:
            action = "crop"
        else:
            action = "refill"
            keep = 0
        self._check_room(ids, keep if action != "continue" else None)
        note = self._crop_note(kind, action, shared, keep, len(ids))
        if action == "crop":
            self.run.crop(keep)
        elif action in ("refill", "stale"):
            self.run = self._new_run(self.run.choice)
        self.cached = self.cached[:keep]
        self.stale = False
        dropped = measure.tokens_dropped(self.run.cache, self.run.seen, self.run.geometry.windows)
        decoder = Decoder(self.loaded, self.run.choice, self.settings, self.tokenizer.decode(ids[keep:]),
                          notify=self.notify, prompt_ids=ids, run=self.run)
        self.turn = Turn(self, decoder, kind, start, keep, note, dropped)
        return self.turn

    def _check_room(self, ids: list[int], base: int | None) -> None:
        """Refuse a turn that would pass the model's context (an unbounded cache) or a static cache's slots.
        `base`: the position the turn's first fed token gets (None: where the cache is now)."""
        run, strategy, most = self.run, self.run.strategy, self.settings.max_new_tokens
        position = run.position if base is None else base
        fed = len(ids) - (run.seen if base is None else base)
        needed = strategy.positions_needed(run.choice.options, position + fed + most)
        if self.context and needed > self.context:
            left = self.context - len(ids)
            raise OptionError(
                f"this turn would pass the model's context: the history is {len(ids):,} tokens and the answer may add "
                f"{most:,}, {needed:,} positions with {run.choice.name!r}, more than the {self.context:,} the model "
                f"takes ({max(left, 0):,} tokens left); start a new chat, ask for fewer new tokens, or use a bounded "
                "strategy that renumbers what it keeps (sink), which goes on for ever"
            )
        if strategy.preallocates and len(ids) + most > run.capacity:
            raise OptionError(
                f"the static cache is full for this turn: it has {run.capacity:,} slots, and the history is "
                f"{len(ids):,} tokens with up to {most:,} new; start a new chat, ask for fewer new tokens, or use a "
                "larger max_cache_len"
            )

    def _crop_note(self, kind: str, action: str, shared: int, keep: int, total: int) -> str | None:
        """What the turn does to the cache, in words, where it is more than feeding the new message."""
        recomputed = total - keep
        if action == "stale":
            return f"the last turn stopped inside a step, so the history ({total:,} tokens) is prefilled again"
        if action == "refill":
            return (f"going back to token {min(shared, total - 1):,} needs a crop, and this cache cannot be cropped "
                    f"({self.run.crop_refusal()}): the whole history ({total:,} tokens) is prefilled again")
        if kind in ("regenerate", "edit"):
            return f"kept {keep:,} cached tokens, recomputed {recomputed:,}"
        if action == "crop":
            return (f"re-encoding the history changed tokens the cache held, from token {shared:,} (the chat template "
                    f"rewrote an earlier turn, or a reply's text tokenizes differently from the tokens generated): "
                    f"the cache is cropped there and {recomputed:,} tokens are recomputed")
        return None

    def finish(self, turn: Turn) -> TurnRecord:
        """The turn's record, once its generation ended (or stopped); the reply joins the history."""
        decoder, run = turn.decoder, self.run
        steps = decoder.trace.steps
        tokens = [s.token_id for s in steps]
        ids = decoder.prompt_ids
        self.cached = (ids + tokens)[: run.seen]
        reply = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if steps:
            self.messages.append(Message("assistant", reply))
        decode_ms = [s.wall_ms for s in steps if s.phase == "decode"]
        last = steps[-1] if steps else None
        evicted = measure.tokens_dropped(run.cache, run.seen, run.geometry.windows) - turn.dropped_before
        note = turn.note
        if evicted > 0:
            note = ((note + "; ") if note else "") + (
                f"the cache is evicting: {evicted:,} tokens dropped in this turn, early turns go first")
        index = len(self.trace.turns)
        record = TurnRecord(
            index=index, chat=self.chat, kind=turn.kind,
            strategy={"name": run.choice.name, "options": dict(run.choice.options)},
            start=turn.start, prompt_end=len(ids), end=len(ids) + len(steps), kept=turn.kept,
            recomputed=len(ids) - turn.kept, new_tokens=len(steps),
            ttft_ms=steps[0].wall_ms if steps else None,
            decode_tokens_per_s=1000.0 * len(decode_ms) / sum(decode_ms) if decode_ms else None,
            cache_bytes=last.cache_bytes if last else None, policy_bytes=last.policy_bytes if last else None,
            tokens_held=last.layers[0].seq_len if last and last.layers else None, evicted=max(evicted, 0),
            prefix_copy_bytes=self.pending_copy_bytes, note=note, cancelled=decoder.trace.cancelled,
        )
        self.pending_copy_bytes = None
        leftover = decoder.take_pending_switch()  # asked after the turn's last step: the next turn starts with it
        if leftover is not None and self.stale:  # the next turn prefills again, into the cache asked for
            self.run = self._new_run(leftover)
        elif leftover is not None:
            run.switch(leftover)
        self.trace.turns.append(record)
        self.trace.messages.append(MessageRecord("user", self._last_user(), index, turn.start, len(ids)))
        if steps:
            self.trace.messages.append(MessageRecord("assistant", reply, index, len(ids), record.end))
        if self.system and not any(m.role == "system" for m in self.trace.messages):
            self.trace.messages.insert(0, MessageRecord("system", self.system, None, 0, turn.start))
        return record

    def _last_user(self) -> str:
        return next(m.content for m in reversed(self.messages) if m.role == "user")

    # -- measuring against a full re-prefill -------------------------------------------------------

    def reprefill(self, turn: Turn) -> None:
        """Measure what the turn's first token would cost without the kept cache: the whole history prefilled into a
        fresh cache of the same strategy (timed: the forward and the pick, as the turn's first step), and the largest
        difference of its logits from the kept cache's. Both go into the turn's record."""
        record, logits = turn.record, turn.decoder.prefill_logits
        if record is None or logits is None:
            return
        fresh = CacheRun(self.model, self.run.choice, self.run.capacity, tokenizer=self.tokenizer)
        ids = torch.tensor([turn.decoder.prompt_ids], device=self.model.device)
        with torch.inference_mode():
            started = time.perf_counter()
            full = fresh.forward(ids)[0, -1]
            int(full.argmax().item())
            if self.model.device.type == "cuda":
                torch.cuda.synchronize(self.model.device)
            record.reprefill_ms = (time.perf_counter() - started) * 1000.0
        record.reprefill_logit_diff = float((full.float().cpu() - logits).abs().max())


def _light_step(turn: int, step: StepRecord) -> ConversationStep:
    return ConversationStep(
        turn=turn, phase=step.phase, position=step.position, token=step.token, wall_ms=step.wall_ms,
        cache_bytes=step.cache_bytes, predicted_cache_bytes=step.predicted_cache_bytes,
        policy_bytes=step.policy_bytes, tokens_held=step.layers[0].seq_len if step.layers else None,
        strategy=step.strategy,
    )
