"""Running `kvviz COMMAND ...` from a test: in this process (the default: no torch import or model load
per call), or as a real subprocess where the process itself is what is tested (exit statuses through the
console entry point, signals, what a fresh interpreter imports)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def kvviz(*args, cwd=None) -> Ran:
    """`kvviz ARGS` through kvviz.cli.main.main in this process, stdout and stderr captured."""
    from kvviz.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _working_directory(cwd):
        try:
            status = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's usage errors and --help
            status = exc.code if isinstance(exc.code, int) else 2
    return Ran(status, out.getvalue(), err.getvalue())


def kvviz_process(*args, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    """`python -m kvviz ARGS` in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "kvviz", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})}, timeout=timeout)


@contextlib.contextmanager
def _working_directory(path):
    if path is None:
        yield
        return
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)
