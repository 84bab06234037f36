"""kvpress's presses run for real on fixed prompts: what each kept, per layer and KV head, and what the model said.

Runs in the kvpress venv (packaging/kvpress/build-venv.sh: kvpress 0.5.5 on the transformers it pins), never in
kvviz's own, and imports nothing of kvviz. kvviz's tests (tests/kvpress) write a request, run this script on it and
compare what kvviz's strategies keep with what kvpress's presses kept.

    reference.py REQUEST.json ANSWER.json

The request names a model folder (safetensors), the prompts as token ids (so that both sides read the same tokens
whatever their tokenizers' versions do) and the cases: a press written as its kvpress class, its keyword arguments
and the presses it wraps (`{"class": "AdaKVPress", "kwargs": {...}, "press": {...}}`), with `budget`, the tokens
each layer keeps after the prefill, turned into kvpress's compression ratio for each prompt's length, and
`attention`, the attention implementation it needs (ObservedAttention: "eager").

A press compresses in a hook after each attention layer of the prefill, from that layer's input, keys, values and
attention; the prefill's own output does not depend on it. So each prompt is prefilled once per attention
implementation, and every press's own `forward_hook` is called after each layer on a cache of its own holding that
layer's keys and values, as `with press(model)` would call it on the one cache (`BasePress.__call__` also hands the
model to `post_init_from_model` and the rotary embedding to each attention module: done here too). KVzip, which
prefills and then reads the context again, runs alone under `with press(model)`. Then, as kvpress's own pipeline
does, each press's answer is decoded greedily on its cache with position ids that go on from the prompt's length
(under the press where it compresses during decoding: DecodingPress).

What a layer keeps is read from the cache itself: each key it holds is matched, bit for bit, with the keys the layer
was fed (keys are gathered, never recomputed, so the match is exact), less the keys a head-wise press masks (AdaKV,
KVzip: `module.masked_key_indices`). For ThinK, which zeroes key channels instead, the zeroed channels of each KV head
are written.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from importlib.metadata import version

import kvpress
import torch
from transformers import AutoModelForCausalLM, DynamicCache

KEYWORDS = ("class", "kwargs", "budget", "attention")


def build_press(spec: dict, model, length: int):
    """A kvpress press from its spec: class name, keyword arguments, and nested presses under any other key; each
    press with a budget compresses a prompt of `length` tokens to it."""
    kwargs = dict(spec.get("kwargs", {}))
    for key, value in spec.items():
        if key not in KEYWORDS and isinstance(value, dict):
            kwargs[key] = build_press(value, model, length)
    press = getattr(kvpress, spec["class"])(**kwargs)
    if isinstance(press, kvpress.KVzipPress):
        units = model.config.num_key_value_heads * (1 if press.layerwise else model.config.num_hidden_layers)
        press.compression_ratio = pruned_ratio(spec["budget"], length, units)
    elif "budget" in spec:
        press.compression_ratio = ratio_for(spec["budget"], length)
    return press


def ratio_for(budget: int, length: int) -> float:
    """kvpress's compression ratio that keeps exactly `budget` of `length` tokens (kvpress keeps
    int(length * (1 - ratio)), and float rounding may take one off)."""
    ratio = 1.0 - budget / length
    while int(length * (1 - ratio)) < budget:
        ratio = next_float(ratio, 0.0)
    return ratio


def next_float(value: float, toward: float) -> float:
    return float(torch.nextafter(torch.tensor(value, dtype=torch.float64), torch.tensor(toward, dtype=torch.float64)))


def pruned_ratio(budget: int, length: int, units: int) -> float:
    """The ratio at which a press that prunes int(units * length * ratio) of all its layers' and heads' pairs at once
    (KVzip) prunes units * (length - budget): `budget` per layer and KV head on average."""
    ratio, goal = 1.0 - budget / length, units * (length - budget)
    while int(units * length * ratio) != goal:
        ratio = next_float(ratio, 1.0 if int(units * length * ratio) < goal else 0.0)
    return ratio


def attention_modules(model):
    return [layer.self_attn for layer in model.model.layers]


def prepared(model, spec: dict, length: int):
    """The press of `spec`, its budget turned into a ratio for `length` tokens, set up on `model` as
    `BasePress.__call__` sets it up (without the hooks)."""
    press = build_press(spec, model, length)
    press.post_init_from_model(model)
    for module in attention_modules(model):
        module.rotary_emb = model.model.rotary_emb
    return press


def matched(fed: torch.Tensor, held: torch.Tensor, masked) -> list[list[int]]:
    """Per KV head, the sorted positions of the `held` keys ``[heads, held, dim]`` among the `fed` ones ``[heads,
    fed, dim]``, less the slots `masked` names (kvpress's masked_key_indices, or None)."""
    heads = []
    for head in range(fed.shape[0]):
        where = {row.numpy().tobytes(): position for position, row in enumerate(fed[head])}
        heads.append([where[row.numpy().tobytes()] for row in held[head]])
    if masked is not None:
        _, head_index, seq_index = masked
        for head, slot in zip(head_index.tolist(), seq_index.tolist(), strict=True):
            heads[head][slot] = None
    return [sorted(p for p in positions if p is not None) for positions in heads]


def zeroed_channels(cache, layers: int, prompt: int) -> list[list[list[int]]]:
    """Per layer and KV head, the key channels ThinK set to zero in the prompt's keys."""
    return [[torch.nonzero((head == 0).all(dim=0)).flatten().tolist() for head in cache.layers[i].keys[0, :, :prompt]]
            for i in range(layers)]


class Shared:
    """One prefill, after whose every attention layer each press's own hook compresses a cache of its own."""

    def __init__(self, model, presses: dict):
        self.presses = presses
        self.caches = {name: DynamicCache() for name in presses}
        self.masked = {name: {} for name in presses}  # per press and layer: what a head-wise press masks
        self.fed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per layer: the prompt's keys and values
        self.hooks = [module.register_forward_hook(self.hook, with_kwargs=True) for module in attention_modules(model)]

    def hook(self, module, args, kwargs, output):
        index = module.layer_idx
        layer = kwargs["past_key_values"].layers[index]
        self.fed[index] = (layer.keys.clone(), layer.values.clone())
        for name, press in self.presses.items():
            cache = self.caches[name]
            cache.update(layer.keys.clone(), layer.values.clone(), index)
            module.masked_key_indices = None
            press.forward_hook(module, args, {**kwargs, "past_key_values": cache}, output)
            self.masked[name][index] = getattr(module, "masked_key_indices", None)
        module.masked_key_indices = None
        return output

    def remove(self):
        for hook in self.hooks:
            hook.remove()


class DecodeLog:
    """The keys each layer is fed while decoding, taken by a hook that runs before any press's."""

    def __init__(self, model):
        self.keys: dict[int, list[torch.Tensor]] = {}
        self.hooks = [module.register_forward_hook(self.hook, with_kwargs=True) for module in attention_modules(model)]

    def hook(self, module, args, kwargs, output):
        layer = kwargs["past_key_values"].layers[module.layer_idx]
        self.keys.setdefault(module.layer_idx, []).append(layer.keys[:, :, -1:].clone())

    def remove(self):
        for hook in self.hooks:
            hook.remove()


def decode(model, press, cache, masked: dict, first: int, position: int, steps: int, prompt_keys: dict) -> dict:
    """Greedy tokens after `first` on `cache`, with `masked` set on each attention module; and for a press that
    compresses while decoding, what each layer holds at the end."""
    for module in attention_modules(model):
        module.masked_key_indices = masked.get(module.layer_idx)
    decoding = isinstance(press, (kvpress.DecodingPress, kvpress.PrefillDecodingPress))
    log = DecodeLog(model)
    tokens = [first]
    try:
        with press(model) if decoding else contextlib.nullcontext():
            for step in range(steps):
                logits = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache,
                               position_ids=torch.tensor([[position + step]]), logits_to_keep=1).logits
                tokens.append(int(logits[0, -1].argmax()))
    finally:
        log.remove()
        for module in attention_modules(model):
            module.masked_key_indices = None
    answer = {"tokens": tokens}
    if decoding:
        answer["kept_after_decoding"] = [
            matched(torch.cat([prompt_keys[i], *log.keys[i]], dim=2)[0], cache.layers[i].keys[0],
                    getattr(module, "masked_key_indices", None))
            for i, module in enumerate(attention_modules(model))]
    return answer


