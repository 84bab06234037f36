"""A mode is one object: the shell loops over kvviz.qt.modes.MODES, a new mode is one folder and one line, and a mode
reaches the window only through its ModeHost."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

from PySide6.QtWidgets import QTextBrowser

import kvviz.qt
from kvviz.qt import modes
from kvviz.qt.mode_api import ModeHost

ROOT = Path(__file__).resolve().parents[2]

THROWAWAY = '''
"""A mode made by a test: nothing but what every mode declares."""

from PySide6.QtWidgets import QLabel, QPushButton

from kvviz.qt.mode_api import FileEntry, Mode


class ThrowawayMode(Mode):
    key = "throwaway"
    title = "Throwaway view"
    short_title = "Throw"
    tip = "A mode a test added"
    help = (("Throwaway view", "What the throwaway view shows: nothing, in nothing per second."),)

    def __init__(self, host):
        super().__init__(host)
        self.view = QLabel("the throwaway view")
        self.page = QLabel("the throwaway controls")
        self.controls = [host.panels.model_panel, self.page]
        self.buttons = QPushButton("Throw")
        self.asked: list[str] = []
        self.file_entries = (FileEntry("throwaway", "Save thro&waway…", lambda: self.asked.append("save")),)
'''


def mode_folders() -> list[Path]:
    return [Path(importlib.import_module(cls.__module__.rsplit(".", 1)[0]).__file__).parent for cls in modes.MODES]


def test_a_new_mode_is_one_folder_and_one_line(qtbot, settings, tmp_path, monkeypatch):
    """A throwaway mode in a folder of its own plus its line in MODES: both tab bars, its Controls and buttons, Help
    and the File menu have it, and the shell switches to it and back like any other."""
    folder = tmp_path / "throwaway"
    folder.mkdir()
    (folder / "__init__.py").write_text('"""A mode a test added."""\n', encoding="utf-8")
    (folder / "mode.py").write_text(textwrap.dedent(THROWAWAY), encoding="utf-8")
    monkeypatch.setattr(kvviz.qt, "__path__", [*kvviz.qt.__path__, str(tmp_path)])  # the folder, as if in kvviz/qt
    throwaway = importlib.import_module("kvviz.qt.throwaway.mode").ThrowawayMode
    monkeypatch.setattr(modes, "MODES", [*modes.MODES, throwaway])  # the one line

    from kvviz.qt.main_window import MainWindow

    window = MainWindow(settings=settings)
    qtbot.addWidget(window)
    window.show()
    try:
        last = window.views.count() - 1
        assert window.views.tabText(last) == "Throwaway view" and window.views.tabToolTip(last) == "A mode a test added"
        assert window.controls.source_tabs.tabText(last) == "Throw"
        window.controls.source_tabs.setCurrentIndex(last)  # as a user clicks its tab
        mode = window.modes["throwaway"]
        assert window.mode is mode and window.views.currentIndex() == last
        assert mode.page.isVisibleTo(window) and window.controls.model_panel.isVisibleTo(window)
        assert not window.controls.prompt_panel.isVisibleTo(window) and mode.buttons.isVisibleTo(window)
        assert mode.view.isVisibleTo(window)
        window.set_mode("local")  # and back: the local runs' Controls, not the throwaway's
        assert not mode.page.isVisibleTo(window) and window.controls.prompt_panel.isVisibleTo(window)

        menu = next(a.menu() for a in window.menuBar().actions() if a.text().replace("&", "") == "File")
        texts = [a.text().replace("&", "") for a in menu.actions()]
        assert "Save throwaway…" in texts and texts.index("Save throwaway…") < texts.index("Export runs table as CSV…")
        window.file_actions.actions["throwaway"].trigger()
        assert mode.asked == ["save"]

        views = window.help.show_views()
        body = views.findChild(QTextBrowser).toPlainText()
        assert "Throwaway view" in body and "nothing, in nothing per second" in body
        views.close()
    finally:
        window.close()
    assert not window.model.thread.isRunning()


def test_every_mode_is_a_package_in_the_window_s_import_contract():
    """The contract that keeps modes from importing each other names every mode's folder (the line a new mode adds
    there), and the shared layer names every other module of kvviz.qt."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c.get("containers") == ["kvviz.qt"])
    layers = [set(layer.replace(":", "|").replace(" ", "").split("|")) for layer in contract["layers"]]
    assert {folder.name for folder in mode_folders()} in layers
    named = set().union(*layers)
    here = Path(kvviz.qt.__file__).parent
    modules = {p.stem for p in here.glob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in here.glob("*/__init__.py")}
    assert modules == named, (modules - named, named - modules)


def test_modes_reach_the_window_only_through_their_host():
    """No module of any mode holds the window: each reads only what ModeHost declares."""
    declared = {name for name in dir(ModeHost) if not name.startswith("_")} | set(ModeHost.__annotations__)
    for folder in mode_folders():
        for path in sorted(folder.glob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
                assert not (isinstance(node, ast.Name) and node.id == "window"), f"{where} names the window"
                if not isinstance(node, ast.Attribute):
                    continue
                assert node.attr != "window", f"{where} reads .window"
                base = node.value
                on_host = (isinstance(base, ast.Name) and base.id == "host") or (
                    isinstance(base, ast.Attribute) and base.attr == "host")
                assert not on_host or node.attr in declared, f"{where} reads host.{node.attr}, which ModeHost lacks"


WATCH_IMPORTS = '''
import sys, threading
from importlib.abc import MetaPathFinder

first = {}


class Watch(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("torch", "transformers") and name not in first:
            first[name] = threading.current_thread() is threading.main_thread()
        return None


sys.meta_path.insert(0, Watch())
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

app = QApplication([])
from kvviz.qt.main_window import MainWindow
from kvviz.qt.tools import drive

window = MainWindow(QSettings(sys.argv[1], QSettings.Format.IniFormat))
window.show()
drive.wait(lambda: bool(window.controls.strategy_panel.names()), 120)
for key in window.modes:  # every mode on screen once
    window.set_mode(key)
    window.redraw()
window.help.show_views().close()
print("ON_GUI_THREAD", first)
window.close()
'''


def test_the_window_imports_torch_on_the_worker_thread_only(tmp_path):
    """Opening the window, showing every mode and Help never imports torch or transformers on the GUI thread (that
    costs the window about a second before it shows): the worker imports them, as it runs every engine call."""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    ran = subprocess.run([sys.executable, "-c", WATCH_IMPORTS, str(tmp_path / "kvviz.ini")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    line = next(line for line in ran.stdout.splitlines() if line.startswith("ON_GUI_THREAD"))
    first = eval(line.split(" ", 1)[1])  # noqa: S307 - the dict this test's own child printed
    assert first.get("torch") is False and first.get("transformers") in (None, False), first
