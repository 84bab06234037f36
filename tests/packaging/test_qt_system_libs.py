"""`make run` finds the system libraries Qt's X11 plugin lacks and names their Debian packages."""

import os
import subprocess
import sys
from pathlib import Path

import PySide6

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))
import qt_system_libs  # noqa: E402

LDD = """\
\tlinux-vdso.so.1 (0x00007ffd6d5f5000)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007f0d0e400000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1 (0x00007f0d0e3d0000)
"""


def test_ldd_output_parsed_to_the_missing_names():
    assert qt_system_libs.unresolved(LDD) == {"libxcb-icccm.so.4", "libxcb-keysyms.so.1"}
    assert {qt_system_libs.PACKAGES[n] for n in qt_system_libs.unresolved(LDD)} == {"libxcb-icccm4", "libxcb-keysyms1"}


def test_the_check_on_this_machine_agrees_with_ldd():
    pyside = Path(PySide6.__file__).parent
    plugin = pyside / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    ldd = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True).stdout
    result = subprocess.run([sys.executable, str(ROOT / "packaging" / "qt_system_libs.py"), str(pyside), "--check"],
                            capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    missing = qt_system_libs.unresolved(ldd)
    for name in missing:
        assert qt_system_libs.PACKAGES[name] in result.stderr
    if not missing and all(qt_system_libs.known_to_loader(n) for n in qt_system_libs.DLOPENED):
        assert result.returncode == 0 and result.stderr == ""
    else:
        assert result.returncode == 1