def run_shared(model, ids: torch.Tensor, cases: list[dict], attention: str, new_tokens: int) -> list[dict]:
    model.set_attn_implementation(attention)
    presses = {case["id"]: prepared(model, case["press"], ids.shape[1]) for case in cases}
    shared = Shared(model, presses)
    started = time.perf_counter()
    try:
        with torch.inference_mode():
            logits = model(input_ids=ids, past_key_values=DynamicCache(), logits_to_keep=1).logits
    finally:
        shared.remove()
    seconds = time.perf_counter() - started
    first = int(logits[0, -1].argmax())
    prompt_keys = {i: keys for i, (keys, _) in shared.fed.items()}
    answers = []
    for case in cases:
        name, press, cache = case["id"], presses[case["id"]], shared.caches[case["id"]]
        answer = {"case": name, "seconds_shared_prefill": seconds}
        if isinstance(press, kvpress.ThinKPress):
            answer["zeroed_channels"] = zeroed_channels(cache, len(prompt_keys), ids.shape[1])
        else:
            answer["kept"] = [matched(prompt_keys[i][0], cache.layers[i].keys[0], shared.masked[name][i])
                              for i in range(len(prompt_keys))]
        with torch.inference_mode():
            answer |= decode(model, press, cache, shared.masked[name], first, ids.shape[1], new_tokens - 1,
                             prompt_keys)
        answers.append(answer)
    return answers


