"""What a stretch of work allocates: every tensor allocation and free of the calling thread, counted by torch's own
profiler (the allocator reports each one to it), on the CPU and on CUDA alike.

Not the process's RSS, which mixes in weights paged in on first use, Python's own memory and other threads; not
a guess from shapes. The count is of the thread that runs the work (and the intra-op threads torch hands its work
to): a window's drawing on another thread is not in it. A Python-level count (a dispatch mode) gave the same
bytes on the default model, but cost about 25 µs an operator against the profiler's 2, which is too much to leave
inside a timed prefill.

Two of kineto's habits are kept quiet here: it prints a line at every profiler start and stop unless
KINETO_LOG_LEVEL says otherwise (read at each start), and an error line when its first profile runs on a thread
other than the one that imported torch. So this module runs that first profile (empty: about a millisecond) when it
is imported, which is on the thread that imported torch wherever kvviz's engine is first imported with it (the
window's worker thread, a command's main thread).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # errors only: no line at every profiler start and stop

TIMELINE_POINTS = 256  # the most points a timeline keeps (`thinned`)
_MEMORY_EVENT = "[memory]"


@dataclass
class Allocations:
    """What a counted stretch allocated, in bytes above what was allocated when it began (on the counted device)."""

    peak_bytes: int = 0  # the most allocated at once
    end_bytes: int = 0  # still allocated at the end
    # (ms since the count began, bytes allocated then), thinned to TIMELINE_POINTS keeping the peak (`thinned`)
    timeline: list[tuple[float, int]] = field(default_factory=list)


@contextmanager
def counting(device: torch.device) -> Iterator[Allocations]:
    """Count what the body allocates on `device` (see the module docstring); the `Allocations` given is filled in when
    the body ends, normally or not. Counting costs about 2 µs an operator; what the body times of itself is its own.
    """
    found = Allocations()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities, profile_memory=True)
    with profiler:
        began = time.time_ns()  # the clock kineto stamps its events with
        yield found
    events = [e for e in profiler.profiler.kineto_results.events()
              if e.name() == _MEMORY_EVENT and e.device_type().name == device.type.upper()]
    events.sort(key=lambda e: e.start_ns())
    now = peak = 0
    timeline: list[tuple[float, int]] = [(0.0, 0)]
    for event in events:
        now += event.nbytes()
        peak = max(peak, now)
        timeline.append((max(0.0, (event.start_ns() - began) / 1e6), now))
    found.peak_bytes, found.end_bytes = peak, now
    found.timeline = thinned(timeline, TIMELINE_POINTS)


def thinned(timeline: list[tuple[float, int]], points: int) -> list[tuple[float, int]]:
    """At most `points` of `timeline`: the first and the last, and the highest of each of `points` - 2 equal
    stretches of time between them (what was allocated at most then: the peak is always kept; the troughs between two
    layers' activations are not)."""
    if len(timeline) <= points:
        return list(timeline)
    first, last = timeline[0][0], timeline[-1][0]
    span = (last - first) or 1.0
    stretches = points - 2
    highest: dict[int, tuple[float, int]] = {}
    for point in timeline[1:-1]:
        k = min(int((point[0] - first) / span * stretches), stretches - 1)
        if k not in highest or point[1] > highest[k][1]:
            highest[k] = point
    return [timeline[0], *(highest[k] for k in sorted(highest)), timeline[-1]]
