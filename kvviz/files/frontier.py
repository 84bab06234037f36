"""The answer a sweep gives to "which cache should I use?": the user's terms (a memory budget, a quality
tolerance) read from text, each configuration's quality loss against its memory at the target, the frontier
of configurations no other beats on both, and the answer in two sentences.

Quality loss is the perplexity's rise over the exact cache's (a share) when the tolerance is on perplexity, or
the mean KL divergence from the exact cache (nats) when it is on KL. Memory is the cache and its policy's state
at the target context for the target number of sequences (`kvviz.engine.target_memory`).

Where the sweep also asked questions (`Sweep.asked`), a configuration's accuracy in each regime stands beside its
perplexity: the answer never names a configuration that answers more than the accuracy tolerance below the exact
cache in any regime asked, and it says where perplexity and accuracy disagree (a cache within the perplexity
tolerance that loses the answers, or one beyond it that keeps them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import partial

from kvviz import present
from kvviz.errors import OptionError
from kvviz.files.sweep import Configuration, Sweep, Tolerance
from kvviz.present import counted, percent, size

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
BUDGET_FORMS = "a size such as 4GiB, 512MiB, 1.5GB or 800000000 (bytes), or 'free' for the device's free memory"
TOLERANCE_FORMS = "a perplexity rise such as 5% or a mean KL divergence such as kl=0.05 (nats)"


def parse_budget(text: str) -> int:
    """Bytes from "4GiB", "4 GiB", "512MiB", "1.5GB" or a plain number of bytes. Raises OptionError naming the
    accepted forms ("free" is the caller's: it needs the device)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*", text or "")
    unit = match.group(2).lower() if match else ""
    if not match or unit not in UNITS:
        raise OptionError(f"the budget {text!r} is not a size; give {BUDGET_FORMS}")
    value = int(float(match.group(1)) * UNITS[unit])
    if value <= 0:
        raise OptionError(f"the budget {text!r} is no memory at all; give {BUDGET_FORMS}")
    return value


def parse_tolerance(text: str) -> Tolerance:
    """A `Tolerance` from "5%" (perplexity up to 5 % above the exact cache's) or "kl=0.05" / "0.05nats" (mean KL
    divergence from the exact cache). Raises OptionError naming the accepted forms."""
    spoken = (text or "").strip().lower().replace(" ", "")
    percent_match = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)%", spoken)
    kl_match = re.fullmatch(r"kl[=:]([0-9]+(?:\.[0-9]*)?)|([0-9]+(?:\.[0-9]*)?)nats?", spoken)
    if percent_match:
        return Tolerance("perplexity", float(percent_match.group(1)) / 100.0)
    if kl_match:
        return Tolerance("kl", float(kl_match.group(1) or kl_match.group(2)))
    raise OptionError(f"the tolerance {text!r} is neither a share nor a divergence; give {TOLERANCE_FORMS}")


def perplexity_change(sweep: Sweep, config: Configuration) -> float | None:
    """The configuration's perplexity over the exact cache's, less one (0.031: 3.1 % worse); None if unknown."""
    reference = sweep.reference()
    mine = config.summary()["perplexity"] if config.finished else None
    exact = reference.summary()["perplexity"] if reference else None
    return None if mine is None or not exact else mine / exact - 1.0


def quality_loss(sweep: Sweep, config: Configuration) -> float | None:
    """What the configuration costs in the tolerance's own measure (a perplexity share, or nats); None if unknown."""
    if sweep.question.tolerance.kind == "perplexity":
        return perplexity_change(sweep, config)
    return config.summary()["mean_kl"] if config.finished else None


def accuracy_loss(sweep: Sweep, config: Configuration) -> float | None:
    """How far below the exact cache's accuracy the configuration answers in its worst regime (a share: 0.2 is 20
    points); None where no questions were asked or an accuracy is unknown."""
    reference = sweep.reference()
    if sweep.asked is None or reference is None:
        return None
    losses = []
    for regime in sweep.asked.regimes:
        mine, exact = config.accuracy(regime), reference.accuracy(regime)
        if mine is None or exact is None:
            return None
        losses.append(exact - mine)
    return max(losses, default=None)


