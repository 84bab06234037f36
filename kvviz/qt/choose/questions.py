"""The Choose mode's questions (off by default): ask every configuration questions too, as `kvviz choose --task` or
`--qa` does: tasks kvviz writes (kvviz.engine.tasks), their items and length, or the user's own question file (a JSONL
file with kvpress's columns, or a kept conversation), in the regimes ticked, read raw or in the chat template.

A question file is read when it is opened (`kvviz.files.qa.read_asked`, the command's own reader): a bad one is
refused with the command's message and the file chosen before stays.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSpinBox,
    QWidget,
)

from kvviz.engine.tasks import TASKS
from kvviz.files import qa
from kvviz.files.sweep import Asked

ITEMS, LENGTH = 5, 1000  # as `kvviz choose --items/--length`


class QuestionsPanel(QGroupBox):
    sigOpenRequested = Signal()  # "Question file…": choose one
    sigChanged = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Ask questions too", parent)
        self.setCheckable(True)
        self.setChecked(False)
        self.setToolTip("Score every configuration's answers too, beside its perplexity (kvviz choose --task/--qa)")
        self.tasks = QListWidget()
        for name, recipe in TASKS.items():
            item = QListWidgetItem(name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if name == "niah_single_1" else Qt.CheckState.Unchecked)
            item.setToolTip(f"{recipe.summary} ({recipe.source})")
            self.tasks.addItem(item)
        row = self.tasks.fontMetrics().height() + 4
        self.tasks.setFixedHeight(len(TASKS) * row + 6)
        self.tasks.setToolTip("The tasks kvviz writes, reproducible from the seed, at the length asked")
        self.items = QSpinBox()
        self.items.setRange(1, 1000)
        self.items.setValue(ITEMS)
        self.items.setToolTip("Items per task")
        self.length = QSpinBox()
        self.length.setRange(16, 10**7)
        self.length.setSingleStep(250)
        self.length.setValue(LENGTH)
        self.length.setGroupSeparatorShown(True)
        self.length.setToolTip("Tokens each item is written to fit, its questions and answers included")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.seed.setToolTip("What the items are written from: the same seed writes the same items")
        for box in (self.items, self.length, self.seed):
            box.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.file_button = QPushButton("Question file…")
        self.file_button.setToolTip("Your own questions instead of the tasks: a JSONL file with kvpress's columns "
                                    "(context, question, answers, optional answer_prefix and max_new_tokens), or a "
                                    "kept conversation (kvviz chat --trace)")
        self.clear_button = QPushButton("Tasks")
        self.clear_button.setToolTip("Ask the tasks ticked above instead of the question file")
        self.file_label = QLabel()
        self.file_label.setObjectName("muted")
        self.file_label.setWordWrap(True)
        self.regimes = {name: QCheckBox(name) for name in qa.REGIMES}
        self.regimes["query-agnostic"].setChecked(True)
        for name, box in self.regimes.items():
            box.setToolTip(REGIME_TIPS[name])
        self.raw = QCheckBox("plain text (no chat template)")
        self.raw.setToolTip("Read context, question and answer prefix as plain text, without the chat template "
                            "(--raw)")
        form = QFormLayout()
        form.addRow("items per task", self.items)
        form.addRow("length (tokens)", self.length)
        form.addRow("seed", self.seed)
        files = QHBoxLayout()
        files.addWidget(self.file_button, 1)
        files.addWidget(self.clear_button)
        grid = QGridLayout()
        for n, box in enumerate(self.regimes.values()):
            grid.addWidget(box, n // 2, n % 2)
        layout = QFormLayout(self)
        layout.addRow(self.tasks)
        layout.addRow(form)
        layout.addRow(files)
        layout.addRow(self.file_label)
        layout.addRow(grid)
        layout.addRow(self.raw)
        self.path: Path | None = None
        self.questions: list[qa.QAItem] | None = None  # the question file's, read when opened
        self.file_button.clicked.connect(lambda *_: self.sigOpenRequested.emit())
        self.clear_button.clicked.connect(lambda *_: self.use_tasks())
        self.toggled.connect(lambda *_: self.sigChanged.emit())
        self._show_source()

    def open_path(self, path: str | os.PathLike) -> str | None:
        """Ask the questions of this file instead of the tasks; what is wrong with it (the command's message, the file
        chosen before kept), or None."""
        try:
            questions = qa.read_asked(path)
        except qa.QAFileError as exc:
            return str(exc)
        self.path, self.questions = Path(path), questions
        self.setChecked(True)
        self._show_source()
        return None

    def use_tasks(self) -> None:
        self.path = self.questions = None
        self._show_source()

    def _show_source(self) -> None:
        tasks = self.questions is None
        for widget in (self.tasks, self.items, self.length, self.seed):
            widget.setEnabled(tasks)
        self.clear_button.setVisible(not tasks)
        self.file_label.setText("the tasks ticked above" if tasks else
                                f"{self.path.name}: {len(self.questions)} item(s), the tasks are not asked")
        self.file_label.setToolTip("" if tasks else str(self.path))
        self.sigChanged.emit()

    def show_asked(self, asked: Asked | None) -> None:
        """An opened sweep's questions as asked: its regimes, and its tasks with their items, length and seed (or its
        question file's items, named by the file's name)."""
        self.setChecked(asked is not None)
        if asked is None:
            return
        for name, box in self.regimes.items():
            box.setChecked(name in asked.regimes)
        self.raw.setChecked(asked.raw)
        tasks = [item.task for item in asked.items]
        if asked.seed is not None and tasks and all(task in TASKS for task in tasks):
            for i in range(self.tasks.count()):
                item = self.tasks.item(i)
                item.setCheckState(Qt.CheckState.Checked if item.text() in tasks else Qt.CheckState.Unchecked)
            self.items.setValue(max(tasks.count(task) for task in set(tasks)))
            self.length.setValue(asked.length or self.length.value())
            self.seed.setValue(asked.seed)
            self.use_tasks()
        else:
            self.path, self.questions = Path(asked.source), list(asked.items)
            self._show_source()

    def task_names(self) -> list[str]:
        rows = (self.tasks.item(i) for i in range(self.tasks.count()))
        return [item.text() for item in rows if item.checkState() == Qt.CheckState.Checked]

    def problem(self) -> str | None:
        """What keeps the questions from being asked (nothing ticked), with what would do; None when they can be."""
        if not self.isChecked():
            return None
        if self.questions is None and not self.task_names():
            return "no task is ticked; tick one under Ask questions too, or open a question file"
        if not any(box.isChecked() for box in self.regimes.values()):
            return f"no regime is ticked; tick one of {', '.join(qa.REGIMES)}"
        return None

    def request(self) -> dict[str, Any] | None:
        """The runner's "asked" request (kvviz.engine.qa_prompt.asked's arguments), or None when none are asked."""
        if not self.isChecked():
            return None
        return {"regimes": [name for name, box in self.regimes.items() if box.isChecked()],
                "raw": self.raw.isChecked(), "questions": self.questions,
                "source": self.path.name if self.path else None,
                "task": None if self.questions is not None else ",".join(self.task_names()),
                "items": self.items.value(), "length": self.length.value(), "seed": self.seed.value()}

    def budgets_of(self) -> int | None:
        """The tokens the default grid's budgets are fractions of while tasks are asked: their length."""
        return self.length.value() if self.isChecked() and self.questions is None else None

    def set_enabled(self, editable: bool) -> None:
        self.setEnabled(editable)


REGIME_TIPS = {
    "query-agnostic": "kvpress's default: the context is compressed before the question is seen",
    "query-aware": "the context and the question compressed together (--question-in-cache)",
    "decode-time": "the context fed token by token, the policy evicting as it reads (as kvviz eval)",
    "multi-turn": "several questions on one kept cache, one after another (SCBench)",
}
