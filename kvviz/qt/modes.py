"""The window's modes, in the order of their tabs: the shell (main window, Controls, status line, File menu, Help)
loops over this list and knows nothing else of them (kvviz.qt.mode_api says what a mode is). A new mode is a folder
in kvviz/qt/, its line here, and its name in pyproject's import contract."""

from __future__ import annotations

from kvviz.qt.chat.mode import ChatMode
from kvviz.qt.choose.mode import ChooseMode
from kvviz.qt.evaluate.mode import EvaluateMode
from kvviz.qt.local.mode import LocalMode
from kvviz.qt.mode_api import Mode
from kvviz.qt.serve.mode import ServeMode
from kvviz.qt.server.mode import ServerMode

MODES: list[type[Mode]] = [LocalMode, EvaluateMode, ServerMode, ChatMode, ChooseMode, ServeMode]
