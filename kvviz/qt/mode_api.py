"""What a window mode is, and what it may use of the window.

A mode (Local run, Evaluate, vLLM server, Chat, Choose) is one object, a `Mode`, and the window's shell loops over
the modes of kvviz.qt.modes.MODES: one tab for each in the Controls dock and one among the central views, its pages in
the Controls, its central view, its part of every redraw and of the status line, its File menu entries, its Help
section and the kept files it opens. A new mode is a folder in kvviz/qt/ holding a Mode subclass, plus its line in
MODES (and its name in the import contract of pyproject.toml).

A mode never holds the window. It is given a `ModeHost`: the few things of the window a mode may use (messages,
the status line, redraws, the shared model, the Controls' shared panels, the file dialogs, the runs and the
settings). A test reads every module of every mode and fails on anything else it reaches for.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from PySide6.QtCore import QObject, QSettings, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QWidget

if TYPE_CHECKING:
    from kvviz.qt.file_dialogs import FileDialogs
    from kvviz.qt.model_host import ModelHost
    from kvviz.qt.run_store import RunStore
    from kvviz.qt.shared_panels import SharedPanels
    from kvviz.qt.theme import Palette

Part = Callable[[], None]  # one piece of a redraw: the scheduler gives each its own turn of the event loop
Figures = tuple[float | None, float | None, int | None]  # the status bar's tokens/s, share of the memory bound, cache


def refused_switch(strategy: str, why: str) -> str:
    """The message above the views when a running cache cannot switch to `strategy`: the engine's refusal names both
    strategies ("cannot switch from 'dynamic' to 'kvzip': ..."), any other reason gets them said first."""
    if why.startswith("cannot switch from "):
        return why[0].upper() + why[1:]
    return f"Cannot switch to {strategy!r}: {why}"


@dataclass(frozen=True)
class FileEntry:
    """An entry of the File menu that a mode adds (Save evaluation…): `ask` shows the dialog and does the rest."""

    key: str  # its name in window.file_actions.actions
    text: str  # the menu's words, with the & of its accelerator
    ask: Callable[[], None]
    shortcut: QKeySequence | None = None


class ModeHost:
    """The window as a mode sees it. The window's own implementation is kvviz.qt.window_host.WindowHost."""

    settings: QSettings  # what is kept between sessions
    store: RunStore  # every run of the Runs table (the local runs, a server's requests)
    model: ModelHost  # the worker thread and the model it loaded: its card, whether it loads, its strategies
    panels: SharedPanels  # the Controls' panels the modes share: model chooser, prompt, settings, strategy picker
    dialogs: FileDialogs  # open and save dialogs that start where the user last was, for each kind of file

    def show_error(self, message: str) -> None:
        """The message above the views, until dismissed or `hide_error`."""
        raise NotImplementedError

    def hide_error(self) -> None:
        raise NotImplementedError

    def say(self, text: str) -> None:
        """The status line's first words, until its next update."""
        raise NotImplementedError

    def hold(self, text: str) -> None:
        """The status line's first words until what runs ends ("stopping after this step…")."""
        raise NotImplementedError

    def note(self, text: str, ms: int = 20_000) -> None:
        """A passing note in the status bar."""
        raise NotImplementedError

    def saved(self, path: str | os.PathLike, detail: str = "") -> None:
        """Confirm a save in the status bar with the file's full path."""
        raise NotImplementedError

    def tell(self, title: str, text: str) -> None:
        """A message box that does not block (a save refused: "Nothing to save")."""
        raise NotImplementedError

    def write(self, what: str, write: Callable[[], Any], where: str | os.PathLike,
              detail: Callable[[Any], str] = lambda written: "") -> Any:
        """A save: `write()` keeps `what` at `where` (a file or a folder) and is confirmed in the status bar with the
        full path and `detail(what write returned)`; where it cannot be written, a message says why and this
        returns None."""
        raise NotImplementedError

    def ask(self, title: str, text: str, yes: str, on_yes: Callable[[], None]) -> QWidget:
        """A question that does not block (so scripts and tests go on): `yes` is its button that calls `on_yes`,
        beside Cancel. Returns the dialog."""
        raise NotImplementedError

    def update_controls(self) -> None:
        """Every mode's buttons and the menus again (something started, ended, or was typed)."""
        raise NotImplementedError

    def request_redraw(self) -> None:
        """Draw soon (the redraw scheduler: at most about 30 frames a second)."""
        raise NotImplementedError

    def redraw(self) -> None:
        """Draw now, all at once."""
        raise NotImplementedError

    def redraw_then(self, then: Callable[[], None]) -> None:
        """Draw a frame now, part by part, then call `then` (the end of a job is announced once it is on screen)."""
        raise NotImplementedError

    def show(self, mode: Mode) -> None:
        """Bring `mode` on screen (its tabs, its Controls, its view)."""
        raise NotImplementedError


