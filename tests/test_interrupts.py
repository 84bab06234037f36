"""A signal that lands where Python would drop or mangle the exception is delivered again just after."""

import signal
import time

import pytest

from kvviz import interrupts


class SignalledWhileFinalized:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # the handler runs inside this finalizer, as a GC pass can make it


def test_ctrl_c_inside_a_finalizer_is_not_lost(capfd):
    with pytest.raises(KeyboardInterrupt), interrupts.caught():
        SignalledWhileFinalized()  # dropped at once: its __del__ runs here
        time.sleep(60)  # the deferred signal ends this at once
    assert "Exception ignored" not in capfd.readouterr().err


def test_sigterm_is_reported_with_its_own_status():
    with pytest.raises(KeyboardInterrupt) as raised, interrupts.caught():
        signal.raise_signal(signal.SIGTERM)
    assert interrupts.exit_status(raised.value) == 143
