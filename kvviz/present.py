"""How kvviz writes its numbers for people: one formatter each, shared by the CLI, the reports and the window.

Standard library only (no numpy, torch or Qt), so that any front end can use it. Unknown stays
unknown: a value of None is written as `UNKNOWN` (or left empty in a CSV cell), never as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

UNKNOWN = "–"
MIB = 1024 * 1024

# The status of a job (a run, an evaluated strategy, a swept configuration), as the window's tables, the CSVs and
# the reports write them. Live: waiting (its turn has not come), starting (asked of the engine), running (the engine
# generates), streaming (a server sends tokens). Final: a job stopped before its end (Stop, Esc, Ctrl-C, or a process
# that ended without saving: its journal) is "cancelled", with why in its error where there is more to say; one that
# could not finish is "failed", everywhere; one that a Stop kept from starting is "not run".
WAITING, STARTING, RUNNING, STREAMING = "waiting", "starting", "running", "streaming"
FINISHED, CANCELLED, FAILED, NOT_RUN = "finished", "cancelled", "failed", "not run"
FINAL_STATUSES = (FINISHED, CANCELLED, FAILED, NOT_RUN)


def number(value: float | None, digits: int = 1) -> str:
    """`number(1234.5)` -> "1,234.5"; None -> UNKNOWN."""
    return UNKNOWN if value is None else f"{value:,.{digits}f}"


def perplexity(value: float | None) -> str:
    """A perplexity (or another figure that spans magnitudes) to about four significant digits:
    "18.10", "387.3", "12,345"; None -> UNKNOWN."""
    if value is None:
        return UNKNOWN
    return number(value, 2 if value < 100 else 1 if value < 10_000 else 0)


def clock(seconds: float) -> str:
    """A duration as a clock reads it: "0:42", "12:05", "1:02:03" (time left, time in all)."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return f"{seconds // 60}:{seconds % 60:02d}"


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """`counted(1, "strategy", "strategies")` -> "1 strategy"; `counted(1200, "token")` -> "1,200 tokens"."""
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"


def in_mib(n_bytes: float | None) -> float | None:
    return None if n_bytes is None else n_bytes / MIB


def mib(n_bytes: float | None, digits: int = 2, unit: bool = True) -> str:
    """Bytes as mebibytes: `mib(1572864)` -> "1.50 MiB"; `unit=False` for a column titled in MiB."""
    text = number(in_mib(n_bytes), digits)
    return f"{text} MiB" if unit and n_bytes is not None else text


def size(n_bytes: float | None) -> str:
    """Bytes in the binary unit that keeps three or four significant digits: "912 B", "48.0 MiB", "5.25 GiB"."""
    if n_bytes is None:
        return UNKNOWN
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n_bytes) >= scale:
            value = n_bytes / scale
            return f"{value:,.{2 if value < 10 else 1 if value < 100 else 0}f} {unit}"
    return f"{int(n_bytes):,} B"


def ms(value: float | None, digits: int = 1) -> str:
    return UNKNOWN if value is None else f"{number(value, digits)} ms"


def seconds(value_ms: float | None) -> str:
    """Milliseconds as seconds, for a column titled in seconds: `seconds(38210.0)` -> "38.2", `seconds(4.0)` ->
    "0.004" (a short pause is not written as 0)."""
    if value_ms is None:
        return UNKNOWN
    return number(value_ms / 1000.0, 1 if value_ms >= 10_000 else 2 if value_ms >= 100 else 3)


def one_time(row: Mapping[str, Any]) -> str:
    """A run's one-time pauses, in no step's time: "warm-up 0.004", "compile 36.7", or UNKNOWN when it had none."""
    parts = [f"{name} {seconds(row[key])}" for name, key in (("warm-up", "warm_up_ms"), ("compile", "compile_ms"))
             if row[key] is not None]
    return " + ".join(parts) or UNKNOWN


def percent(share: float | None, digits: int = 0) -> str:
    """A share as a percentage: `percent(0.517)` -> "52%", `percent(0.0027, 1)` -> "0.3%"; None -> UNKNOWN."""
    return UNKNOWN if share is None else f"{share * 100:.{digits}f}%"


