"""The server launcher's safety net, without vLLM: children die with the process that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

PARENT = """
import subprocess, sys, time
from kvviz.attach.server import die_with_parent
child = subprocess.Popen(["sleep", "60"], start_new_session=True, preexec_fn=die_with_parent)
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_child_dies_with_a_killed_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)  # as `timeout` or a CI runner would
        parent.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the child outlived its parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)


def test_free_port_is_loopback_and_usable():
    import socket

    from kvviz.attach.server import VllmServer, free_port

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    server = VllmServer("/nonexistent/python", "/model", port=port)
    assert server.url == f"http://127.0.0.1:{port}"
    assert server.args[server.args.index("--host") + 1] == "127.0.0.1"
    assert "--enable-prefix-caching" in server.args


def test_attach_imports_neither_qt_nor_torch():
    code = (
        "import sys, kvviz.attach.metrics, kvviz.attach.poller, kvviz.attach.client, kvviz.attach.load, "
        "kvviz.attach.session, kvviz.attach.server, kvviz.cli.attach; "
        "print(sorted(m for m in ('torch', 'PySide6', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
