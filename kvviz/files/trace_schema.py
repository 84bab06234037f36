"""What a trace file may hold: the declared schema of the kvviz-trace format and its cross-field rules.

`kvviz.files.formats` reads every kvviz file through the `FILE_FORMAT` declared here; `kvviz.files.trace.load` is
the short way to it. A refusal names the file, the field path and what was expected.
"""

from __future__ import annotations

from kvviz.files.file_format import FileFormat
from kvviz.files.journal import ended_without_saving
from kvviz.files.schema import (
    MAX_BYTES,
    Flag,
    Int,
    Json,
    ListOf,
    MapOf,
    Number,
    Pair,
    Record,
    Refusal,
    Text,
    at,
    maybe,
    optional,
)
from kvviz.files.strategy_options import PLAIN, options_rule
from kvviz.files.trace import (
    FORMAT,
    STORAGE_KINDS,
    VERSION,
    LayerRecord,
    Pin,
    SlotState,
    StepRecord,
    Switch,
    Trace,
    TraceError,
)

# The most positions (prompt tokens, cache slots) a trace may claim. 2**22 = 4,194,304 is four times the
# longest context of the open models kvviz runs; the cache map of a run that long already takes
# 4 MiB per layer to draw, and a damaged file that claims 10**9 positions is refused here, before
# any array is sized by it.
MAX_POSITIONS = 2**22
MAX_MS = 86_400_000.0  # one day: no single step or layer takes longer

_BYTES = Int(0, MAX_BYTES, what="a byte count")
_BYTES_OR_UNKNOWN = Int(0, MAX_BYTES, null=True, what="a byte count")
_POSITIONS = Int(0, MAX_POSITIONS, what="a number of positions")
_MS = Number(0, MAX_MS, what="a time in ms")
_MS_OR_UNKNOWN = Number(0, MAX_MS, null=True, what="a time in ms")
_OPTIONS = MapOf(PLAIN)
_SPAN = Pair(Int(0, max(SlotState)), _POSITIONS, what=f"span [slot state 0-{max(SlotState)}, count >= 0]")
_HEAD_SPAN = Pair(Int(0, 2**16), _POSITIONS, what="head span [KV heads holding the positions, count >= 0]")

_LAYER = Record(
    {
        "keys_bytes": _BYTES,
        "values_bytes": _BYTES,
        "seq_len": _POSITIONS,
        "capacity": _POSITIONS,
        "layer_ms": optional(_MS_OR_UNKNOWN),
        "storage": optional(MapOf(_BYTES, keys=STORAGE_KINDS), {}),
        "spans": optional(ListOf(_SPAN), []),
        "head_spans": optional(ListOf(_HEAD_SPAN, null=True)),
        "indexer_bytes": optional(_BYTES, 0),
        "state_bytes": optional(_BYTES, 0),
        "state_shapes": optional(ListOf(ListOf(Int(0, MAX_BYTES, what="a tensor dimension")), null=True)),
        "cross_bytes": optional(_BYTES, 0),
        "cross_tokens": optional(_POSITIONS, 0),
    },
    what="a layer record (an object)",
)

def _card_adds_up(card: dict, where) -> None:
    """Per-layer figures, one per layer, and the totals they give."""
    layers = card.get("num_layers")
    for name in ("layer_types", "cache_kinds", "layer_token_bytes", "layer_state_bytes"):
        values = card.get(name)
        if values is not None and layers is not None and len(values) != layers:
            raise Refusal(at(where, name), f"one value per layer ({layers:,})", values)
    per_token, states = card.get("layer_token_bytes"), card.get("layer_state_bytes")
    if per_token is not None and card.get("kv_bytes_per_token") is not None:
        total = None if None in per_token else sum(per_token)
        if card["kv_bytes_per_token"] != total:
            raise Refusal(at(where, "kv_bytes_per_token"), f"{_or_unknown(total)}: the sum of layer_token_bytes",
                          card["kv_bytes_per_token"])
    if states is not None and "fixed_state_bytes" in card:
        total = None if None in states else sum(states)
        if card["fixed_state_bytes"] != total:
            raise Refusal(at(where, "fixed_state_bytes"), f"{_or_unknown(total)}: the sum of layer_state_bytes",
                          card["fixed_state_bytes"])


def _or_unknown(total: int | None) -> str:
    return "null" if total is None else f"{total:,}"


def _latent_adds_up(latent: dict, where) -> None:
    if latent["stored_bytes"] and abs(latent["factor"] - latent["expanded_bytes"] / latent["stored_bytes"]) > 1e-9:
        raise Refusal(at(where, "factor"), "expanded_bytes / stored_bytes", latent["factor"])


