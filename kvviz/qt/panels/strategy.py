"""Strategy picker: one entry per engine strategy, its options as widgets with their valid ranges.

Strategies the engine reports unavailable are listed disabled, with the reason as tooltip. The
values of every strategy's options are kept while the user switches between strategies.
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

INT_MAX = 2**31 - 1


class StrategyPanel(QGroupBox):
    sigChanged = Signal()

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
        layout = QVBoxLayout(self)
        layout.addWidget(self.combo)
        layout.addWidget(self.description)
        layout.addWidget(self.form_host)
        self._strategies: list[Any] = []
        self._available: dict[str, tuple[bool, str]] = {}
        self._values: dict[str, dict[str, Any]] = {}
        self._widgets: dict[str, QWidget] = {}
        self._options: dict[str, Any] = {}
        self._current: str | None = None

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
        self._store()
        return dict(self._values.get(self._current or "", {}))

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

    # -- internals -----------------------------------------------------------------------------------

    def _selected(self, index: int) -> None:
        if index < 0 or index >= len(self._strategies):
            return
        self._store()
        self._current = self._strategies[index].name
        self._build(self._current)
        self.sigChanged.emit()

    def _store(self) -> None:
        if self._current is None:
            return
        self._values[self._current] = {
            name: _widget_value(w, self._options[name]) for name, w in self._widgets.items()
        }

    def _build(self, name: str) -> None:
        while self.form.rowCount():
            self.form.removeRow(0)
        self._widgets.clear()
        self._options.clear()
        strategy = next(s for s in self._strategies if s.name == name)
        self.description.setText(strategy.description)
        saved = self._values.get(name, {})
        for option in strategy.options:
            widget = _make_widget(option)
            if option.name in saved:
                _set_widget(widget, option, saved[option.name])
            label = QLabel(option.name.replace("_", " "))
            if option.help:
                widget.setToolTip(option.help)
                label.setToolTip(option.help)
            self.form.addRow(label, widget)
            self._widgets[option.name] = widget
            self._options[option.name] = option
        if not strategy.options:
            note = QLabel("no options")
            note.setObjectName("muted")
            self.form.addRow(note)


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
