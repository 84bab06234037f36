"""A fuzz corpus of damaged (and still valid) trace files, built from real traces, deterministically.

`base_traces(model)` decodes two short real runs on the tiny model (sink with a reference; static
switched to sliding), `mutants(bases, folder)` writes several hundred variants of them into folder:
dropped keys, wrong types, NaN/Infinity, negative and huge numbers, bytes that do not add up, absurd
positions, truncation at random offsets, other encodings, deep nesting, a folder, a symlink loop, a
FIFO, a file over the size limit. Each `Mutant` says whether kvviz must refuse or accept it and, for
a refusal of one field, the field path the message must name.
"""

from __future__ import annotations

import copy
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvviz.files.jsonfile import MAX_FILE_BYTES, encode_json
from kvviz.files.trace import SlotState, from_dict

HUGE_DIGITS = "__HUGE_DIGITS__"  # stands for a 5,000-digit number, which json.dumps cannot write


@dataclass
class Mutant:
    name: str
    path: Path
    expect: str  # "refuse" or "accept"
    where: str | None = None  # the field path a refusal must name


def base_traces(model) -> list[dict]:
    from kvviz.engine import decode, strategies

    settings = decode.GenerationSettings(max_new_tokens=8, stop_at_eos=False)
    sink = decode.Decoder(model, strategies.choose("sink", {"window": "4", "sink_tokens": "2"}), settings,
                          "trace me", reference=True)
    list(sink)
    static = decode.Decoder(model, strategies.choose("static", {}), settings, "and me")
    for step in static:
        if step.index == 3:
            static.request_switch(strategies.choose("sliding", {"window": "4"}))
    return [sink.trace.to_dict(), static.trace.to_dict()]


# field -> (kind, nullable) of the trace format, by where it sits
TOP = {"model": ("dict", False), "strategy": ("dict", False), "prompt_tokens": ("int", False),
       "steps": ("list", False), "prompt": ("str", True), "settings": ("dict", True), "cancelled": ("bool", True),
       "compile_ms": ("float", True), "error": ("str", True), "switches": ("list", True)}
STEP = {"index": ("int", False), "phase": ("str", False), "token_id": ("int", True), "token": ("str", False),
        "wall_ms": ("float", False), "cache_bytes": ("int", True), "predicted_cache_bytes": ("int", True),
        "rss_bytes": ("int", True), "layers": ("list", False), "strategy": ("str", True),
        "cuda_bytes": ("int", True), "position": ("int", False), "kl": ("float", True),
        "top1_agree": ("bool", True), "ref_logprob": ("float", True), "reference_ms": ("float", True)}
LAYER = {"keys_bytes": ("int", False), "values_bytes": ("int", False), "seq_len": ("int", False),
         "capacity": ("int", False), "layer_ms": ("float", True), "storage": ("dict", False),
         "spans": ("list", False)}
SWITCH = {"step": ("int", False), "from_strategy": ("str", False), "to_strategy": ("str", False),
          "options": ("dict", False)}
REQUIRED = {"top": ["model", "strategy", "prompt_tokens", "steps"],
            "step": ["index", "phase", "token_id", "token", "wall_ms", "cache_bytes", "predicted_cache_bytes",
                     "rss_bytes", "layers"],
            "layer": ["keys_bytes", "values_bytes", "seq_len", "capacity"],
            "switch": ["step", "from_strategy", "to_strategy"]}
WRONG = {"int": ["12", 1.5, True, [], {}], "float": ["1.0", True, [], {}, "fast"], "str": [7, True, [], {}, 1.5],
         "bool": ["true", 1, 0, []], "list": [{}, "x", 3, True], "dict": [[], "x", 3, True]}
# fields that must be >= 0 (token_id may be -1: what older kvviz wrote for unknown)
NON_NEGATIVE = {"prompt_tokens", "index", "wall_ms", "cache_bytes", "predicted_cache_bytes", "rss_bytes",
                "cuda_bytes", "position", "kl", "reference_ms", "keys_bytes", "values_bytes", "seq_len", "capacity",
                "layer_ms", "compile_ms"}


