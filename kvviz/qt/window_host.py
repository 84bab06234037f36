"""The window's own ModeHost: what kvviz.qt.mode_api.ModeHost declares, carried out by the main window. The one
place a mode's request reaches the window's parts."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

from kvviz.qt.mode_api import Mode, ModeHost


class WindowHost(ModeHost):
    def __init__(self, window):
        self.window = weakref.proxy(window)  # the window holds its modes, which hold this: no cycle back to it
        self.settings = window.settings
        self.store = window.store
        self.model = window.model
        self.panels = window.panels
        self.dialogs = window.file_actions.dialogs

    def show_error(self, message: str) -> None:
        self.window.show_error(message)

    def hide_error(self) -> None:
        self.window.error_bar.hide()

    def say(self, text: str) -> None:
        self.window.status_line.say(text)

    def hold(self, text: str) -> None:
        self.window.status_line.hold(text)

    def note(self, text: str, ms: int = 20_000) -> None:
        self.window.statusBar().showMessage(text, ms)

    def saved(self, path: str | os.PathLike, detail: str = "") -> None:
        self.window.say_saved(path, detail)

    def tell(self, title: str, text: str) -> None:
        self.window.file_actions.show_message(title, text)

    def write(self, what: str, write: Callable[[], Any], where: str | os.PathLike,
              detail: Callable[[Any], str] = lambda written: "") -> Any:
        try:
            written = write()
        except OSError as exc:
            self.tell(f"Could not save {what}", f"Could not save {where}: {exc.strerror or exc}")
            return None
        self.saved(where, detail(written))
        return written

    def ask(self, title: str, text: str, yes: str, on_yes: Callable[[], None]):
        return self.window.file_actions.ask(title, text, yes, on_yes)

    def update_controls(self) -> None:
        self.window.update_controls()

    def request_redraw(self) -> None:
        self.window.redraws.schedule()

    def redraw(self) -> None:
        self.window.redraw()

    def redraw_then(self, then: Callable[[], None]) -> None:
        self.window.redraws.redraw_then(then)

    def show(self, mode: Mode) -> None:
        self.window.set_mode(mode)
