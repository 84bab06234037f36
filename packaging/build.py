"""Build the PyInstaller one-folder bundle: dist/kvviz/kvviz (plus its _internal/ folder).

    .venv/bin/python packaging/build.py            # stage, freeze, print time and size
    .venv/bin/python packaging/build.py --clean    # also drop PyInstaller's cache first

Steps:
1. Stage: build a wheel of this checkout (pip wheel --no-deps, in an isolated build env) and unpack it into
   build/packaging/stage/, so the bundle holds kvviz exactly as `pip install .` lays it out,
   kvviz.resources included, with its dist-info (version). If the wheel lacks kvviz/resources
   (pyproject not mapping it), the repository's resources/ is copied in and a warning printed.
2. Freeze: PyInstaller with packaging/kvviz.spec, analysing the staged tree.
3. Report: wall time and bundle size, also written to build/packaging/build-report.json.

Needs pyinstaller in the venv: `pip install -c constraints.txt pyinstaller`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "packaging"
STAGE = WORK / "stage"


def stage() -> pathlib.Path:
    wheel_dir = WORK / "wheel"
    shutil.rmtree(wheel_dir, ignore_errors=True)
    shutil.rmtree(STAGE, ignore_errors=True)
    wheel_dir.mkdir(parents=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(wheel_dir),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = wheel_dir.glob("kvviz-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(STAGE)
    res = STAGE / "kvviz" / "resources"
    if not (res / "__init__.py").is_file():
        print(
            "WARNING: the wheel has no kvviz/resources package (see packaging/README.md: pyproject must "
            "list kvviz.resources in its packages); copying resources/ into the bundle instead",
            file=sys.stderr,
        )
        shutil.copytree(
            ROOT / "resources", res, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    return STAGE


def dir_size(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build the kvviz PyInstaller bundle")
    ap.add_argument("--clean", action="store_true", help="empty PyInstaller's cache and work folder first")
    ap.add_argument("--distpath", default=str(ROOT / "dist"))
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    stage_dir = stage()
    t_stage = time.perf_counter() - t0
    cmd = [
        sys.executable,
        "-m",
        "PyInstaller",
        "--noconfirm",
        "--log-level",
        "WARN",
        "--distpath",
        args.distpath,
        "--workpath",
        str(WORK / "pyinstaller"),
        str(ROOT / "packaging" / "kvviz.spec"),
    ]
    if args.clean:
        cmd.insert(3, "--clean")
    env = dict(os.environ, KVVIZ_STAGE=str(stage_dir))
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - t0
    bundle = pathlib.Path(args.distpath) / "kvviz"
    size = dir_size(bundle)
    report = {
        "bundle": str(bundle),
        "executable": str(bundle / "kvviz"),
        "seconds": round(seconds, 1),
        "stage_seconds": round(t_stage, 1),
        "bytes": size,
        "files": sum(1 for p in bundle.rglob("*") if p.is_file()),
    }
    (WORK / "build-report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"built {bundle} in {seconds:.0f} s: {size / 1e6:.0f} MB in {report['files']} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