def change(share: float | None) -> str:
    """A relative change with its sign: `change(0.031)` -> "+3.1 %", `change(-0.002)` -> "-0.2 %"; None -> UNKNOWN."""
    return UNKNOWN if share is None else f"{100 * share:+.1f} %"


def options_text(options: Mapping[str, Any] | None, separator: str = ", ") -> str:
    """A strategy's options as "KEY=VALUE" words: "sink_tokens=4, window=60" (a CSV cell: separator " ")."""
    return separator.join(f"{k}={v}" for k, v in (options or {}).items())


# The options every scoring policy takes beside its own (kvviz.engine.strategies.eviction.scoring_options) at the
# values that leave the policy as its paper has it: a label names them only when set otherwise, so that "h2o
# (budget=250, recent=-1)" is not followed by six wrappers that are off. decode_interval's such value is 1 for the
# policies that evict at every step over their budget, 0 for the others (a test holds the engine to this table).
WRAPPERS_OFF = {"adaptive": False, "chunk": 0, "critical": False, "decode_target": 0, "decode_fraction": 0.0}
EVICT_EVERY_STEP = ("h2o", "tova", "knorm")


def _wrappers_off(name: str) -> dict[str, Any]:
    return {**WRAPPERS_OFF, "decode_interval": 1 if name in EVICT_EVERY_STEP else 0}