class _Writer:
    def __init__(self, folder: Path):
        self.folder = folder
        self.made: list[Mutant] = []

    def _path(self, name: str) -> Path:
        return self.folder / f"m{len(self.made):04d}-{name}.json"

    def data(self, name: str, data: Any, expect: str, where: str | None = None) -> None:
        if expect == "accept" and "summary" in data:  # a valid change to the steps changes what they sum up to
            data = dict(data, summary=_summary_of(data))
        text = json.dumps(data)  # allow_nan: NaN and Infinity literals go in as written
        path = self._path(name)
        path.write_text(text.replace(f'"{HUGE_DIGITS}"', "1" + "0" * 5000), encoding="utf-8")
        self.made.append(Mutant(name, path, expect, where))

    def raw(self, name: str, content: bytes, expect: str = "refuse", where: str | None = None) -> None:
        path = self._path(name)
        path.write_bytes(content)
        self.made.append(Mutant(name, path, expect, where))

    def special(self, name: str, make) -> None:
        path = self._path(name)
        make(path)
        self.made.append(Mutant(name, path, "refuse"))


def _summary_of(data: dict) -> dict:
    """The summary a valid trace's steps give, as a saved file holds it (non-finite figures as null)."""
    steps_only = {key: value for key, value in data.items() if key != "summary"}
    return json.loads(encode_json(from_dict(steps_only).summary()))


def _places(data: dict, rng: random.Random) -> dict[str, tuple[list, str]]:
    """For each kind of record, one (address, path text) picked at random: address is the key list."""
    steps = data["steps"]
    i = rng.randrange(len(steps))
    j = rng.randrange(len(steps[i]["layers"]))
    places = {"top": ([], ""), "step": (["steps", i], f"steps[{i}]"),
              "layer": (["steps", i, "layers", j], f"steps[{i}].layers[{j}]")}
    if data.get("switches"):
        places["switch"] = (["switches", 0], "switches[0]")
    return places


def _get(data, address):
    for key in address:
        data = data[key]
    return data


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def mutants(bases: list[dict], folder: Path, seed: int = 16) -> list[Mutant]:
    rng = random.Random(seed)
    out = _Writer(folder)
    fields = {"top": TOP, "step": STEP, "layer": LAYER, "switch": SWITCH}
    for b, base in enumerate(bases):
        out.data(f"b{b}-as-is", base, "accept")
        for rounds in range(3):  # three different random steps and layers per base
            places = _places(base, rng)
            for kind, (address, path) in places.items():
                for key, (value_kind, nullable) in fields[kind].items():
                    if key not in _get(base, address):
                        continue
                    where = _join(path, key)
                    if rounds == 0 and key in REQUIRED[kind]:
                        _mutate(out, base, address, key, None, f"b{b}-drop-{key}", "refuse", where, drop=True)
                    for wrong in WRONG[value_kind][rounds::3] if rounds else WRONG[value_kind]:
                        _mutate(out, base, address, key, wrong, f"b{b}-type-{key}", "refuse", where)
                    if value_kind in ("int", "float"):
                        specials = [float("nan"), float("inf"), -float("inf"), 10**30, HUGE_DIGITS]
                        for value in specials if rounds == 0 else specials[rounds - 1 :: 2]:
                            _mutate(out, base, address, key, value, f"b{b}-num-{key}", "refuse", where)
                        if key in NON_NEGATIVE:
                            _mutate(out, base, address, key, -1 - rounds, f"b{b}-neg-{key}", "refuse", where)
                    if rounds == 0 and nullable:  # null is "unknown", except for a reference's agreement
                        refused = key == "top1_agree" and _get(base, address).get("kl") is not None
                        _mutate(out, base, address, key, None, f"b{b}-null-{key}", "refuse" if refused else "accept",
                                where if refused else None)
        _cross_field(out, base, b, rng)
        _valid_variants(out, base, b)
        _truncations(out, base, b, rng, count=60)
        _encodings(out, base, b, rng)
    _file_level(out, bases[0])
    return out.made


def _mutate(out, base, address, key, value, name, expect, where, drop=False):
    data = copy.deepcopy(base)
    record = _get(data, address)
    if drop:
        del record[key]
    else:
        record[key] = value
    out.data(name, data, expect, None if value == HUGE_DIGITS else where)  # that one fails as JSON already


