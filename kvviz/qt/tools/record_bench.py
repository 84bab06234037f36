"""What recording the window costs the generation: `python -m kvviz.qt.tools.record_bench [--model default]`.

The same run (model, prompt, dynamic cache, greedy, end-of-text ignored) in the same window at the demo's
size, with and without the window being recorded, interleaved so that a busy machine weighs on both alike.
Prints the decode tokens/s of every run and the cost: 1 - the median over repeats of recording / plain (the two
runs of a repeat are next to each other in time, so a load that comes and goes weighs on both alike).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvviz.present import FINISHED
from kvviz.qt.tools import drive

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _rate(window, tokens: int) -> float:
    run_id = drive.run(window, tokens, timeout_s=1800, extra_settings={"stop_at_eos": False})
    if run_id is None or window.store.status(run_id) != FINISHED:
        raise RuntimeError(f"the run did not finish: {window.last_error}")
    return window.store.runs[run_id].trace.summary()["decode_tokens_per_s"]


def run_record_bench(model: str = "default", tokens: int = 128, repeats: int = 3, fps: float = 10.0,
                     size: tuple[int, int] = (1920, 1080), progress=None) -> dict[str, Any]:
    say = progress or (lambda message: None)
    folder = Path(tempfile.mkdtemp(prefix="kvviz-record-bench-"))  # the recordings
    plain: list[float] = []
    recording: list[float] = []
    grabs: list[dict] = []
    try:
        with drive.scratch_window("kvviz-record-bench", size, model) as (_, window):
            window.controls.prompt_panel.set_text(PROMPT)
            drive.choose(window, "dynamic")
            say("warming up")
            _rate(window, 8)
            for i in range(repeats):
                for recorded in (False, True) if i % 2 == 0 else (True, False):
                    say(f"repeat {i + 1}/{repeats}, {'recording' if recorded else 'plain'}")
                    if recorded:
                        window.recorder.start(folder / f"run-{i}.mp4", fps)
                        recording.append(_rate(window, tokens))
                        window.recorder.stop()
                        grabs.append(window.recorder.recorder.stats())
                    else:
                        plain.append(_rate(window, tokens))
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the recordings were only timed
    ratios = [r / p for p, r in zip(plain, recording, strict=True)]
    return {
        "model": model,
        "tokens": tokens,
        "fps": fps,
        "size": list(size),
        "tokens_per_s_plain": plain,
        "tokens_per_s_recording": recording,
        "cost": 1.0 - statistics.median(ratios),
        "cost_by_repeat": [1.0 - r for r in ratios],
        "mean_grab_ms": [round(g["mean_grab_ms"], 2) for g in grabs],
        "grab_fps": [round(g["grab_fps"], 2) for g in grabs],
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fps", type=float, default=10.0)
    args = parser.parse_args(argv)
    result = run_record_bench(args.model, args.tokens, args.repeats, args.fps,
                              progress=lambda message: print(message, file=sys.stderr, flush=True))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
