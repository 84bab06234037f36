"""transformers' QuantizedCache (KIVI-style): old tokens quantized, the newest in a full-precision residual."""

import importlib.util
import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kvviz.engine.geometry import Geometry
from kvviz.engine.predict import CachePredictor
from kvviz.engine.strategies.base import (
    PREFILL_CHUNK,
    Option,
    Strategy,
    attention_layers_problem,
    keep_own_layers,
    only_full_attention,
)
from kvviz.errors import OptionError

NBITS = {"quanto": (2, 4), "hqq": (1, 2, 3, 4, 8)}
AXES = {"quanto": (0, -1), "hqq": (0, 1)}
PACKAGES = {"quanto": "optimum.quanto", "hqq": "hqq"}
LAYER_CLASSES = {"quanto": "QuantoQuantizedLayer", "hqq": "HQQQuantizedLayer", "fp8": "Fp8QuantizedLayer"}
GROUP_WISE = ("nbits", "axis_key", "axis_value", "q_group_size", "residual_length")


def quantized_bytes(geometry: Geometry, tokens: int, backend: str, nbits: int, group_size: int) -> int:
    """Keys or values of `tokens` tokens in one layer after quantization, with scales and zero points.

    quanto and HQQ pack `nbits` per element and keep one scale and one zero point (in the model's
    dtype) per group of `group_size` elements; HQQ packs 3-bit values ten to an int32. fp8 keeps one
    byte per element and a float32 scale per tensor.
    """
    if tokens == 0:
        return 0
    elements = geometry.batch * geometry.values_per_token * tokens
    if backend == "fp8":
        return elements + 4
    groups = math.ceil(elements / group_size)
    if backend == "hqq" and nbits == 3:
        payload = math.ceil(groups / 10) * group_size * 4
    else:
        payload = math.ceil(elements * nbits / 8)
    return payload + 2 * groups * geometry.element


class QuantizedPredictor(CachePredictor):
    """QuantizedLayer quantizes all it gets at the first update, then keeps new tokens in a residual
    until it reaches `residual_length` and quantizes everything again; fp8 quantizes every update."""

    def __init__(self, geometry, options):
        super().__init__(geometry)
        self.options = options
        self.quantized = [0] * geometry.num_layers  # per layer: tokens held quantized
        self.residual = [0] * geometry.num_layers  # per layer: tokens held in full precision

    def advance(self, i, new, received) -> None:
        if self.options["backend"] == "fp8" or self.seen[i] == new:  # fp8, or the first update: all is quantized
            self.quantized[i] += new
        elif self.residual[i] + new >= self.options["residual_length"]:
            self.quantized[i] += self.residual[i] + new
            self.residual[i] = 0
        else:
            self.residual[i] += new

    def layer_bytes(self, i, window) -> int:
        if not self.geometry.layer_token_bytes[i]:  # a state layer: transformers' own, never quantized
            return 0
        o = self.options
        group = o.get("q_group_size", 64)
        q = quantized_bytes(self.geometry, self.quantized[i], o["backend"], o.get("nbits", 8), group)
        return 2 * (q + self.residual[i] * self.geometry.token_bytes)