def answers_well(sweep: Sweep, config: Configuration) -> bool:
    """Whether the configuration answers within the accuracy tolerance of the exact cache in every regime asked
    (True where no questions were asked)."""
    if sweep.asked is None:
        return True
    loss = accuracy_loss(sweep, config)
    return loss is not None and loss <= sweep.question.accuracy_tolerance + 1e-9


def accuracy_text(sweep: Sweep, config: Configuration, regime: str) -> str:
    """Its answers in a regime, as "3 of 5 needles" (partial scores count in part: "3.75 of 5")."""
    records = config.answered(regime)
    scores = [r.score for r in records]
    if not records or None in scores:
        return present.UNKNOWN
    items = sweep.asked.items if sweep.asked else []
    noun = "needles" if items and all(item.task.startswith("niah") for item in items) else "questions"
    return f"{round(sum(scores), 2):g} of {len(scores)} {noun}"


def worst_regime(sweep: Sweep, config: Configuration) -> str | None:
    """The regime asked where the configuration answers least well against the exact cache (None: none known)."""
    reference = sweep.reference()
    known = [(reference.accuracy(r) - config.accuracy(r), r) for r in (sweep.asked.regimes if sweep.asked else ())
             if reference and config.accuracy(r) is not None and reference.accuracy(r) is not None]
    return max(known)[1] if known else None


def memory(config: Configuration, covers: str = "cache") -> int | None:
    """Memory at the target context and number of sequences: of the caches and their policies' state (`covers`
    "cache"), or of the process serving them ("process": the weights and one request's prefill at its peak beside the
    others' caches)."""
    if config.target is None:
        return None
    return config.target.total_bytes if covers == "cache" else config.target.process_bytes


def placed(sweep: Sweep, covers: str | None = None) -> list[Configuration]:
    """The configurations with both a quality loss and a memory at the target (of what `covers`, by default what the
    budget covers), in the sweep's order."""
    covers = covers or sweep.question.budget_covers
    return [c for c in sweep.configurations if quality_loss(sweep, c) is not None and memory(c, covers) is not None]


def frontier(sweep: Sweep, covers: str | None = None) -> list[Configuration]:
    """The configurations no other beats on both memory (of what `covers`, by default what the budget covers) and
    quality (no worse on both, better on one), by memory."""
    covers = covers or sweep.question.budget_covers
    points = [(memory(c, covers), quality_loss(sweep, c), c) for c in placed(sweep, covers)]
    kept = [c for m, q, c in points
            if not any(m2 <= m and q2 <= q and (m2 < m or q2 < q) for m2, q2, _ in points)]
    return sorted(kept, key=lambda c: memory(c, covers))


def loss_text(sweep: Sweep, config: Configuration) -> str:
    """The quality a configuration gives up, in words: "perplexity +3.1 %, KL 0.021 nats, top-1 agreement 96 %"."""
    s = config.summary()
    change = perplexity_change(sweep, config)
    parts = []
    if change is not None:
        parts.append(f"perplexity {present.change(change)}")
    if s["mean_kl"] is not None:
        parts.append(f"KL {s['mean_kl']:.3g} nats")
    if s["top1"] is not None:
        parts.append(f"top-1 agreement {percent(s['top1'])}")
    regime = worst_regime(sweep, config)
    if regime is not None:
        parts.append(f"{accuracy_text(sweep, config, regime)} answered ({regime})")
    return ", ".join(parts) or "quality unknown"


