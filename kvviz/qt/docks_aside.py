"""The local runs' docks (Tokens, Runs) out of the way while a mode with views of its own is on screen (Evaluate,
Conversation), and back for the local runs and for the saved layout."""

from __future__ import annotations

from contextlib import contextmanager


class DocksAside:
    def __init__(self, *docks):
        self.docks = docks
        self.aside = False
        self._hidden: list = []

    def enter(self) -> None:
        """Hide the docks that are shown in the window (a floating one stays where the user put it)."""
        if self.aside:
            return
        self.aside = True
        self._hidden = [d for d in self.docks if d.isVisible() and not d.isFloating()]
        for dock in self._hidden:
            dock.hide()

    def leave(self) -> None:
        if not self.aside:
            return
        self.aside = False
        for dock in self._hidden:
            dock.show()
        self._hidden = []

    @contextmanager
    def back(self):
        """The docks as the local mode has them for the block (the window's layout saved or reset)."""
        aside = self.aside
        self.leave()
        try:
            yield
        finally:
            if aside:
                self.enter()
