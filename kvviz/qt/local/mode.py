"""The window's "Local run" mode: a prompt decoded here by a real model, live, with the cache strategy chosen, and a
live switch of that strategy while it decodes.

`LocalMode` owns its central view (kvviz.qt.local.view: memory, latency and fidelity against tokens, the cache map
and the attention view, per-layer bytes and time), the runs' legend beside the central tabs, and the buttons under
the Controls (the exact-cache check box above Run, Switch and Stop). Its Controls are the shared panels: the model,
the prompt, the generation settings and the strategy picker. Run sends the request to the worker
(kvviz.qt.local.runs); the run's records go into the run store, which the Tokens and Runs docks show too, and a trace
opened from a file is a run drawn by the same code.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from kvviz.files.trace import Trace
from kvviz.present import final_status
from kvviz.qt.local.help import HELP
from kvviz.qt.local.runs import LocalRuns
from kvviz.qt.local.view import LocalView
from kvviz.qt.mode_api import Mode, ModeHost, Part, refused_switch


class LocalMode(Mode):
    key = "local"
    title = "Local run"
    short_title = "Local"
    tip = "A model run here: its cache live, token by token, and a live switch of strategy"
    formats = (Trace,)
    help = HELP

    sigRequestItem = Signal(int, object)  # to the worker's desk: serial, a task item to write for the model
    sigItemDone = Signal(object)  # the item asked last: in the prompt ({"prompt", "pins", "name"}) or not ({"problem"})

    def __init__(self, host: ModeHost):
        super().__init__(host)
        panels = host.panels
        self.view = LocalView()
        self.corner = self.view.run_legend
        self.controls = [panels.model_panel, panels.prompt_panel, panels.pin_panel, panels.settings_panel,
                         panels.strategy_panel]
        self.runs = LocalRuns(host.store, host.model.worker, self)
        self.run_button = QPushButton("Run")
        self.run_button.setObjectName("runButton")
        self.run_button.setToolTip("Run (Ctrl+Enter)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop after the current step, keeping what was generated (Esc)")
        self.switch_button = QPushButton("Switch")
        self.switch_button.setToolTip(
            "Convert the running generation's cache to the strategy chosen above, at the next step"
        )
        self.reference_box = QCheckBox("Compare with the exact cache (fidelity)")
        self.reference_box.setToolTip(
            "Run a full-precision DynamicCache reference in lockstep on the same tokens and plot KL divergence; "
            "its time is measured apart and not counted in tokens/s"
        )
        self.buttons = self._buttons()
        self.run_button.clicked.connect(lambda *_: self.start())
        self.stop_button.clicked.connect(lambda *_: self.stop())
        self.switch_button.clicked.connect(lambda *_: self.switch())

        # the next run is checked as it is set up (the options here, the rest by the worker's model), so that Run
        # is off while it cannot work and the strategy panel says why before Run is pressed
        picker = panels.strategy_panel
        picker.sigChecked.connect(host.update_controls)
        picker.sigEdited.connect(host.update_controls)
        for edited in (picker.sigEdited, panels.prompt_panel.editor.textChanged, panels.settings_panel.raw.toggled,
                       panels.settings_panel.max_new_tokens.valueChanged):
            edited.connect(self._preflight)
        self.runs.sigPromptTokens.connect(picker.set_prompt_tokens)
        self.runs.sigPromptTokens.connect(panels.prompt_panel.set_count)
        self.runs.sigPreflight.connect(picker.set_preflight)
        # bound methods of this GUI-thread object, never lambdas: a lambda has no thread, so Qt would call it on the
        # worker's thread, and widgets may only be touched on the GUI thread
        worker = host.model.worker
        worker.sigRunFailed.connect(self._on_run_failed)
        worker.sigSwitchAccepted.connect(self._on_switch_accepted)
        worker.sigSwitchRefused.connect(self._on_switch_refused)
        # the engine computes the attention only while its view is on screen
        self.view.sigAttentionShown.connect(worker.desk.attention)
        worker.sigAttentionRefused.connect(self.view.attention_refused)
        # pinned spans: the selection of the prompt, or a task item's needle
        panels.pin_panel.pin_button.clicked.connect(lambda *_: self.pin_selection())
        panels.pin_panel.sigWriteItem.connect(self.write_item)
        self.sigRequestItem.connect(worker.desk.write_item)
        worker.sigItemWritten.connect(self._on_item)
        self._item_serial = 0

    def _buttons(self) -> QWidget:
        """The page under the controls: the reference check box above Run, Switch and Stop."""
        page = QWidget()
        column = QVBoxLayout(page)
        column.setContentsMargins(0, 0, 0, 0)
        reference_row = QHBoxLayout()
        reference_row.setContentsMargins(12, 0, 9, 0)
        reference_row.addWidget(self.reference_box)
        buttons = QHBoxLayout()
        buttons.setContentsMargins(9, 0, 9, 0)
        buttons.addWidget(self.run_button, 2)
        buttons.addWidget(self.switch_button, 1)
        buttons.addWidget(self.stop_button, 1)
        column.addLayout(reference_row)
        column.addLayout(buttons)
        return page

    # -- runs ----------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.host.store.generating is not None

    def can_start(self) -> bool:
        return self.run_button.isEnabled()

    def start(self, extra_settings: dict[str, Any] | None = None) -> int | None:
        """Start a run with the current controls; returns its id, or None if it cannot start.

        extra_settings: further GenerationSettings fields (the bench passes stop_at_eos=False)."""
        if not self.run_button.isEnabled():
            return None
        panels = self.host.panels
        prompt = panels.prompt_panel.text()
        if not prompt.strip():
            self.host.show_error("Type a prompt first.")
            return None
        strategy = panels.strategy_panel.current()
        options = panels.strategy_panel.values()
        settings = {**panels.settings_panel.settings(), **(extra_settings or {})}
        header = Trace(model=dict(self.host.model.card or {}), strategy={"name": strategy, "options": options},
                       prompt=prompt, settings=settings)
        request = {"strategy": strategy, "options": options, "settings": settings, "prompt": prompt,
                   "reference": self.reference_box.isChecked(), "pins": list(panels.pin_panel.texts)}
        self.host.hide_error()
        run_id = self.runs.run(header, request)
        self.host.update_controls()
        return run_id

    def pin_selection(self) -> None:
        """Pin the words selected in the prompt for the next run."""
        selected = self.host.panels.prompt_panel.editor.textCursor().selectedText().replace("\u2029", "\n")
        if selected.strip():
            self.host.panels.pin_panel.add(selected)
        else:
            self.host.panels.pin_panel.say("select words of the prompt first (or right-click words of the prompt in "
                                           "the Tokens panel)")

    def write_item(self, task: str, tokens: int) -> int:
        """Write item 1 of `task` (seed 0) at `tokens` for the loaded model into the prompt, its needle pinned; the
        request's serial (the answer comes back on the worker's sigItemWritten)."""
        self._item_serial += 1
        raw = self.host.panels.settings_panel.raw.isChecked()
        self.sigRequestItem.emit(self._item_serial, {"task": task, "length": tokens, "seed": 0, "index": 0,
                                                     "raw": raw})
        self.host.panels.pin_panel.say(f"writing a {task} item of {tokens:,} tokens…")
        return self._item_serial

    def _on_item(self, serial: int, item: dict) -> None:
        if serial != self._item_serial:
            return
        pins = self.host.panels.pin_panel
        if "problem" in item:
            pins.set_texts(pins.texts)
            self.host.show_error(f"Cannot write the task item: {item['problem']}")
        else:
            self.host.panels.prompt_panel.set_text(item["prompt"])
            pins.set_texts(item["pins"])
            self.host.note(f"{item['name']} written into the prompt, its needle pinned: Run to watch it")
        self.sigItemDone.emit(item)

    def stop(self) -> None:
        generating = self.host.store.generating
        if generating is not None:
            self.runs.cancel(generating)
            self.host.hold("stopping after this step…")

    def can_switch(self) -> bool:
        return self.switch_button.isEnabled()

    def switch(self) -> bool:
        """Ask the running generation to switch to the strategy and options chosen in the picker; False when
        nothing runs or an option is invalid. The worker answers with sigSwitchAccepted or sigSwitchRefused
        (shown above the plots)."""
        if self.host.store.generating is None:
            return False
        picker = self.host.panels.strategy_panel
        problem = picker.problem()
        if problem:
            self.host.show_error(f"Cannot switch: {problem}")
            return False
        self.runs.switch(picker.current(), picker.values())
        return True

    def update_controls(self, ready: bool) -> None:
        picker = self.host.panels.strategy_panel
        generating = self.busy
        valid = picker.problem() is None  # its message is beside the field
        self.run_button.setEnabled(ready and picker.current() is not None and valid)
        self.stop_button.setEnabled(generating)
        self.switch_button.setEnabled(generating and valid)
        self.reference_box.setEnabled(not generating)

    def status(self) -> str:
        store, picker = self.host.store, self.host.panels.strategy_panel
        if store.generating is not None:
            return f"generating run #{store.generating}: {store.runs[store.generating].n} tokens"
        if picker.problem():  # also beside its option, which may be scrolled out of view
            return f"Run is off: {picker.problem()}"
        # the warning itself is under the strategy's options: a sentence or three, too long for this line
        return "ready; the prompt is longer than this cache keeps (the note under Cache strategy says what it keeps)" \
            if picker.warning() else "ready"

    def _preflight(self, *_) -> None:
        panels = self.host.panels
        if panels.strategy_panel.current() is not None:
            self.runs.preflight({
                "prompt": panels.prompt_panel.text(), "raw": panels.settings_panel.raw.isChecked(),
                "strategy": panels.strategy_panel.current(), "options": panels.strategy_panel.values(),
                "max_new_tokens": panels.settings_panel.max_new_tokens.value(),
            })

    def _on_run_failed(self, run_id: int, message: str) -> None:
        if run_id in self.host.store.runs:
            self.host.show_error(f"Run #{run_id} failed: {message}")
        else:  # refused before it started: withdrawn, the runs shown before are shown again
            self.host.show_error(f"Cannot run: {message}")

    def _on_switch_accepted(self, strategy: str) -> None:
        self.host.say(f"switching to {strategy} at the next step…")

    def _on_switch_refused(self, strategy: str, why: str) -> None:
        self.host.show_error(refused_switch(strategy, why))

    # -- drawing -------------------------------------------------------------------------------------

    def redraw_parts(self) -> list[Part]:
        store = self.host.store
        return self.view.redraw_parts(store.shown_series(), store.primary(), store.generating is not None)

    def plots(self) -> list:
        self.view.draw_every_plot()  # the redraws skip the tab behind and the hidden fidelity plot
        return self.view.plots

    def restyle(self, palette) -> None:
        for plot in self.view.plots:
            plot.apply_palette(palette)
            if hasattr(plot, "restyle"):
                plot.restyle()
        self.view.run_legend.set_foreground(palette.foreground)
        self.view.run_legend.set_entries([])  # drawn again in the theme's run colours at the next redraw

    def reset_layout(self) -> None:
        self.view.reset_layout()

    # -- kept runs and settings ----------------------------------------------------------------------

    def open(self, trace: Trace) -> int:
        """A trace opened from a file, into the Runs table; its run id."""
        return self.host.store.add(trace, final_status(trace))

    def restore_settings(self, settings) -> None:
        self.view.restore_splitters(settings)

    def save_settings(self, settings) -> None:
        self.view.save_splitters(settings)

    def shutdown(self) -> None:
        self.runs.shutdown()