_LATENT = Record(
    {"kv_lora_rank": Int(1, MAX_BYTES), "qk_rope_head_dim": Int(0, MAX_BYTES), "stored_bytes": _BYTES,
     "expanded_bytes": _BYTES, "factor": Number(0, what="a ratio")},
    rules=(_latent_adds_up,), null=True, what="latent attention's widths and bytes (an object)",
)
_COUNT = Int(0, MAX_BYTES, null=True)

MODEL_CARD = Record(  # also the card of other formats' files (kvviz-eval, kvviz-sweep, kvviz-conversation)
    {
        "name": optional(Text(), ""),
        "architecture": maybe(Text(null=True)),
        "model_type": maybe(Text(null=True)),
        "parameters": maybe(_COUNT),
        "num_layers": maybe(_COUNT),
        "num_attention_heads": maybe(_COUNT),
        "num_kv_heads": maybe(_COUNT),
        "head_dim": maybe(_COUNT),
        "layer_types": maybe(ListOf(Text(), null=True)),
        "sliding_window": maybe(Int(0, MAX_POSITIONS, null=True)),
        "attention_chunk_size": maybe(Int(0, MAX_POSITIONS, null=True)),
        "dtype": maybe(Text(null=True)),
        "device": maybe(Text(null=True)),
        "kv_bytes_per_token": maybe(_BYTES_OR_UNKNOWN),
        "size_rule_unknown": maybe(Text(null=True)),  # why the cache's size cannot be predicted (null: it can)
        "weight_bytes": maybe(_BYTES_OR_UNKNOWN),
        "max_position_embeddings": maybe(_COUNT),
        # per layer: what its cache keeps, the bytes one token adds to it (null: unknown), its fixed state's bytes
        "cache_kinds": maybe(ListOf(Text(), null=True)),
        "layer_token_bytes": maybe(ListOf(_BYTES_OR_UNKNOWN, null=True)),
        "layer_state_bytes": maybe(ListOf(_BYTES_OR_UNKNOWN, null=True)),
        "fixed_state_bytes": maybe(_BYTES_OR_UNKNOWN),
        "latent_attention": maybe(_LATENT),
        "cross_bytes_per_prompt_token": maybe(_BYTES_OR_UNKNOWN),
        "weights": maybe(Text(null=True)),  # where the weights came from, when that matters to the numbers
        "server": maybe(Text(null=True)),  # a served request's: the server's address and its model's id
        "model_id": maybe(Text(null=True)),
    },
    rules=(_card_adds_up,),
    extra=Json(depth=2),
    what="a model card (an object)",
)

# generation settings (`kvviz.engine.decode.GenerationSettings`), also a conversation's
SETTINGS = Record(  # null: unknown (a non-finite number is saved as null)
    {
        "max_new_tokens": maybe(Int(0, MAX_POSITIONS, null=True, what="a number of tokens")),
        "temperature": maybe(Number(0, null=True, what="a temperature (0: greedy)")),
        "top_k": maybe(Int(0, null=True, what="a top-k (0: off)")),
        "top_p": maybe(Number(0, 1, null=True, what="a top-p")),
        "seed": maybe(Int(0, null=True, what="a seed")),
        "raw": maybe(Flag(null=True)),
        "stop_at_eos": maybe(Flag(null=True)),
    },
    extra=Json(depth=1),
    what="an object of generation settings",
)

STRATEGY = Record(
    {"name": Text(nonempty=True), "options": optional(_OPTIONS, {})},
    rules=(options_rule("name"),),
    what="an object with the strategy's name and options",
)

_SWITCH = Record(
    {"step": Int(0), "from_strategy": Text(), "to_strategy": Text(), "options": optional(_OPTIONS, {})},
    rules=(options_rule("to_strategy"),),
    what="a switch record (an object with step, from_strategy, to_strategy, options)",
)


def _layer_total(layer: dict) -> int:
    """Keys, values, indexer keys, fixed state and cross-attention of a layer record (`LayerRecord.total_bytes`)."""
    return sum(layer[name] for name in ("keys_bytes", "values_bytes", "indexer_bytes", "state_bytes", "cross_bytes"))


def _step_adds_up(step: dict, where) -> None:
    layers = step["layers"]
    for j, layer in enumerate(layers):
        total = _layer_total(layer)
        if layer["storage"] and sum(layer["storage"].values()) != total:
            raise Refusal(
                at(where, "layers", j, "storage"),
                f"byte counts by kind that add up to the layer's bytes ({total:,})",
                sum(layer["storage"].values()),
            )
        if layer["seq_len"] > layer["capacity"]:
            raise Refusal(
                at(where, "layers", j, "seq_len"),
                f"at most the layer's capacity ({layer['capacity']:,} slots)",
                layer["seq_len"],
            )
    if step["cache_bytes"] is not None:
        total = sum(_layer_total(layer) for layer in layers)
        if step["cache_bytes"] != total:
            raise Refusal(
                at(where, "cache_bytes"),
                f"the sum of the layers' bytes ({total:,})",
                step["cache_bytes"],
            )
    shares = step["attention_sink"]
    if shares is not None and layers and len(shares) != len(layers):
        raise Refusal(at(where, "attention_sink"), f"one share per layer ({len(layers):,})", shares)
    if step["kl"] is not None and step["top1_agree"] is None:
        raise Refusal(at(where, "top1_agree"), "true or false (the step has a reference KL)", None)


