"""`kvviz demo`: a scripted tour of the window sized for a 1080p screen recording.

One prompt through dynamic, static, quantized int4 (hqq) and sink caches, then one run that switches from dynamic to
quantized int4 mid-run, then a quantized int2 run compared with the exact cache (its KL divergence per step and
top-1 agreement), then a needle: a RULER-style item (kvviz.engine.tasks) whose 7-digit number is pinned, read by TOVA
at a small budget, the cache map outlining the needle in each layer as it is held or evicted, then a four-turn
conversation through attention sinks in the Chat tab, then twelve requests served at once through transformers'
continuous batching in the Serve tab (a pool too small for them all: blocks shared by prefix, requests preempted).
Each scene is captioned in a band of its own above the window's views, which covers no plot; with `record` the whole
tour is written to MP4 (or GIF without imageio-ffmpeg) by kvviz.qt.recorder.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvviz.present import FAILED, strategy_label
from kvviz.qt.tools import drive
from kvviz.qt.tools.chat_screenshot import MESSAGES, SYSTEM, play_chat
from kvviz.qt.tools.serve_screenshot import serve

DEMO_PROMPT = "Explain in a few sentences what the key-value cache of a transformer does."
SIZE = (1920, 1080)
HQQ_INT4 = {"backend": "hqq", "nbits": 4, "residual_length": 16, "q_group_size": 32}


@dataclass(frozen=True)
class Scene:
    caption: str
    strategy: str
    options: dict[str, Any]
    switch: tuple[int, str, dict[str, Any]] | None = None  # at token, to strategy, its options
    reference: bool = False  # compared with the exact cache in lockstep (the fidelity plot)


TOUR = [
    Scene("1 / 9  DynamicCache: grows by one token per step", "dynamic", {}),
    Scene("2 / 9  StaticCache: every slot preallocated, written in place", "static", {}),
    Scene("3 / 9  QuantizedCache int4 (hqq): old tokens in 4 bits, a full-precision residual", "quantized", HQQ_INT4),
    Scene("4 / 9  Attention sinks: the first 4 tokens plus a sliding window of 24", "sink",
          {"sink_tokens": 4, "window": 24}),
    Scene("5 / 9  Live switch: dynamic, then quantized int4 from token 24", "dynamic", {},
          switch=(24, "quantized", HQQ_INT4)),
    Scene("6 / 9  Fidelity: quantized int2 against the exact cache, KL per step and top-1 agreement", "quantized",
          {**HQQ_INT4, "nbits": 2}, reference=True),
]
# the caption fits a 1920-pixel window whole (a longer one widens the window past the recording)
NEEDLE = Scene("7 / 9  A needle in {tokens:,} tokens, pinned; TOVA keeps {budget}: {held}", "tova", {"budget": 96})
NEEDLE_TASK, NEEDLE_TOKENS = "niah_single_1", 600
CHAT = Scene("8 / 9  A conversation through attention sinks (4 + 60): the cache map shows which turns survive",
             "sink", {"sink_tokens": 4, "window": 60})
SERVE = ("9 / 9  Twelve requests through transformers' continuous batching: {blocks} blocks of 16 tokens, a prefix "
         "shared, requests preempted")
SERVE_BLOCKS = 20
FINALE = "All runs overlaid: memory, latency against its memory-bound floor, and the compared run's KL"


class Caption:
    """The demo's caption: a band of its own across the top of the window (a tool bar), so it covers no plot."""

    def __init__(self, window):
        from PySide6.QtCore import Qt
        from PySide6.QtWidgets import QLabel, QSizePolicy, QToolBar

        self.bar = QToolBar("Demo caption", window)
        self.bar.setObjectName("demoCaption")
        self.bar.setMovable(False)
        self.bar.setFloatable(False)
        self.label = QLabel()
        self.label.setObjectName("demoCaptionText")
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.label.setStyleSheet(
            "QLabel#demoCaptionText { background: #14181f; color: #ffffff; font-size: 28px; font-weight: 600;"
            " padding: 10px 24px; border-bottom: 3px solid #4c9be8; }"
        )
        self.bar.addWidget(self.label)
        window.addToolBar(Qt.ToolBarArea.TopToolBarArea, self.bar)

    def show(self, text: str) -> None:
        print(f"kvviz demo: {text}", file=sys.stderr, flush=True)
        self.label.setText(text)


def run_demo(record: Path | None = None, model: str = "default", tokens: int = 64, fps: float = 10.0,
             pause: float = 1.5) -> int:
    """Play the tour; returns 0 when every step ran (steps a machine cannot run are labelled skipped)."""
    with drive.scratch_window("kvviz-demo", SIZE) as (_, window):
        caption = Caption(window)
        caption.show("kvviz: the key-value cache of a transformer, live")
        if record is not None:
            record = window.recorder.start(record, fps)
        return _tour(window, caption, model, tokens, pause, record)