def _cross_field(out: _Writer, base: dict, b: int, rng: random.Random) -> None:
    """Values that pass one by one and are nonsense together."""
    last = len(base["steps"]) - 1

    def variant(name, where, change):
        data = copy.deepcopy(base)
        change(data)
        out.data(f"b{b}-{name}", data, "refuse", where)

    i = rng.randrange(len(base["steps"]))
    variant("cache-off-by-one", f"steps[{i}].cache_bytes",
            lambda d: d["steps"][i].update(cache_bytes=d["steps"][i]["cache_bytes"] + 1))
    variant("storage-not-adding-up", f"steps[{i}].layers[0].storage",
            lambda d: d["steps"][i]["layers"][0]["storage"].update(full=1))
    variant("storage-unknown-kind", f"steps[{i}].layers[0].storage.gpu",
            lambda d: d["steps"][i]["layers"][0]["storage"].update(gpu=0))
    variant("storage-a-list", f"steps[{i}].layers[0].storage",
            lambda d: d["steps"][i]["layers"][0].update(storage=[1, 2]))
    variant("span-unknown-state", f"steps[{i}].layers[1].spans[0][0]",
            lambda d: d["steps"][i]["layers"][1]["spans"][0].__setitem__(0, max(SlotState) + 1))
    variant("span-not-a-pair", f"steps[{i}].layers[1].spans[0]",
            lambda d: d["steps"][i]["layers"][1]["spans"][0].append(1))
    variant("spans-beyond-the-run", f"steps[{i}].layers[0].spans",
            lambda d: d["steps"][i]["layers"][0]["spans"].append([2, 50]))
    variant("billion-positions", f"steps[{last}].layers[0].spans[0][1]",
            lambda d: d["steps"][last]["layers"][0].update(spans=[[2, 10**9]]))
    variant("billion-slots", f"steps[{last}].layers[0].seq_len",
            lambda d: d["steps"][last]["layers"][0].update(seq_len=10**9, capacity=10**9))
    variant("billion-prompt-tokens", "prompt_tokens", lambda d: d.update(prompt_tokens=10**9))
    variant("seq-len-over-capacity", f"steps[{i}].layers[0].seq_len",
            lambda d: d["steps"][i]["layers"][0].update(capacity=0))
    def ragged(d):
        step = d["steps"][last]
        gone = step["layers"].pop()
        step["cache_bytes"] -= gone["keys_bytes"] + gone["values_bytes"]
    variant("ragged-layers", f"steps[{last}].layers", ragged)
    variant("steps-swapped", "steps[0].index", lambda d: d["steps"].insert(0, d["steps"].pop(1)))
    variant("step-duplicated", f"steps[{last + 1}].index", lambda d: d["steps"].append(d["steps"][-1]))
    variant("position-ahead", f"steps[{i}].position",
            lambda d: d["steps"][i].update(position=d["prompt_tokens"] + i + 1))
    variant("phase-unknown", f"steps[{i}].phase", lambda d: d["steps"][i].update(phase="warmup"))
    variant("switches-true", "switches", lambda d: d.update(switches=True))
    variant("switches-of-numbers", "switches[0]", lambda d: d.update(switches=[1, 2]))
    variant("switch-after-the-end", "switches[0].step",
            lambda d: d.update(switches=[{"step": 99, "from_strategy": "a", "to_strategy": "b", "options": {}}]))
    variant("token-lone-surrogate", f"steps[{i}].token", lambda d: d["steps"][i].update(token="\ud800"))
    variant("settings-nan", "settings.temperature", lambda d: d["settings"].update(temperature=float("nan")))
    nested: Any = 1
    for _ in range(60):
        nested = {"a": nested}
    variant("settings-nested", "settings.deep.a", lambda d: d["settings"].update(deep=nested))
    variant("card-nested", "model.extra.a.a", lambda d: d["model"].update(extra=nested))
    variant("strategy-name-empty", "strategy.name", lambda d: d["strategy"].update(name=""))
    variant("token-id-minus-two", f"steps[{i}].token_id", lambda d: d["steps"][i].update(token_id=-2))
    variant("ref-logprob-positive", f"steps[{i}].ref_logprob", lambda d: d["steps"][i].update(ref_logprob=0.5))
    variant("wall-ms-a-year", f"steps[{i}].wall_ms", lambda d: d["steps"][i].update(wall_ms=3.2e10))
    variant("format-missing", None, lambda d: d.pop("format"))
    variant("version-2", None, lambda d: d.update(version=2))
    variant("version-text", None, lambda d: d.update(version="1"))


