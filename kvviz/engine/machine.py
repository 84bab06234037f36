"""Facts about this machine that the numbers on screen depend on: its free memory, its memory read bandwidth and the
speed of its arithmetic in a projection and in attention.

Decoding one token reads every weight and the whole KV cache once, so a step cannot be faster than
(weight bytes + KV bytes) / bandwidth: the memory-bound floor drawn under the measured latency.
The bandwidth is measured once (about a second: the best of a few reductions and matrix-vector
products over 256 MiB, far larger than any CPU cache, with the thread count torch decodes with) and
kept in kvviz's cache folder, keyed by CPU model, thread count, device and torch version, so every
later run uses the same figure. `memory_bandwidth(force=True)` (what `kvviz bench` does) measures
again and keeps the best figure seen: other work on the machine can only make a measurement lower.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import psutil
import torch

log = logging.getLogger(__name__)

BANDWIDTH_FILE = "bandwidth.json"
_TRIALS = 6
_MIB = 2**20


def cache_root() -> Path:
    """kvviz's folder in the user's cache directory (KVVIZ_CACHE_DIR overrides it)."""
    return Path(os.environ.get("KVVIZ_CACHE_DIR") or platformdirs.user_cache_dir("kvviz"))


def free_memory(device: torch.device) -> tuple[int, str]:
    """Bytes a cache could take on `device` now, and what that figure is, in words."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], f"free memory on {device}"
    return psutil.virtual_memory().available, "available memory"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(device: torch.device) -> str:
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{_cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    return f"{where}; {device.type}; torch {torch.__version__}"


def _best_rate(op, nbytes: int, device: torch.device) -> float:
    return nbytes / _best_time(op, device)


def _measure(device: torch.device) -> float:
    side = 8192  # 8192 x 8192 float32 = 256 MiB
    matrix = torch.randn(side, side, device=device)
    vector = torch.randn(side, device=device)
    nbytes = matrix.numel() * matrix.element_size()
    with torch.inference_mode():
        return max(_best_rate(lambda: matrix.sum(), nbytes, device), _best_rate(lambda: torch.mv(matrix, vector),
                                                                                  nbytes, device))


def memory_bandwidth(device: torch.device, force: bool = False) -> float | None:
    """Read bandwidth in bytes/s for `device`, measured once and kept; None if it cannot be measured."""
    path = cache_root() / BANDWIDTH_FILE
    key = machine_key(device)
    try:
        known = json.loads(path.read_text())
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    entry = known.get(key)
    if not force and isinstance(entry, dict) and isinstance(entry.get("bytes_per_s"), (int, float)):
        return float(entry["bytes_per_s"])
    try:
        rate = _measure(device)
    except (RuntimeError, MemoryError) as exc:  # no room for 256 MiB (or a device error): the floor stays unknown
        log.warning("the memory bandwidth of %s could not be measured", device, exc_info=exc)
        return None
    if isinstance(entry, dict) and isinstance(entry.get("bytes_per_s"), (int, float)):
        rate = max(rate, float(entry["bytes_per_s"]))
    known[key] = {"bytes_per_s": rate, "measured": time.strftime("%Y-%m-%d %H:%M:%S"), "buffer_mib": 256}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.part")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache folder: the figure is measured again next time
    return rate


@dataclass(frozen=True)
class ArithmeticSpeed:
    """Seconds per floating-point operation of a prompt's projections (a matrix product) and of its attention (SDPA
    over a causal square), at one prompt's shapes: attention on a CPU runs at about half the projections' rate."""

    linear_s: float
    attention_s: float


def arithmetic_speed(device: torch.device, dtype: torch.dtype, tokens: int, hidden: int, wide: int, heads: int,
                     kv_heads: int, head_dim: int) -> ArithmeticSpeed:
    """Each the best of a few timings (about half a second on this CPU at 2,000 tokens): a [tokens, hidden] x [hidden,
    wide] product, and SDPA of `heads` query heads over `kv_heads` over `tokens` causally."""
    generator = torch.Generator(device="cpu").manual_seed(0)

    def random(*shape):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    rows, weight = random(tokens, hidden), random(wide, hidden)
    query, key, value = random(1, heads, tokens, head_dim), random(1, kv_heads, tokens, head_dim), \
        random(1, kv_heads, tokens, head_dim)
    with torch.inference_mode():
        linear = _best_time(lambda: torch.nn.functional.linear(rows, weight), device)
        attention = _best_time(lambda: torch.nn.functional.scaled_dot_product_attention(
            query, key, value, is_causal=True, enable_gqa=heads != kv_heads), device)
    pairs = tokens * tokens / 2  # a causal square
    return ArithmeticSpeed(linear / (2 * tokens * hidden * wide), attention / (4 * heads * head_dim * pairs))


def _best_time(op, device: torch.device) -> float:
    best = float("inf")
    for _ in range(_TRIALS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        op()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return best