def _needle(window, caption: Caption, pause: float) -> int:
    """The needle scene: a task item written into the prompt, its needle pinned, read by a small TOVA cache until
    the model ends its answer; the caption then says in how many layer-heads the needle is still held and whether
    the answer has the number. Its failures (0 or 1)."""
    from kvviz.files.scoring import score
    from kvviz.files.trace import heads_holding

    local, pins = window.modes["local"], window.panels.pin_panel
    budget = NEEDLE.options["budget"]
    caption.show(NEEDLE.caption.format(tokens=NEEDLE_TOKENS, budget=budget, held="its outline in the cache map"))
    written: list[dict] = []
    local.sigItemDone.connect(written.append)
    local.write_item(NEEDLE_TASK, NEEDLE_TOKENS)
    if not drive.wait(lambda: bool(written), 120, local.sigItemDone) or "problem" in written[0]:
        caption.show(NEEDLE.caption.format(tokens=NEEDLE_TOKENS, budget=budget,
                                           held=f"failed: {written[0]['problem'] if written else 'no item'}"))
        drive.pause(pause)
        return 1
    local.view.map_tabs.setCurrentWidget(local.view.cache_map)
    if not drive.choose(window, NEEDLE.strategy, NEEDLE.options):
        return 1
    run_id = window.start_run()  # to the end of its answer
    if run_id is None:
        return 1
    series = window.store.runs[run_id]
    if not drive.wait(lambda: series.finished, 900) or window.store.status(run_id) == FAILED:
        return 1
    trace = series.trace
    pin = trace.pins[0]
    holding = heads_holding(trace.steps[-1].pins_held[0], pin.size)
    item = written[0]
    right = score(item["metric"], trace.text, item["answers"]) >= 1.0
    # the same words as the Runs table's and the cache map's title
    held = f"{holding.text()}, answer {'right' if right else 'wrong'}"
    caption.show(NEEDLE.caption.format(tokens=trace.prompt_tokens, budget=budget, held=held))
    drive.pause(2 * pause)
    pins.set_texts([])  # the scenes after it watch nothing
    return 0


def _tour(window, caption: Caption, model: str, tokens: int, pause: float, record: Path | None) -> int:
    """The scenes, recorded to `record` when given; 0 when every step ran."""
    control = window.recorder
    failures = 0
    refusals: list[str] = []
    window.model.worker.sigSwitchRefused.connect(lambda strategy, why: refusals.append(why))
    try:
        caption.show(f"Loading the model ({model})…")
        if not drive.load(window, model):
            print(f"kvviz demo: could not load {model!r}: {window.last_error}", file=sys.stderr)
            return 1
        window.controls.prompt_panel.set_text(DEMO_PROMPT)
        window.controls.settings_panel.max_new_tokens.setValue(tokens)
        drive.pause(pause)
        for scene in TOUR:
            if not drive.choose(window, scene.strategy, scene.options):
                caption.show(scene.caption + "  (skipped: not available here)")
                drive.pause(pause)
                continue
            window.modes["local"].reference_box.setChecked(scene.reference)
            caption.show(scene.caption)
            drive.pause(pause)
            run_id = window.start_run({"stop_at_eos": False})
            if run_id is None:
                caption.show(scene.caption + f"  (could not start: {window.last_error})")
                failures += 1
                drive.pause(pause)
                continue
            series = window.store.runs[run_id]
            if scene.switch is not None:
                at, target, target_options = scene.switch
                # the trace's own length: the engine's progress, not the steps drawn so far
                drive.wait(lambda s=series, a=at: s.finished or len(s.trace.steps) >= a, 600)
                if not series.finished:
                    drive.choose(window, target, target_options)
                    caption.show(f"Switching to {strategy_label({'name': target, 'options': target_options})} "
                                 f"at token {len(series.trace.steps)}…")
                    if not window.switch_strategy():
                        failures += 1
            if not drive.wait(lambda s=series: s.finished, 900):
                failures += 1
                break
            if run_id not in window.store.runs or window.store.status(run_id) == FAILED:
                failures += 1
                caption.show(scene.caption + f"  (failed: {window.last_error})")
            drive.pause(pause)
        window.modes["local"].reference_box.setChecked(False)
        failures += _needle(window, caption, pause)
        failures += len(refusals)
        caption.show(CHAT.caption)
        if not play_chat(window, MESSAGES[:4], CHAT.strategy, CHAT.options, tokens, SYSTEM):
            failures += 1
            caption.show(CHAT.caption + f"  (failed: {window.last_error})")
        drive.pause(2 * pause)
        caption.show(SERVE.format(blocks=SERVE_BLOCKS))
        if not serve(window, SERVE_BLOCKS, tokens):
            failures += 1
            caption.show(SERVE.format(blocks=SERVE_BLOCKS) + f"  (failed: {window.last_error})")
        drive.pause(2 * pause)
        window.set_mode("local")
        window.runs_table.select_runs(list(window.store.runs))
        caption.show(FINALE)
        drive.pause(2 * pause)
    finally:
        if record is not None:
            control.stop()
            stats = control.recorder.stats()
            print(
                f"kvviz demo: recorded {stats['path']}: {stats['frames']} frames in {stats['seconds']:.1f} s "
                f"({stats['grab_fps']:.1f} grabs/s, {stats['mean_grab_ms']:.1f} ms a grab), "
                f"{(stats['bytes'] or 0) / 1e6:.1f} MB",
                file=sys.stderr,
            )
    return 0 if failures == 0 else 1