def run_alone(model, ids: torch.Tensor, case: dict, new_tokens: int) -> dict:
    """A press that does more than a hook after each layer (KVzip reads the context again): under its context."""
    model.set_attn_implementation(case["press"].get("attention", "sdpa"))
    press = prepared(model, case["press"], ids.shape[1])
    cache = DynamicCache()
    started = time.perf_counter()
    with torch.inference_mode():
        with press(model):
            logits = model(input_ids=ids, past_key_values=cache, logits_to_keep=1).logits
            prompt_keys = {i: cache.layers[i].keys.clone() for i in range(len(cache.layers))}
        seconds = time.perf_counter() - started
        masked = {module.layer_idx: getattr(module, "masked_key_indices", None) for module in attention_modules(model)}
        kept = [matched(prompt_keys[i][0], cache.layers[i].keys[0], masked[i]) for i in range(len(prompt_keys))]
        answer = decode(model, press, cache, masked, int(logits[0, -1].argmax()), ids.shape[1], new_tokens - 1,
                        prompt_keys)
    return {"case": case["id"], "seconds_prefill": seconds, "kept": kept, **answer}


ALONE = ("KVzipPress",)


def main(request_path: str, answer_path: str) -> int:
    with open(request_path) as file:
        request = json.load(file)
    dtype = getattr(torch, request.get("dtype", "float32"))
    model = AutoModelForCausalLM.from_pretrained(request["model"], dtype=dtype, attn_implementation="sdpa")
    model.eval()
    new_tokens = request.get("max_new_tokens", 12)
    answers = {"kvpress": version("kvpress"), "transformers": version("transformers"), "torch": torch.__version__,
               "results": []}
    for prompt in request["prompts"]:
        ids = torch.tensor([prompt["ids"]])
        started = time.perf_counter()
        cases = [case for case in request["cases"] if case["id"] in prompt.get("only", [case["id"]])]
        alone = [case for case in cases if case["press"]["class"] in ALONE]
        shared = [case for case in cases if case not in alone]
        results = [run_alone(model, ids, case, new_tokens) for case in alone]
        for attention in sorted({case["press"].get("attention", "sdpa") for case in shared}):
            group = [case for case in shared if case["press"].get("attention", "sdpa") == attention]
            results += run_shared(model, ids, group, attention, new_tokens)
        answers["results"] += [{"prompt": prompt["name"], **result} for result in results]
        print(f"{prompt['name']}: {len(results)} presses in {time.perf_counter() - started:.1f} s", file=sys.stderr,
              flush=True)
    with open(answer_path, "w") as out:
        json.dump(answers, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