class Mode(QObject):
    """One mode of the window. Subclasses set the class attributes, build their widgets in __init__ and override
    what they do; every method here has the default of a mode that does not do it."""

    key: ClassVar[str]  # its name in code, settings and tests: "local", "evaluate", ...
    title: ClassVar[str]  # the central tab's words: "Local run"
    short_title: ClassVar[str]  # the Controls tab's words, where five share the dock's width: "Local"
    tip: ClassVar[str]  # both tabs' tooltip
    hides_docks: ClassVar[bool] = False  # the Tokens and Runs docks (the local runs') step aside while it shows
    formats: ClassVar[tuple[type, ...]] = ()  # the kept records it opens (kvviz.files.formats.read_kept's kinds)
    help: ClassVar[tuple[tuple[str, str], ...]] = ()  # Help ▸ What the views show: (title, paragraph) per view

    sigChanged = Signal()  # something to draw: the window schedules a redraw

    # its widgets, made in __init__
    view: QWidget  # the central view
    controls: list[QWidget]  # its Controls column, top to bottom (the shared panels it shows by reference)
    buttons: QWidget  # below the Controls, always in view
    corner: QWidget | None = None  # beside the central tabs while it shows (the local runs' legend)
    file_entries: tuple[FileEntry, ...] = ()  # its File menu entries

    def __init__(self, host: ModeHost):
        super().__init__()
        self.host = host

    # -- what it does ------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """It runs something on the worker (no other mode may start, no model may load)."""
        return False

    def can_start(self) -> bool:
        """Its main button (Run, Evaluate, Send, Choose) would start something now (Run ▸ Run follows it)."""
        return False

    def start(self, extra_settings: dict[str, Any] | None = None) -> Any:
        """Its main button, also Run ▸ Run (Ctrl+Enter); what it started (an id) or None. extra_settings: further
        generation settings where the mode generates (the bench's stop_at_eos=False)."""
        return None

    def stop(self) -> None:
        """Run ▸ Stop (Esc): stop what it runs, keeping what was measured."""

    def can_switch(self) -> bool:
        """Run ▸ Switch (F6) would convert a running cache now."""
        return False

    def switch(self) -> bool:
        """Convert the running cache to the strategy in the picker; False when nothing was asked."""
        return False

    def update_controls(self, ready: bool) -> None:
        """Enable its buttons; ready: a model is loaded and nothing runs on the worker."""

    def status(self) -> str:
        """The status line's first words while it runs or shows ("" where it has nothing to say)."""
        return ""

    def figures(self) -> Figures | None:
        """The status bar's figures while it runs or shows; None: those of the runs (the Runs table's)."""
        return None

    # -- drawing -----------------------------------------------------------------------------------------

    def redraw_parts(self) -> list[Part]:
        """The parts that draw what changed in its view (called while it is on screen)."""
        return []

    def plots(self) -> list:
        """The plots File ▸ Export plots writes while it is on screen, each drawn."""
        return []

    def restyle(self, palette: Palette) -> None:
        """Its view in the theme's colours."""

    def enter(self) -> None:
        """It came on screen."""

    def reset_layout(self) -> None:
        """View ▸ Reset layout: its view's splitters back to their first sizes."""

    # -- kept files and settings ------------------------------------------------------------------------

    def open(self, kept: Any) -> Any:
        """Show a kept record of one of `formats` (File ▸ Open, drag and drop, --open); it or its run id, None when
        refused (the mode says why)."""
        return None

    def offer_to_continue(self, kept: Any, journal: Path) -> None:
        """`kept` (shown by `open`) came from `journal`, a journal that a process ended without warning left: where
        the mode can continue what it holds, ask the user (`ModeHost.ask`) and continue on yes."""

    def restore_settings(self, settings: QSettings) -> None:
        """Its part of the settings of the last session."""

    def save_settings(self, settings: QSettings) -> None:
        """Keep its part of the settings (the window is closing)."""

    # -- closing ----------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """The window closes: stop what runs (the worker thread is joined after every mode's shutdown)."""

    def keep_at_close(self) -> Path | None:
        """Once the worker has ended: write what must not be lost and is not saved (the chat's turns); the file
        written, or None. May raise OSError."""
        return None
