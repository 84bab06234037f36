"""Strategy picker: one entry per engine strategy, its options as widgets with their valid ranges.

Strategies the engine reports unavailable are listed disabled, with the reason as tooltip. The
values of every strategy's options are kept while the user switches between strategies.

Options are checked as they are typed, by the strategy's own `parse_options` and `check_options` (pure
Python, no model needed); what needs the model (a group size this model's heads cannot fill, a compile this
machine cannot do) comes back from the worker's check of the next run (`set_preflight`). The message stands
beside the option it names, and `problem()` tells the window to keep Run and Switch disabled meanwhile.
An evicting strategy whose budget is smaller than the prompt (its token count also comes from the worker,
`set_prompt_tokens`) gets a warning: the run would drop the prompt's start before the first new token.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kvviz.errors import OptionError
from kvviz.qt import wheel_guard

INT_MAX = 2**31 - 1
PROBLEM_STYLE = "color: #e0443e; font-weight: 600;"  # readable on the dark and the light theme
WARNING_STYLE = "color: #d9822b; font-weight: 600;"


class StrategyPanel(QGroupBox):
    sigEdited = Signal()  # the user chose another strategy or changed an option
    sigChecked = Signal()  # problem() or warning() changed

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Cache strategy", parent)
        self.combo = QComboBox()
        self.combo.setPlaceholderText("starting the engine…")
        self.combo.currentIndexChanged.connect(self._selected)
        self.description = QLabel()
        self.description.setWordWrap(True)
        self.description.setObjectName("muted")
        self.form_host = QWidget()
        self.form = QFormLayout(self.form_host)
        self.form.setContentsMargins(0, 0, 0, 0)
        self.problem_label = _message_label("optionProblem", PROBLEM_STYLE)  # a problem naming no single option
        self.warning_label = _message_label("optionWarning", WARNING_STYLE)
        layout = QVBoxLayout(self)
        layout.addWidget(self.combo)
        layout.addWidget(self.description)
        layout.addWidget(self.form_host)
        layout.addWidget(self.problem_label)
        layout.addWidget(self.warning_label)
        self._strategies: list[Any] = []
        self._available: dict[str, tuple[bool, str]] = {}
        self._values: dict[str, dict[str, Any]] = {}
        self._widgets: dict[str, QWidget] = {}
        self._options: dict[str, Any] = {}
        self._messages: dict[str, QLabel] = {}  # the row under each option's field, for its problem
        self._current: str | None = None
        self._problem: str | None = None
        self._warning: str | None = None
        self._prompt_tokens: int | None = None
        self._prompt_relevant = True  # False in the Evaluate mode: its strategies read a document, not the prompt
        self._preflight: tuple[str, dict[str, Any], str | None] | None = None  # strategy, options, model's verdict

    def set_strategies(self, listing: list[tuple[Any, bool, str]]) -> None:
        """listing: (Strategy, available, reason) as the worker reports them."""
        wanted = self._current
        self.combo.blockSignals(True)
        self.combo.clear()
        self._strategies = [s for s, _, _ in listing]
        self._available = {s.name: (ok, reason) for s, ok, reason in listing}
        model = self.combo.model()
        for i, (strategy, ok, reason) in enumerate(listing):
            self.combo.addItem(strategy.name if ok else f"{strategy.name} (unavailable)", strategy.name)
            item = model.item(i)
            if ok:
                item.setToolTip(strategy.description)
            else:
                item.setEnabled(False)
                item.setToolTip(f"unavailable: {reason}")
        self.combo.blockSignals(False)
        self._current = None
        names = [s.name for s in self._strategies]
        if wanted not in names or not self._available[wanted][0]:
            wanted = next((n for n in ("dynamic", *names) if n in names and self._available[n][0]), None)
        if wanted is not None:
            self.combo.setCurrentIndex(names.index(wanted))
            self._selected(names.index(wanted))

    def names(self, available_only: bool = True) -> list[str]:
        return [s.name for s in self._strategies if not available_only or self._available[s.name][0]]

    def current(self) -> str | None:
        return self._current

    def set_current(self, name: str) -> bool:
        names = [s.name for s in self._strategies]
        if name not in names or not self._available[name][0]:
            self._current = name if not names else self._current
            return False
        self.combo.setCurrentIndex(names.index(name))
        return True

    def values(self) -> dict[str, Any]:
        """The current strategy's options set apart from their defaults (the engine fills in the rest, and an
        option that means nothing with another's value, such as nbits with backend fp8, is not sent unasked)."""
        self._store()
        defaults = {o.name: o.default for o in self._options.values()}
        values = self._values.get(self._current or "", {})
        return {k: v for k, v in values.items() if k not in defaults or v != defaults[k]}

    def problem(self) -> str | None:
        """Why the options as set cannot run (shown beside the option), or None."""
        return self._problem

    def warning(self) -> str | None:
        """What the options as set would do that the user may not expect (shown under them), or None."""
        return self._warning

    def set_prompt_relevant(self, relevant: bool) -> None:
        """Whether the strategy is for a run of the prompt (the Evaluate mode's strategies read a document: no
        warning about the prompt there)."""
        self._prompt_relevant = relevant
        self._check()

    def set_prompt_tokens(self, count: int | None) -> None:
        """The prompt's token count as the model gets it (None: unknown), for the eviction warning."""
        self._prompt_tokens = count
        self._check()

    def set_preflight(self, request: dict[str, Any], problem: str | None) -> None:
        """The worker's verdict on a run with request's strategy and options: why it cannot run with the loaded
        model (None: it can). It stands while these are the strategy and options set."""
        self._preflight = (request["strategy"], dict(request["options"]), problem)
        self._check()

    def all_values(self) -> dict[str, dict[str, Any]]:
        self._store()
        return {k: dict(v) for k, v in self._values.items()}

    def set_all_values(self, values: dict[str, dict[str, Any]]) -> None:
        for name, opts in (values or {}).items():
            if isinstance(opts, dict):
                self._values[name] = dict(opts)
        if self._current:
            self._build(self._current)

    def set_option(self, name: str, value: Any) -> None:
        """Set one option of the current strategy (as a user would in its widget)."""
        widget = self._widgets[name]
        option = self._options[name]
        _set_widget(widget, option, value)
        self._check()  # also where the widget did not change (a value out of its range)

    # -- internals -----------------------------------------------------------------------------------

    def _selected(self, index: int) -> None:
        if index < 0 or index >= len(self._strategies):
            return
        self._store()
        self._current = self._strategies[index].name
        self._build(self._current)
        self.sigEdited.emit()

    def _edited(self, *_) -> None:
        self._check()
        self.sigEdited.emit()

    def _store(self) -> None:
        if self._current is None:
            return
        self._values[self._current] = {
            name: _widget_value(w, self._options[name]) for name, w in self._widgets.items()
        }

    def _strategy(self):
        return next((s for s in self._strategies if s.name == self._current), None)

    def _check(self) -> None:
        """Check the options as set; show the problem beside its option and the warning under them."""
        strategy = self._strategy()
        problem = warning = None
        if strategy is not None:
            options = None
            values = self.values()
            try:
                options = strategy.parse_options(values)
                problem = strategy.check_all(options)
            except OptionError as exc:
                problem = str(exc)
            if problem is None and self._preflight is not None and self._preflight[:2] == (strategy.name, values):
                problem = self._preflight[2]
            count = self._prompt_tokens if self._prompt_relevant else None
            if problem is None and count:
                warning = strategy.prompt_note(options, count)
        # beside the option the message names: "option 'nbits' of …", "cannot use q_group_size=64 with …"
        named = next((n for n in self._messages if problem and (f"'{n}'" in problem or f"{n}=" in problem)), None)
        for name, label in self._messages.items():
            text = problem if name == named else ""
            label.setText(text)
            self.form.setRowVisible(label, bool(text))
        _show(self.problem_label, problem if named is None else None)
        _show(self.warning_label, warning)
        changed = (problem, warning) != (self._problem, self._warning)
        self._problem, self._warning = problem, warning
        if changed:
            self.sigChecked.emit()

    def _build(self, name: str) -> None:
        while self.form.rowCount():
            self.form.removeRow(0)
        self._widgets.clear()
        self._options.clear()
        self._messages.clear()
        strategy = next(s for s in self._strategies if s.name == name)
        self.description.setText(strategy.description)
        saved = self._values.get(name, {})
        for option in strategy.options:
            widget = _make_widget(option)
            wheel_guard.guard(widget)
            if option.name in saved:
                _set_widget(widget, option, saved[option.name])
            label = QLabel(option.name.replace("_", " "))
            if option.help:
                widget.setToolTip(option.help)
                label.setToolTip(option.help)
            self.form.addRow(label, widget)
            message = _message_label("optionProblem", PROBLEM_STYLE)
            self.form.addRow(message)
            self.form.setRowVisible(message, False)
            _on_change(widget, self._edited)
            self._widgets[option.name] = widget
            self._options[option.name] = option
            self._messages[option.name] = message
        if not strategy.options:
            note = QLabel("no options")
            note.setObjectName("muted")
            self.form.addRow(note)
        self._check()