_STEP = Record(
    {
        "index": Int(0),
        "phase": Text(("prefill", "decode")),
        "token_id": Int(-1, null=True, what="a token id (-1 or null: unknown)"),  # -1: what older kvviz wrote
        "token": Text(),
        "wall_ms": _MS,
        "cache_bytes": _BYTES_OR_UNKNOWN,
        "predicted_cache_bytes": _BYTES_OR_UNKNOWN,
        "rss_bytes": _BYTES_OR_UNKNOWN,
        "strategy": optional(Text(nonempty=True, null=True)),  # absent: the trace's strategy
        "layers": ListOf(_LAYER),
        "cuda_bytes": optional(_BYTES_OR_UNKNOWN),
        "position": optional(Int(0), 0),
        "kl": optional(Number(0, null=True, what="a KL divergence in nats")),
        "top1_agree": optional(Flag(null=True)),
        "ref_logprob": optional(Number(max=0, null=True, what="a log-probability")),
        "reference_ms": optional(_MS_OR_UNKNOWN),
        "scoring_ms": optional(_MS_OR_UNKNOWN),
        "policy_bytes": optional(_BYTES_OR_UNKNOWN),  # absent in files written before kvviz measured it
        "predicted_policy_bytes": optional(_BYTES_OR_UNKNOWN),
        # a share of a softmax's mass: 1 give or take float rounding
        "attention_sink": optional(ListOf(Number(0, 1.001, what="a share of attention"), null=True)),
        # per pinned span, per layer (null: a layer without tokens), per KV head: the span's tokens held
        "pins_held": optional(ListOf(ListOf(ListOf(_POSITIONS, null=True)), null=True)),
        "peak_allocated_bytes": optional(_BYTES_OR_UNKNOWN),
        "allocations": optional(ListOf(Pair(_MS, Int(0, MAX_BYTES), what="point [ms, bytes allocated]"), null=True)),
    },
    rules=(_step_adds_up,),
    what="a step record (an object)",
)


def _steps_in_order(trace: dict, where) -> None:
    """Steps numbered 0, 1, ... with positions that only grow, each layer's positions within the run's."""
    prompt = trace["prompt_tokens"]
    width = None
    previous = 0
    for i, step in enumerate(trace["steps"]):
        here = at(where, "steps", i)
        if step["index"] != i:
            raise Refusal(at(here, "index"), f"{i} (steps are numbered 0, 1, 2, ... in order)", step["index"])
        seen = prompt + i  # tokens the model had been fed when this step was measured
        if step["position"] > seen or step["position"] < previous:
            raise Refusal(
                at(here, "position"),
                f"a position from {previous:,} to prompt_tokens + index ({seen:,})",
                step["position"],
            )
        previous = step["position"]
        if width is not None and len(step["layers"]) != width:
            raise Refusal(at(here, "layers"), f"{width} layer records, as in the steps before", step["layers"])
        width = len(step["layers"])
        for j, layer in enumerate(step["layers"]):
            _layer_within(layer, seen, at(here, "layers", j))


def _layer_within(layer: dict, seen: int, where) -> None:
    if layer["seq_len"] > seen:
        raise Refusal(at(where, "seq_len"), f"at most the {seen:,} tokens fed so far", layer["seq_len"])
    held = preallocated = 0
    for state, count in layer["spans"]:
        if state == SlotState.PREALLOCATED:
            preallocated += count
        else:
            held += count
    if held > seen:
        raise Refusal(
            at(where, "spans"),
            f"spans covering at most the {seen:,} positions fed so far (they cover {held:,})",
            show_found=False,
        )
    if preallocated > layer["capacity"]:
        raise Refusal(
            at(where, "spans"),
            f"at most capacity ({layer['capacity']:,}) preallocated slots (there are {preallocated:,})",
            show_found=False,
        )
    per_head = sum(count for _, count in layer["head_spans"] or ())
    if per_head > seen:
        raise Refusal(
            at(where, "head_spans"),
            f"head spans covering at most the {seen:,} positions fed so far (they cover {per_head:,})",
            show_found=False,
        )


def _pieces_match_prompt(trace: dict, where) -> None:
    pieces = trace["prompt_pieces"]
    if pieces and len(pieces) != trace["prompt_tokens"]:
        raise Refusal(
            at(where, "prompt_pieces"),
            f"one text per prompt token ({trace['prompt_tokens']:,}) or none (there are {len(pieces):,})",
            show_found=False,
        )


