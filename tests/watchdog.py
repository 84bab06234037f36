"""A test still running after HUNG_AFTER_S is stuck: its process prints every thread's stack and exits.

CI has a time limit and shows only what the run printed: waiting on a stuck test spends that limit and says nothing
of where it stuck. The stacks go to the real stderr, past pytest's capture: in an xdist worker that is the only
output that reaches the console (its stdout carries the worker's messages). `make test` runs with
--max-worker-restart=0, so the run ends there, failed, instead of sending the stuck test to a new worker.
A test that bounds its own waits beyond that says how long it may take with `@pytest.mark.hung_after(seconds)`;
KVVIZ_TEST_HUNG_AFTER_S changes the limit for all others (the watchdog's own test).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import sysconfig
import threading

import pytest

LIBRARIES = tuple({sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")})
HUNG_AFTER_S = float(os.environ.get("KVVIZ_TEST_HUNG_AFTER_S", 900))  # make test's slowest take about a minute


def pytest_configure(config):
    config.addinivalue_line("markers", "hung_after(seconds): how long the test may run before the watchdog ends it")


def _hung(item, after_s: float) -> None:
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
    sys.stderr.write(f"\n{item.nodeid} still runs after {after_s:.0f} s; where every thread is:\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.write(_in_short())
    sys.stderr.flush()
    os._exit(1)


def _in_short() -> str:
    """Each thread's innermost frame outside Python's and the installed packages' code (kvviz's or a test's), last:
    CI shows only the tail of the log, where the full dump ends in the test runner's frames (CI, stop 46: a hang
    whose log said nothing of where it hung)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    lines = ["where each thread is in kvviz or the tests (the stacks above say the rest):"]
    main = threading.main_thread().ident
    for ident, frame in sorted(sys._current_frames().items(), key=lambda item: item[0] == main):  # main last
        if ident == threading.get_ident():
            continue  # this watchdog
        while frame is not None and (frame.f_code.co_filename.startswith(LIBRARIES)
                                     or not os.path.isabs(frame.f_code.co_filename)):
            frame = frame.f_back
        where = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}" if frame else "-"
        lines.append(f"  {names.get(ident, ident)}: {where}")
    return "\n".join(lines) + "\n"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    marker = item.get_closest_marker("hung_after")
    after_s = marker.args[0] if marker else HUNG_AFTER_S
    watchdog = threading.Timer(after_s, _hung, (item, after_s))
    watchdog.name, watchdog.daemon = "kvviz-test-watchdog", True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
        watchdog.join()