@dataclass
class Answer:
    """The two answers: the smallest cache within the tolerance and the best quality within the budget (None: no
    configuration meets it; the nearest is then named), in sentences with their reasons and caveats."""

    smallest: Configuration | None
    best: Configuration | None
    sentences: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)

    @property
    def met(self) -> bool:
        """Some configuration meets the tolerance and some meets the budget."""
        return self.smallest is not None and self.best is not None

    def text(self) -> str:
        return " ".join(self.sentences + self.caveats)


def answer(sweep: Sweep) -> Answer:
    question = sweep.question
    held = partial(memory, covers=question.budget_covers)  # what the budget bounds
    candidates = [c for c in placed(sweep) if answers_well(sweep, c)]
    where = f"{counted(question.sequences, 'sequence')} of {question.context:,} tokens"
    if question.budget_covers == "process":
        where += ", the weights and a request's prefill included"
    if not candidates:
        return Answer(None, None, ["No configuration finished with its quality, its memory and, where questions were "
                                   "asked, its answers measured, so there is nothing to choose from yet."])
    terms = question.tolerance.describe()
    if sweep.asked is not None:
        terms += (f", and answers within {100 * question.accuracy_tolerance:g} points of the exact cache's accuracy "
                  f"in {', '.join(sweep.asked.regimes)}")
    within = [c for c in candidates if quality_loss(sweep, c) <= question.tolerance.value]
    smallest = min(within, key=lambda c: (held(c), quality_loss(sweep, c))) if within else None
    if smallest is not None:
        first = (f"The smallest cache within your tolerance ({terms}) is {smallest.label}: "
                 f"{size(held(smallest))} for {where}, with {loss_text(sweep, smallest)}.")
    else:
        nearest = min(candidates, key=lambda c: quality_loss(sweep, c))
        first = (f"No configuration meets your tolerance ({terms}); the nearest is "
                 f"{nearest.label}, with {loss_text(sweep, nearest)} ({size(held(nearest))} for {where}).")
    fits = [c for c in candidates if question.budget_bytes is None or held(c) <= question.budget_bytes]
    best = min(fits, key=lambda c: (quality_loss(sweep, c), held(c))) if fits else None
    budget = f"your budget of {question.budget}" if question.budget_bytes is not None else "no budget"
    if best is not None:
        fit = best.target.sequences_in_budget if best.target else None
        room = f"; {counted(fit, 'such sequence')} fit in it" if fit is not None else ""
        second = (f"Within {budget}, the best quality is {best.label}: {loss_text(sweep, best)}, in "
                  f"{size(held(best))}{room}.")
    else:
        cheapest = min(candidates, key=held)
        second = (f"No configuration fits {where} in {budget}; the smallest is {cheapest.label} at "
                  f"{size(held(cheapest))}.")
    said = [first, second]
    said += [note for note in dict.fromkeys(prefill_note(sweep, c) for c in (smallest, best) if c) if note]
    disagree = disagreements(sweep)
    if disagree:
        said.append(f"Perplexity and accuracy disagree: {'; '.join(disagree)}.")
    return Answer(smallest, best, said, caveats(sweep))


def prefill_note(sweep: Sweep, config: Configuration) -> str | None:
    """Where serving a request, not holding the caches, sets the memory a configuration needs beside the weights (its
    prefill at the target holds more than all the sequences' caches): said, with the peak of a twin that reads its
    prompt in chunks where the sweep measured one. None elsewhere."""
    question = sweep.question
    target, first = config.target, config.first_token
    at = target.first_token if target else None
    if at is None or at.peak_bytes is None or first is None or target.total_bytes is None \
            or target.per_sequence_bytes is None:
        return None
    beside = at.peak_bytes - first.weight_bytes - target.per_sequence_bytes  # the prefill's own, at its peak
    if beside <= target.total_bytes:
        return None
    label = "predicted" if at.predicted else "measured"
    said = (f"For {config.label}, the prefill, not the cache, sets the peak: {size(target.total_bytes)} of cache for "
            f"{counted(question.sequences, 'sequence')} of {question.context:,} tokens, but serving one request peaks "
            f"at {size(at.peak_bytes)} ({label}, {size(first.weight_bytes)} of it the weights)")
    twin = chunked_twin(sweep, config)
    if twin is not None:
        options = twin.run.strategy.get("options") or {}
        said += (f"; prefill in chunks of {options['prefill_chunk']:,} ({twin.label}) to peak at "
                 f"{size(twin.target.first_token.peak_bytes)}")
    return said + "."