def _pins_in_prompt(trace: dict, where) -> None:
    """Pinned spans lie in the prompt, and every step that says what they hold says it for each."""
    for i, pin in enumerate(trace["pins"]):
        if not 0 <= pin["start"] < pin["end"] <= trace["prompt_tokens"]:
            raise Refusal(at(where, "pins", i), f"a span [start, end) with start < end <= prompt_tokens "
                          f"({trace['prompt_tokens']:,})", [pin["start"], pin["end"]])
    for i, step in enumerate(trace["steps"]):
        held = step["pins_held"]
        if held is not None and len(held) != len(trace["pins"]):
            raise Refusal(at(where, "steps", i, "pins_held"), f"one entry per pinned span ({len(trace['pins'])})",
                          show_found=False)
        for pin, counts in zip(trace["pins"], held or (), strict=False):
            if any(count > pin["end"] - pin["start"] for layer in counts if layer for count in layer):
                raise Refusal(at(where, "steps", i, "pins_held"), "counts of at most the span's tokens",
                              show_found=False)


_PIN = Record({"start": _POSITIONS, "end": _POSITIONS, "label": optional(Text(), "")},
              what="a pinned span (an object with start and end)")


def _switches_in_order(trace: dict, where) -> None:
    last = 0
    for i, switch in enumerate(trace["switches"]):
        if not last <= switch["step"] <= len(trace["steps"]):
            raise Refusal(
                at(where, "switches", i, "step"),
                f"a step from {last} to the number of steps ({len(trace['steps'])}), in order",
                switch["step"],
            )
        last = switch["step"]


_TRACE = Record(
    {
        "model": MODEL_CARD,
        "strategy": STRATEGY,
        "prompt": optional(Text(), ""),
        "prompt_tokens": _POSITIONS,
        "prompt_pieces": optional(ListOf(Text()), []),
        "settings": optional(SETTINGS, {}),
        "cancelled": optional(Flag(), False),
        "compile_ms": optional(_MS_OR_UNKNOWN),
        "warm_up_ms": optional(_MS_OR_UNKNOWN),
        "error": optional(Text(null=True)),
        # the memory-bound floor's inputs
        "weight_bytes": optional(_BYTES_OR_UNKNOWN),
        "bandwidth_bytes_per_s": optional(Number(0, null=True, what="bytes per second")),
        "switches": optional(ListOf(_SWITCH), []),
        "pins": optional(ListOf(_PIN), []),
        "steps": ListOf(_STEP),
        "summary": optional(Json(depth=3)),  # what the steps give: checked against them (`FileFormat.summary`)
    },
    rules=(_steps_in_order, _switches_in_order, _pieces_match_prompt, _pins_in_prompt),
)


def _build(data: dict) -> Trace:
    name = data["strategy"]["name"]
    steps = []
    for raw in data["steps"]:
        step = dict(raw, layers=[LayerRecord(**layer) for layer in raw["layers"]])
        step["strategy"] = step["strategy"] or name
        if step["token_id"] == -1:
            step["token_id"] = None
        steps.append(StepRecord(**step))
    return Trace(
        model=data["model"],
        strategy={"name": name, "options": data["strategy"]["options"]},
        prompt=data["prompt"],
        prompt_tokens=data["prompt_tokens"],
        prompt_pieces=data["prompt_pieces"],
        settings=data["settings"],
        steps=steps,
        switches=[Switch(**s) for s in data["switches"]],
        pins=[Pin(**p) for p in data["pins"]],
        cancelled=data["cancelled"],
        compile_ms=data["compile_ms"],
        warm_up_ms=data["warm_up_ms"],
        error=data["error"],
        weight_bytes=data["weight_bytes"],
        bandwidth_bytes_per_s=data["bandwidth_bytes_per_s"],
    )


def _from_journal(header: dict, lines: list, source: str) -> Trace:
    """The partial trace a killed run's journal holds (`TraceJournal`), said so in its error."""
    steps = [line["step"] for line in lines if isinstance(line, dict) and "step" in line]
    switches = [line["switch"] for line in lines if isinstance(line, dict) and "switch" in line]
    settings = header.get("settings")
    planned = settings.get("max_new_tokens") if isinstance(settings, dict) else None
    data = dict(header, steps=steps, switches=switches, cancelled=True,
                error=ended_without_saving(len(steps), planned if isinstance(planned, int) else None))
    return FILE_FORMAT.parse(data, source)


FILE_FORMAT = FileFormat(
    name=FORMAT,
    version=VERSION,
    kind="kvviz trace",
    schema=_TRACE,
    build=_build,
    error=TraceError,
    hints={"kvviz-attach": " (it is a server session: open it in the window or with `kvviz attach FILE`)"},
    from_journal=_from_journal,
    summary=Trace.summary,
)
