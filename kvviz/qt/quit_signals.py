"""Ctrl-C and SIGTERM for the window: close it as its close button does, from the event loop's own turn.

Qt's event loop runs no Python while the window is idle, so a Python signal handler would wait for the next
Python call (an idle window ignored Ctrl-C until it was closed), and an exception raised from the handler
lands in whatever Python code runs at that moment: inside a Python override of a Qt virtual (an event filter)
PySide prints it and swallows it. So the handler here raises nothing: the signal's number reaches a socket
(signal.set_wakeup_fd, written by the interpreter's C handler), the socket wakes the event loop, and
`sigReceived` is emitted from there. Scripts that drive the window (kvviz.qt.tools) check `received` where
they wait and stop there.
"""

from __future__ import annotations

import signal
import socket

from PySide6.QtCore import QObject, QSocketNotifier, Signal

HANDLED = (signal.SIGINT, signal.SIGTERM)


class QuitSignals(QObject):
    sigReceived = Signal(int)  # the signal's number (SIGINT or SIGTERM), once, from the event loop

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.received: int | None = None
        self._reader, self._writer = socket.socketpair()
        for end in (self._reader, self._writer):
            end.setblocking(False)
        self._notifier = QSocketNotifier(self._reader.fileno(), QSocketNotifier.Type.Read, self)
        self._notifier.activated.connect(self._wake)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno())
        self._previous = {s: signal.signal(s, _ignore_here) for s in HANDLED}

    def exit_status(self) -> int | None:
        """128 + the signal's number as shells report it (130 for Ctrl-C, 143 for SIGTERM), or None."""
        return None if self.received is None else 128 + self.received

    def restore(self) -> None:
        """The handlers from before, and no more waking."""
        self._notifier.setEnabled(False)
        signal.set_wakeup_fd(self._previous_fd)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._reader.close()
        self._writer.close()

    def _wake(self, *_args) -> None:
        try:
            numbers = self._reader.recv(64)
        except BlockingIOError:
            return
        first = next((n for n in numbers if n in HANDLED), None)
        if first is not None and self.received is None:
            self.received = first
            self.sigReceived.emit(first)


def _ignore_here(signum, frame) -> None:
    """The Python-level handler: nothing to do here, the wakeup socket carries the signal to the event loop."""