def chunked_twin(sweep: Sweep, config: Configuration) -> Configuration | None:
    """The configuration of the same strategy and options that reads its prompt in chunks (prefill_chunk set) with
    the lowest known peak at the target, if the sweep has one and `config` does not chunk."""
    strategy = config.run.strategy
    options = dict(strategy.get("options") or {})
    if options.pop("prefill_chunk", 0):
        return None
    twins = []
    for other in sweep.configurations:
        theirs = dict(other.run.strategy.get("options") or {})
        chunk = theirs.pop("prefill_chunk", 0)
        at = other.target.first_token if other.target else None
        if chunk and other.run.strategy.get("name") == strategy.get("name") and theirs == options \
                and at is not None and at.peak_bytes is not None:
            twins.append((at.peak_bytes, other))
    return min(twins, key=lambda t: t[0])[1] if twins else None


def disagreements(sweep: Sweep) -> list[str]:
    """The configurations whose perplexity and answers tell different stories: "h2o (budget=250, recent=-1):
    perplexity +5.0 % but 0 of 5 needles (query-agnostic)", and one beyond the quality tolerance that answers as
    well as the exact cache."""
    if sweep.asked is None:
        return []
    said = []
    tolerance = sweep.question.tolerance
    for config in placed(sweep):
        loss, regime = quality_loss(sweep, config), worst_regime(sweep, config)
        if regime is None or config is sweep.reference():
            continue
        quality = (f"perplexity {present.change(perplexity_change(sweep, config))}" if tolerance.kind == "perplexity"
                   else f"KL {loss:.3g} nats")
        answered = f"{accuracy_text(sweep, config, regime)} ({regime})"
        if loss <= tolerance.value and not answers_well(sweep, config):
            said.append(f"{config.label}: {quality} but {answered}")
        elif loss > tolerance.value and answers_well(sweep, config):
            said.append(f"{config.label}: {quality}, beyond your tolerance, yet {answered}")
    return said


def caveats(sweep: Sweep) -> list[str]:
    """What the answer rests on: the measured length against the target's, configurations that did not finish, and
    those that could not answer."""
    reference = sweep.reference()
    measured = reference.summary()["tokens"] + 1 if reference else max(
        (c.summary()["tokens"] + 1 for c in sweep.configurations if c.run.records), default=0)
    name = sweep.document.get("name") or "the text"
    said = [f"Quality was measured on {measured:,} tokens of {name}"]
    if sweep.question.context > measured:
        said[0] += (f"; at {sweep.question.context:,} tokens it is extrapolated, not measured (a cache that keeps a "
                    "fixed number of tokens drops a larger share of a longer context), while memory there follows "
                    "each cache's own size rule")
    said[0] += "."
    unfinished = [c for c in sweep.configurations if not c.finished]
    if unfinished:
        said.append("Left out, as they did not finish: "
                    + "; ".join(f"{c.label} ({c.run.error or c.status})" for c in unfinished) + ".")
    said += unanswered(sweep)
    if sweep.cancelled:
        said.append("The sweep was stopped before its end.")
    return said


def unanswered(sweep: Sweep) -> list[str]:
    """Why a configuration has no accuracy in a regime (its answers there failed): one sentence per configuration and
    reason, naming the regimes."""
    return [f"{config.label} could not answer ({', '.join(regimes)}): {reason}" + ("" if reason.endswith(".") else ".")
            for config in sweep.configurations for reason, regimes in config.answer_failures().items()]