class Quantized(Strategy):
    name = "quantized"
    description = "QuantizedCache (KIVI-style): old tokens quantized, the newest kept in a full-precision residual"
    reference = (
        "KIVI (Liu et al., ICML 2024) as transformers' QuantizedCache implements it: keys and values grouped alike "
        "(KIVI groups keys per channel, values per token)"
    )
    quantizes = True
    options = (
        Option("backend", "choice", "quanto", "quantization library", choices=("quanto", "hqq", "fp8")),
        Option("nbits", "int", 4, "bits per value (quanto: 2, 4; hqq: 1, 2, 3, 4, 8)", minimum=1, maximum=8),
        Option("residual_length", "int", 128, "tokens kept in full precision before quantizing", minimum=1),
        Option("q_group_size", "int", 64, "values sharing one scale and zero point", minimum=1),
        Option("axis_key", "int", 0, "axis along which keys are grouped", minimum=-1, maximum=1),
        Option("axis_value", "int", 0, "axis along which values are grouped", minimum=-1, maximum=1),
    )

    def feed_span(self, options, seen, chunk):
        # Every backend quantizes all of its first feed. After it, fp8 quantizes each token with the first feed's
        # scale, alone; quanto and HQQ keep tokens in a full-precision residual until a feed brings it to
        # residual_length, which quantizes everything with that feed's tokens, so a feed that ends there at the latest
        # leaves what one token at a time would, each of its tokens attending to the same dequantized keys
        if not seen:
            return 1
        if options["backend"] == "fp8":
            return chunk
        residual = options["residual_length"]
        return min(chunk, residual - (seen - 1) % residual)

    def parse_options(self, raw):
        # fp8 quantizes per tensor: the group-wise options mean nothing to it
        if str(raw.get("backend", "")) == "fp8":
            given = [k for k in GROUP_WISE if k in raw]
            if given:
                raise OptionError(
                    f"backend 'fp8' quantizes per tensor and takes no {given[0]!r}; "
                    "use backend=quanto or backend=hqq for group-wise options"
                )
            prompt = PREFILL_CHUNK.parse(raw[PREFILL_CHUNK.name], self.name) if PREFILL_CHUNK.name in raw else 0
            return {"backend": self.option("backend").parse(raw["backend"], self.name), PREFILL_CHUNK.name: prompt}
        return super().parse_options(raw)

    def check_options(self, options):
        backend = options["backend"]
        if backend == "fp8":
            return None
        module = PACKAGES[backend]
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return f"backend {backend!r} needs the Python package {module}, which is not installed"
        if options["nbits"] not in NBITS[backend]:
            accepted = ", ".join(map(str, NBITS[backend]))
            return f"option 'nbits' of backend {backend!r} must be one of {accepted}, not {options['nbits']}"
        for axis in ("axis_key", "axis_value"):
            if options[axis] not in AXES[backend]:
                accepted = ", ".join(map(str, AXES[backend]))
                return f"option {axis!r} of backend {backend!r} must be one of {accepted}, not {options[axis]}"
        return None

    def model_problem(self, model, geometry, options):
        problem = only_full_attention(geometry) or attention_layers_problem(geometry, "quantizes keys and values")
        if problem or options["backend"] == "fp8":
            return problem
        # quanto and HQQ cut a layer's whole [batch, kv_heads, tokens, head_dim] tensor into groups,
        # so a token's values must fill whole groups at every length
        per_token = geometry.values_per_token
        if per_token % options["q_group_size"]:
            return (
                f"cannot use q_group_size={options['q_group_size']} with this model: each token has {per_token} key "
                f"values per layer, which must be a multiple of the group size (try a divisor of {per_token})"
            )
        return None

    def warm_up(self, options, device, notify) -> bool:
        if options["backend"] != "quanto":
            return False
        import optimum.quanto  # noqa: F401 - registers quanto's operators

        # quanto builds its C++/CUDA kernels on their first use, once per install (about a minute); unpacking a
        # few bytes here keeps that out of the first decode step
        notify("loading quanto's kernels (the first time after installing, quanto builds them: about a minute)")
        torch.ops.quanto.unpack(torch.zeros(8, 2, dtype=torch.uint8, device=device), 4)
        return True

    def make_cache(self, model, options, capacity):
        from transformers import QuantizedCache, cache_utils

        backend = options["backend"]
        kwargs = {} if backend == "fp8" else {k: options[k] for k in GROUP_WISE}
        geometry = Geometry.of(model.config, model.dtype)
        if geometry.plain:
            return QuantizedCache(backend, model.config, **kwargs)
        # QuantizedCache takes models of full attention alone: its layer class on the attention layers of a hybrid,
        # transformers' own cache layers (a fixed-size state) on the others
        layer_class = getattr(cache_utils, LAYER_CLASSES[backend])
        layers = [layer_class(**kwargs) for _ in range(geometry.num_layers)]
        return cache_utils.Cache(layers=keep_own_layers(model, layers))

    def reading(self, cache):
        return dequantized_once(cache)

    def predictor(self, options, geometry, capacity):
        return QuantizedPredictor(geometry, options)


@contextmanager
def dequantized_once(cache) -> Iterator[None]:
    """Inside, each quantized layer of `cache` dequantizes what it holds quantized once per quantization, where
    transformers' QuantizedLayer dequantizes all of it at every update: between two quantizations those are the same
    tensors, so the same bits come back (and are never written to: the layer concatenates them)."""
    from transformers.cache_utils import QuantizedLayer

    layers = [layer for layer in getattr(cache, "layers", ()) if isinstance(layer, QuantizedLayer)]
    for layer in layers:
        layer._dequantize = _once(layer._dequantize)  # shadows the method on this object only
    try:
        yield
    finally:
        for layer in layers:
            del layer._dequantize


def _once(dequantize):
    """`dequantize`, remembering its result for the last two quantized tensors (a layer's keys and values)."""
    kept: dict[int, tuple] = {}  # id of a quantized tensor -> (that tensor, its dequantization)

    def once(quantized):
        hit = kept.get(id(quantized))
        if hit is not None and hit[0] is quantized:
            return hit[1]
        if len(kept) == 2:
            del kept[next(iter(kept))]
        kept[id(quantized)] = quantized, dequantize(quantized)
        return kept[id(quantized)][1]

    return once
