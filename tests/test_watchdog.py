"""The suite's watchdog (tests/watchdog.py): a stuck test ends its run with every thread's stack."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STUCK = '''
import threading


def test_stuck():
    never = threading.Event()
    never.wait()
'''


def test_a_stuck_test_ends_its_run_and_says_where_it_waits(tmp_path):
    (tmp_path / "test_stuck.py").write_text(STUCK)
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.watchdog", "-p", "no:cacheprovider",
                          str(tmp_path / "test_stuck.py")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "KVVIZ_TEST_HUNG_AFTER_S": "1"})
    assert ran.returncode == 1
    assert "test_stuck.py::test_stuck still runs after 1 s" in ran.stderr, ran.stderr
    assert 'test_stuck.py", line 7 in test_stuck' in ran.stderr, ran.stderr  # the stuck line itself
    # and last, where CI's tail shows it: the stuck line as the main thread's own
    assert ran.stderr.rstrip().endswith(f"MainThread: {tmp_path / 'test_stuck.py'}:7 in test_stuck"), ran.stderr