def _valid_variants(out: _Writer, base: dict, b: int) -> None:
    """Changes a reader must take: optional fields left out or null, unknown fields, other spellings."""

    def variant(name, change):
        data = copy.deepcopy(base)
        change(data)
        out.data(f"b{b}-ok-{name}", data, "accept")

    for key in ("summary", "settings", "compile_ms", "error", "cancelled", "prompt"):
        variant(f"no-{key}", lambda d, k=key: d.pop(k))
    for key in ("strategy", "cuda_bytes", "position", "layers-ms", "storage", "spans"):
        def drop(d, k=key):
            for step in d["steps"]:
                if k in ("strategy", "cuda_bytes", "position"):
                    step.pop(k)
                else:
                    for layer in step["layers"]:
                        layer.pop(k.replace("layers-ms", "layer_ms"))
        variant(f"no-{key}", drop)

    def no_reference(d):
        for step in d["steps"]:
            for k in ("kl", "top1_agree", "ref_logprob", "reference_ms"):
                step.pop(k)
    variant("no-reference", no_reference)

    def unknown_bytes(d):
        for step in d["steps"]:
            step.update(cache_bytes=None, predicted_cache_bytes=None, rss_bytes=None, token_id=None)
    variant("served-unknowns", unknown_bytes)
    variant("served-old-token-id", lambda d: [s.update(token_id=-1) for s in d["steps"]])
    variant("extra-fields", lambda d: (d.update(future={"x": 1}), d["steps"][0].update(future=[1, 2]),
                                       d["steps"][0]["layers"][0].update(future="yes")))
    variant("no-steps", lambda d: (d.update(steps=[], switches=[])))
    variant("cancelled", lambda d: d.update(cancelled=True, error="stopped by the user"))
    variant("unicode-token", lambda d: d["steps"][-1].update(token="héllo ✓ 🙂 \u0000"))
    variant("integer-times", lambda d: [s.update(wall_ms=round(s["wall_ms"]) + 1) for s in d["steps"]])
    variant("reference-null", lambda d: [s.update(kl=None, top1_agree=None, ref_logprob=None) for s in d["steps"]])
    pretty = json.dumps(base, indent=2)
    out.raw(f"b{b}-ok-indented", pretty.encode("utf-8"), expect="accept")
    out.raw(f"b{b}-ok-utf8-bom", b"\xef\xbb\xbf" + json.dumps(base).encode("utf-8"), expect="accept")
    out.raw(f"b{b}-ok-keys-reversed", json.dumps(dict(reversed(list(base.items())))).encode("utf-8"),
            expect="accept")


def _truncations(out: _Writer, base: dict, b: int, rng: random.Random, count: int) -> None:
    text = json.dumps(base).encode("utf-8")
    for offset in sorted(rng.sample(range(len(text)), count)):
        out.raw(f"b{b}-cut-at-{offset}", text[:offset])


def _encodings(out: _Writer, base: dict, b: int, rng: random.Random) -> None:
    data = copy.deepcopy(base)
    data["steps"][0]["token"] = "café ñ"
    text = json.dumps(data, ensure_ascii=False)
    out.raw(f"b{b}-utf16-bom", text.encode("utf-16"))
    out.raw(f"b{b}-utf16le-no-bom", text.encode("utf-16-le"))
    out.raw(f"b{b}-utf32", text.encode("utf-32"))
    out.raw(f"b{b}-latin1", text.encode("latin-1"))
    raw = text.encode("utf-8")
    for n in range(6):  # bytes that cannot be UTF-8, at random places
        at = rng.randrange(len(raw))
        out.raw(f"b{b}-bad-byte-{n}", raw[:at] + bytes([rng.choice([0x80, 0xC0, 0xFF, 0xFE])]) + raw[at:])


def _file_level(out: _Writer, base: dict) -> None:
    out.raw("empty", b"")
    out.raw("whitespace", b"   \n\t ")
    out.raw("png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    for text in ("null", "[]", "{}", '"kvviz-trace"', "42", '{"format": "chrome-trace"}', "[1, 2]",
                 '{"format": "kvviz-trace"}', '{"format": "kvviz-attach", "version": 1}', "NaN"):
        out.raw("json-" + "".join(c for c in text if c.isalnum())[:20], text.encode())
    out.raw("deep-lists", b"[" * 100_000 + b"]" * 100_000)
    out.raw("deep-objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000)
    text = json.dumps(dict(base, prompt_tokens=1)).replace('"prompt_tokens": 1,', '"prompt_tokens": 1e400,')
    out.raw("exponent-beyond-float", text.encode(), where="prompt_tokens")
    out.special("a-folder", lambda p: p.mkdir())
    out.special("symlink-loop", lambda p: (os.symlink(p.name + ".other", p),
                                           os.symlink(p.name, p.with_name(p.name + ".other"))))
    out.special("dangling-symlink", lambda p: os.symlink("no-such-target.json", p))
    out.special("fifo", lambda p: os.mkfifo(p))
    out.special("missing", lambda p: None)

    def big(p: Path) -> None:  # sparse: over the limit without using the disk
        with open(p, "wb") as f:
            f.write(b'{"format": "kvviz-trace", "version": 1, "x": "')
            f.truncate(MAX_FILE_BYTES + 1)
    out.special("over-the-size-limit", big)