def named_options(strategy: Mapping[str, Any] | None,
                  defaults: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The options a strategy is named with (`strategy_label`): all but a scoring policy's wrappers and decoding
    schedule where unset (`WRAPPERS_OFF`), any strategy's prefill_chunk where its prompt is read whole, and, given each
    strategy's option defaults ({name: {option: default}}), those left at them."""
    strategy = strategy or {}
    name = str(strategy.get("name") or "?")
    options = dict(strategy.get("options") or {})
    if not options.get("prefill_chunk"):  # every strategy's: named only when its prompt is read in chunks
        options.pop("prefill_chunk", None)
    if "decode_interval" in options:  # a scoring policy
        off = _wrappers_off(name)
        options = {k: v for k, v in options.items() if k not in off or off[k] != v}
    known = (defaults or {}).get(name)
    if known is not None:
        options = {k: v for k, v in options.items() if k not in known or known[k] != v}
    return options


def strategy_label(strategy: Mapping[str, Any] | None, defaults: Mapping[str, Mapping[str, Any]] | None = None,
                   limit: int | None = None) -> str:
    """A strategy with its options as one line, everywhere a strategy is named: "sink (sink_tokens=4, window=60)",
    the options `named_options` keeps (given `defaults`, only those set away from them: "sink (window=124)", as
    `--strategies` would be written). limit: at most that many characters (`shortened`)."""
    name = str((strategy or {}).get("name") or "?")
    options = named_options(strategy, defaults)
    text = f"{name} ({options_text(options)})" if options else name
    return text if limit is None else shortened(text, limit)


def shortened(text: str, limit: int) -> str:
    """`text` cut to `limit` characters with "…", its last bracket closed: "quantized (backend=hqq, nbi…)"."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rstrip(", ") + "…"
    return cut + ")" if cut.count("(") > cut.count(")") else cut


def strategy_path(trace, options: bool = True) -> str:
    """The strategy a run started with, then each live switch and the step it took effect at:
    "dynamic -> sliding (window=8) @95"; `options=False` leaves the options out ("dynamic -> sliding @95")."""

    def named(strategy: Mapping[str, Any]) -> str:
        return strategy_label(strategy) if options else str(strategy.get("name") or "?")

    text = named(trace.strategy or {})
    for switch in trace.switches:
        text += f" -> {named({'name': switch.to_strategy, 'options': switch.options})} @{switch.step}"
    return text


def final_status(trace) -> str:
    """How a finished run ended: cancelled (stopped: its error, if any, says why), failed (an error) or finished."""
    if trace.cancelled:
        return CANCELLED
    return FAILED if trace.error else FINISHED


# -- one run as a row: the Runs table, its CSV export and the comparison report ---------------------


def run_row(label: str, trace, status: str | None = None) -> dict[str, Any]:
    """One run's numbers (None where unknown), keyed as kvviz.files.report's columns; `status` defaults to the
    trace's final status (the window passes a live run's "running")."""
    s = trace.summary()
    strategy = trace.strategy or {}
    return {
        "run": label,
        "model": str((trace.model or {}).get("name", "")),
        "strategy": strategy.get("name", ""),
        "options": options_text(strategy.get("options"), " "),
        "label": strategy_path(trace),
        "prompt_tokens": trace.prompt_tokens,
        "new_tokens": s["new_tokens"],
        "prefill_ms": s["prefill_ms"],
        "prefill_peak_mib": in_mib(s["prefill_peak_bytes"]),
        "decode_ms_mean": s["decode_ms_mean"],
        "decode_ms_p95": s["decode_ms_p95"],
        "scoring_ms_mean": scoring_ms_mean(trace),
        "decode_tokens_per_s": s["decode_tokens_per_s"],
        # one-time pauses, in no step's time: the strategy's warm-up (kernel builds) and torch.compile
        "warm_up_ms": trace.warm_up_ms,
        "compile_ms": trace.compile_ms,
        "memory_bound_tokens_per_s": s["memory_bound_tokens_per_s"],
        "share_of_memory_bound": s["share_of_memory_bound"],
        "final_cache_mib": in_mib(s["final_cache_bytes"]),
        "peak_cache_mib": in_mib(s["peak_cache_bytes"]),
        "peak_policy_mib": in_mib(s["peak_policy_bytes"]),
        "peak_rss_mib": in_mib(s["peak_rss_bytes"]),
        "top1_agreement": s.get("top1_agreement"),
        "mean_kl": s.get("mean_kl"),
        "first_divergence": s.get("first_divergence"),
        "reference_perplexity": s.get("reference_perplexity"),
        "switches": " ".join(f"{w.step}:{w.to_strategy}" for w in trace.switches),
        "pins_held": s.get("pins"),
        "status": status or final_status(trace),
    }


def pins_held(row: Mapping[str, Any]) -> str:
    """ "12 of 30 x 3": layer-heads holding every token of each pinned span, of layers x KV heads, at the run's last
    step ("; " between spans); "-" when nothing is pinned."""
    pins = row.get("pins_held")
    if not pins:
        return UNKNOWN
    return "; ".join(f"{p['held']} of {p['layers']} x {p['heads']}" for p in pins)


def scoring_ms_mean(trace) -> float | None:
    """The mean time per decode step an evicting cache spent choosing what to keep (part of the step's time);
    None where no step measured it (a cache that chooses nothing)."""
    spent = [s.scoring_ms for s in trace.steps if s.phase == "decode" and s.scoring_ms is not None]
    return sum(spent) / len(spent) if spent else None


def _divergence(row: Mapping[str, Any]) -> str:
    if row["mean_kl"] is None:  # no reference ran
        return UNKNOWN
    first = row["first_divergence"]
    return "none" if first is None else f"step {first}"


# The window's Runs table: (title, cell text from a run_row, right-aligned). The figures a user compares runs by
# and the status come first, so that they show without scrolling in a narrow window; the strategy follows (the
# table elides a long option list and shows it whole as the cell's tooltip), then the rest.
RUN_TABLE: list[tuple[str, Callable[[Mapping[str, Any]], str], bool]] = [
    ("run", lambda r: r["run"], False),
    ("tokens", lambda r: str(r["new_tokens"]), True),
    ("tokens/s", lambda r: number(r["decode_tokens_per_s"]), True),
    ("decode ms (mean)", lambda r: number(r["decode_ms_mean"], 2), True),
    ("peak cache MiB", lambda r: number(r["peak_cache_mib"], 3), True),
    ("needle held", pins_held, True),
    ("status", lambda r: r["status"], False),
    ("strategy", lambda r: r["label"], False),
    ("of mem. limit", lambda r: percent(r["share_of_memory_bound"]), True),
    ("decode ms (p95)", lambda r: number(r["decode_ms_p95"], 2), True),
    ("prefill ms", lambda r: number(r["prefill_ms"]), True),
    ("prefill peak MiB", lambda r: number(r["prefill_peak_mib"], 1), True),
    ("one-time s", one_time, True),
    ("policy state MiB", lambda r: number(r["peak_policy_mib"], 3), True),
    ("peak RSS MiB", lambda r: number(r["peak_rss_mib"], 0), True),
    # mean per decode step, part of its time: an evicting cache choosing what to keep
    ("scoring ms", lambda r: number(r["scoring_ms_mean"], 2), True),
    ("top-1 agree", lambda r: number(r["top1_agreement"], 3), True),
    ("mean KL", lambda r: number(r["mean_kl"], 4), True),
    ("first diverge", _divergence, True),
    ("model", lambda r: r["model"], False),
]


# What a column means, where its title cannot say it all (the Runs table's header tooltips).
RUN_TABLE_HELP = {
    "status": f"{STARTING} or {RUNNING} while it generates ({STREAMING} for a server's reply), then {FINISHED}, "
    f"{CANCELLED} (stopped with Stop or Esc, or a journal of a process that ended without saving: what it "
    f"generated is kept) or {FAILED} (hover either for why)",
    "strategy": "the strategy the run started with; a live switch reads \"-> new strategy @N\": from step N on",
    "one-time s": "seconds spent once and in no step's time: the strategy's warm-up before the prefill (quanto's "
    "kernels) and torch.compile before the first decode step",
    "policy state MiB": "the most an evicting policy kept beside keys and values (the position of each token held, "
    "H2O's attention sums), measured like the cache: with it, the policy's real cost",
    "needle held": "the pinned span (a task item's needle, words pinned): in how many layer-heads (layers x KV heads) "
    "the cache still holds every one of its tokens, at the run's last step; - when nothing is pinned",
    "tokens/s": "decode steps per second (the prefill, a warm-up and a compile are not counted)",
    "prefill peak MiB": "the most the prefill allocated at once beside the weights and what was there before it: its "
    "activations, the last position's logits and the cache it built, every allocation counted",
    "of mem. limit": "the share of the memory-bound speed the decode steps reached: the time to read the weights "
    "and the KV cache once at this machine's memory bandwidth, over the steps' real time",
}


def run_cells(row: Mapping[str, Any]) -> list[str]:
    """The Runs table's text for one run_row, in RUN_TABLE's order."""
    return [cell(row) for _, cell, _ in RUN_TABLE]


# -- the model card: `kvviz model` and the window's model chooser ------------------------------------

# what each kind of cache layer keeps (kvviz.engine.geometry.CACHE_KINDS), in a few words
CACHE_KIND_WORDS = {
    "attention": "attention",
    "sliding": "sliding-window attention",
    "state": "linear-attention / state-space",
    "state+attention": "state + attention",
    "state+sliding": "state + sliding attention",
    "indexed": "indexed attention (+ indexer keys)",
    "shared": "KV-shared (reads another layer's)",
    "none": "no attention",
    "image": "cross-attention to an image",
    "attention+cross": "self-attention",
}


def cache_kind_rows(card: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Per kind of cache layer: how many, bytes one token adds to each, bytes of each one's fixed state; then the
    fixed state of all layers together and, for latent attention, what is cached next to what per-head keys and
    values would take. Nothing for cards without per-layer kinds (older traces) or with plain attention only."""
    kinds, per_token, state = (card.get(key) or [] for key in ("cache_kinds", "layer_token_bytes",
                                                               "layer_state_bytes"))
    if not kinds or set(kinds) <= {"attention", "sliding"} and not card.get("latent_attention"):
        return []
    rows = []
    for kind in dict.fromkeys(kinds):
        where = [i for i, k in enumerate(kinds) if k == kind]
        parts = []
        if per_token and per_token[where[0]]:
            parts.append(f"{per_token[where[0]]:,} B/token")
        if state and state[where[0]] is None:
            parts.append(f"fixed state {UNKNOWN}")
        elif state and state[where[0]]:
            parts.append(f"{state[where[0]]:,} B fixed state")
        rows.append((f"{len(where)} x {CACHE_KIND_WORDS.get(kind, kind)}", ", ".join(parts) or "nothing of its own"))
    fixed = card.get("fixed_state_bytes")
    if any(state):
        rows.append(("fixed state", UNKNOWN if fixed is None else f"{fixed:,} bytes, whatever the context"))
    cross = card.get("cross_bytes_per_prompt_token")
    if cross:
        rows.append(("cross-attention", f"{cross:,} B per prompt token (the encoder's output, all layers), fixed "
                     "once the prompt is read"))
    latent = card.get("latent_attention")
    if latent:
        rows.append(("latent attention", f"caches {latent['stored_bytes']:,} B/token/layer: the latent "
                     f"(kv_lora_rank {latent['kv_lora_rank']} + rope {latent['qk_rope_head_dim']}), as serving "
                     f"engines do; per-head keys and values would be {latent['expanded_bytes']:,} B "
                     f"({latent['factor']:.1f}x)"))
    return rows


def model_card_rows(card: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines of a model card (kvviz.engine.models); missing fields read UNKNOWN."""

    def field(key: str) -> str:
        value = card.get(key)
        return UNKNOWN if value is None else str(value)

    kinds: dict[str, int] = {}
    for kind in card.get("layer_types") or []:
        kinds[kind] = kinds.get(kind, 0) + 1
    layers = field("num_layers")
    if kinds:
        layers += " (" + ", ".join(f"{n} {kind}" for kind, n in kinds.items()) + ")"
    params = card.get("parameters")
    per_token = card.get("kv_bytes_per_token")
    rows = [
        ("name", field("name")),
        ("architecture", field("architecture")),
        ("parameters", f"{params / 1e6:.1f} M" if isinstance(params, int | float) else UNKNOWN),
        ("layers", layers),
        ("heads", f"{field('num_attention_heads')} query, {field('num_kv_heads')} KV, dim {field('head_dim')}"),
        ("dtype", f"{field('dtype')} on {field('device')}"),
        # predicted from the config, at the model's own precision
        ("KV / token", f"{per_token:,} bytes ({per_token / 1024:.1f} KiB)" if isinstance(per_token, int) else UNKNOWN),
    ]
    rows += cache_kind_rows(card)
    if card.get("sliding_window"):
        rows.append(("sliding window", f"{card['sliding_window']} tokens"))
    if card.get("attention_chunk_size"):
        rows.append(("attention chunk", f"{card['attention_chunk_size']} tokens"))
    if card.get("size_rule_unknown"):
        rows.append(("cache size", f"not predicted: {card['size_rule_unknown']}"))
    if card.get("weights"):
        rows.append(("weights", str(card["weights"])))
    return rows


def conversation_turn(turn, total: int | None = None) -> str:
    """A conversation turn's figures (a TurnRecord of kvviz.files.conversation) in a line, and its note on the next:
    `kvviz chat` after each turn, `kvviz trace` for a kept conversation, the window's scripts."""
    of = f"/{total}" if total else ""
    parts = [f"turn {turn.index + 1}{of}: {turn.recomputed:,} tokens fed, {turn.kept:,} kept, {turn.new_tokens:,} new "
             f"({turn.end:,} in context)",
             f"first token {ms(turn.ttft_ms)}", f"{number(turn.decode_tokens_per_s)} tokens/s",
             f"cache {mib(turn.cache_bytes)}", f"{turn.evicted:,} evicted"]
    if turn.reprefill_ms is not None:
        parts.append(f"full re-prefill {ms(turn.reprefill_ms)} (max logit difference {turn.reprefill_logit_diff:.2g})")
    if turn.cancelled:
        parts.append("stopped")
    line = ", ".join(parts)
    return f"{line}\n  {turn.note}" if turn.note else line