def _message_label(name: str, style: str) -> QLabel:
    label = QLabel()
    label.setObjectName(name)
    label.setStyleSheet(style)
    label.setWordWrap(True)
    label.hide()
    return label


def _show(label: QLabel, text: str | None) -> None:
    label.setText(text or "")
    label.setVisible(bool(text))


def _on_change(widget: QWidget, slot) -> None:
    """Call slot whenever the user changes the widget's value (each key typed in a spin box)."""
    if isinstance(widget, QCheckBox):
        widget.toggled.connect(slot)
    elif isinstance(widget, QComboBox):
        widget.currentIndexChanged.connect(slot)
    else:
        widget.valueChanged.connect(slot)


def _make_widget(option) -> QWidget:
    kind = option.kind
    if kind == "bool":
        widget = QCheckBox()
        widget.setChecked(bool(option.default))
    elif kind == "choice":
        widget = QComboBox()
        for choice in option.choices or []:
            widget.addItem(str(choice), choice)
        index = widget.findData(option.default)
        widget.setCurrentIndex(max(index, 0))
    elif kind == "float":
        widget = QDoubleSpinBox()
        widget.setDecimals(3)
        lo = option.minimum if option.minimum is not None else -1e9
        hi = option.maximum if option.maximum is not None else 1e9
        widget.setRange(float(lo), float(hi))
        widget.setSingleStep(max((float(hi) - float(lo)) / 100, 0.001) if option.maximum is not None else 0.1)
        widget.setValue(float(option.default) if option.default is not None else float(lo))
    else:  # int
        widget = QSpinBox()
        lo = option.minimum if option.minimum is not None else 0
        hi = option.maximum if option.maximum is not None else INT_MAX
        widget.setRange(int(lo), int(min(hi, INT_MAX)))
        widget.setValue(int(option.default) if option.default is not None else int(lo))
        widget.setAlignment(Qt.AlignmentFlag.AlignRight)
    return widget


def _widget_value(widget: QWidget, option) -> Any:
    if isinstance(widget, QCheckBox):
        return widget.isChecked()
    if isinstance(widget, QComboBox):
        return widget.currentData()
    return widget.value()


def _set_widget(widget: QWidget, option, value: Any) -> None:
    try:
        if isinstance(widget, QCheckBox):
            widget.setChecked(bool(value))
        elif isinstance(widget, QComboBox):
            index = widget.findData(value)
            if index < 0:
                index = widget.findText(str(value))
            if index >= 0:
                widget.setCurrentIndex(index)
        elif isinstance(widget, QDoubleSpinBox):
            widget.setValue(float(value))
        else:
            widget.setValue(int(value))
    except (TypeError, ValueError):
        pass
