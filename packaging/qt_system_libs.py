"""The system libraries Qt's X11 (xcb) platform plugin needs, installed when they are missing.

`make run` calls this before opening the window: on a bare Debian/Ubuntu desktop Qt aborts with
"could not load the Qt platform plugin xcb" when, for example, libxcb-cursor0, libxcb-icccm4 or
libxcb-keysyms1 are absent. It asks `ldd` which libraries the plugin and Qt's libraries cannot find,
adds the ones Qt opens at run time (dlopen, invisible to ldd), maps them to Debian packages, and
installs them with apt-get when run as root, or stops with the exact command to run. Prints nothing
when all is there. Stdlib only: runs with any Python, before or after the venv exists.

    python packaging/qt_system_libs.py PYSIDE6_DIR [--check]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# Debian/Ubuntu packages for the libraries Qt's xcb plugin and its libraries link or open
PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xinerama.so.0": "libxcb-xinerama0",
    "libxcb-xinput.so.0": "libxcb-xinput0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libSM.so.6": "libsm6",
    "libICE.so.6": "libice6",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libOpenGL.so.0": "libopengl0",
    "libGLX.so.0": "libglx0",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libdbus-1.so.3": "libdbus-1-3",
    "libglib-2.0.so.0": "libglib2.0-0",
}
# opened by Qt at run time, so ldd does not list them
DLOPENED = ("libxcb-cursor.so.0",)


def unresolved(ldd_output: str) -> set[str]:
    """Library names `ldd` printed as "not found"."""
    return {line.split("=>")[0].strip() for line in ldd_output.splitlines() if "not found" in line}


def known_to_loader(name: str) -> bool:
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    return any(line.strip().startswith(name + " ") for line in listing.splitlines())


def missing_libraries(pyside: Path) -> set[str]:
    # ldd lists transitive dependencies: the xcb plugin and the widgets module cover what the window loads
    binaries = [pyside / "Qt" / "plugins" / "platforms" / "libqxcb.so", *sorted(pyside.glob("QtWidgets*.so"))]
    missing = set()
    for binary in binaries:
        if binary.exists():
            result = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
            missing |= unresolved(result.stdout)
    return missing | {name for name in DLOPENED if not known_to_loader(name)}


def main(argv: list[str]) -> int:
    if not sys.platform.startswith("linux") or not shutil.which("ldd") or not argv:
        return 0
    missing = missing_libraries(Path(argv[0]))
    if not missing:
        return 0
    packages = sorted({PACKAGES[name] for name in missing if name in PACKAGES})
    unknown = sorted(name for name in missing if name not in PACKAGES)
    if unknown:
        print(f"Qt cannot find these system libraries: {', '.join(unknown)}; install the packages that provide them.",
              file=sys.stderr)
    if not packages:
        return 1
    command = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    if "--check" in argv or not shutil.which("apt-get"):
        print(f"Qt's window needs these system packages: {' '.join(packages)}", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print(f"Qt's window needs system packages that are missing. Install them with:\n  sudo {' '.join(command)}",
              file=sys.stderr)
        return 1
    print(f"installing the system libraries Qt's window needs: {' '.join(packages)}", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update", "-qq"], [*command, "-qq"]):
        result = subprocess.run(step, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            print(result.stdout + result.stderr, file=sys.stderr)
            print(f"could not install them; run: sudo {' '.join(command)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
