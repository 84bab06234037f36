"""The freedesktop entry, the AppStream metainfo and the icon set in resources/.

The validators are Debian's desktop-file-utils and appstream; `make validate-desktop` installs them
when missing. Here a missing tool skips its test with the reason, so a bare machine stays green.
"""

from __future__ import annotations

import configparser
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RES = ROOT / "resources"
APP_ID = "io.github.kvviz.KVViz"
DESKTOP = RES / f"{APP_ID}.desktop"
METAINFO = RES / f"{APP_ID}.metainfo.xml"
HICOLOR = RES / "icons" / "hicolor"
PNG_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian package {package}; `make validate-desktop` installs it)")
    return path


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_desktop_file_validate():
    proc = _run([_tool("desktop-file-validate", "desktop-file-utils"), str(DESKTOP)])
    # desktop-file-validate exits 0 on hints too; we want it silent: no error, warning or hint.
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr


def test_appstreamcli_validate_metainfo():
    proc = _run([_tool("appstreamcli", "appstream"), "validate", "--no-net", "--explain", str(METAINFO)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # appstream 0.16 (Debian 12) does not know <developer id=...> yet (an info, not a warning);
    # appstream 1.x wants it and deprecates <developer_name>. Anything else must be clean.
    lines = [ln for ln in proc.stdout.splitlines() if ln[:2] in ("E:", "W:", "I:")]
    unexpected = [ln for ln in lines if "unknown-tag developer" not in ln]
    assert not unexpected, proc.stdout


def test_appstreamcli_validate_installed_tree(tmp_path):
    """Lay the files out as a distribution package would and let appstream check the whole tree
    (metainfo, the .desktop it launches, and the icon it names)."""
    tool = _tool("appstreamcli", "appstream")
    share = tmp_path / "usr" / "share"
    (share / "applications").mkdir(parents=True)
    (share / "metainfo").mkdir(parents=True)
    shutil.copy(DESKTOP, share / "applications")
    shutil.copy(METAINFO, share / "metainfo")
    shutil.copytree(HICOLOR, share / "icons" / "hicolor")
    proc = _run([tool, "validate-tree", "--no-net", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _desktop() -> configparser.SectionProxy:
    cp = configparser.ConfigParser(interpolation=None, strict=True)
    cp.optionxform = str  # keys are case-sensitive
    cp.read(DESKTOP, encoding="utf-8")
    return cp["Desktop Entry"]


def _metainfo() -> ET.Element:
    return ET.parse(METAINFO).getroot()


def test_ids_agree():
    entry = _desktop()
    root = _metainfo()
    assert root.get("type") == "desktop-application"
    assert root.findtext("id") == APP_ID
    assert root.findtext("launchable[@type='desktop-id']") == DESKTOP.name
    assert entry["Icon"] == APP_ID
    assert root.findtext("icon[@type='stock']") == APP_ID
    assert entry["Exec"].split()[0] == "kvviz"
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "kvviz" in script, "the .desktop Exec= names a console script pyproject must provide"
    assert root.findtext("provides/binary") == "kvviz"


def test_metainfo_release_and_licence():
    root = _metainfo()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    releases = root.findall("releases/release")
    assert releases, "metainfo needs at least one release"
    newest = releases[0]
    assert newest.get("version") == project["version"] == "0.1.0"
    assert newest.get("date") == "2026-12-02"
    assert root.findtext("project_license") == project["license"]
    assert root.findtext("metadata_license") == "CC0-1.0"
    assert root.find("content_rating").get("type") == "oars-1.1"


def test_metainfo_screenshot_points_at_docs_screenshot():
    images = [img.text.strip() for img in _metainfo().iter("image")]
    assert images, "metainfo needs a screenshot"
    assert all(url.startswith("https://") for url in images)
    assert any(url.endswith("docs/screenshot-window.png") for url in images)


def _png_size(path: pathlib.Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("size", PNG_SIZES)
def test_png_icon_sizes(size):
    path = HICOLOR / f"{size}x{size}" / "apps" / f"{APP_ID}.png"
    assert path.is_file(), f"missing {path.relative_to(ROOT)}: run packaging/render_icons.py"
    assert _png_size(path) == (size, size)


def test_svg_icon_is_square_svg():
    root = ET.parse(HICOLOR / "scalable" / "apps" / f"{APP_ID}.svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("viewBox") == "0 0 512 512"


def test_png_icons_match_svg():
    """The committed PNGs are the SVG rendered by packaging/render_icons.py (needs Qt)."""
    pytest.importorskip("PySide6.QtSvg")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "render_icons.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_metainfo_screenshot_size_matches_docs():
    shot = ROOT / "docs" / "screenshot-window.png"
    if not shot.is_file():
        pytest.skip("docs/screenshot-window.png is not there yet")
    image = next(_metainfo().iter("image"))
    assert (int(image.get("width")), int(image.get("height"))) == _png_size(shot)


def test_icon_check_tolerates_rasteriser_noise_but_not_another_svg(tmp_path, monkeypatch, qapp):
    # qapp: pytest-qt's QApplication. A bare QGuiApplication made here would outlive the test, and every
    # later widget test in this process would abort ("Cannot create a QWidget without QApplication").
    pytest.importorskip("PySide6.QtSvg")
    sys.path.insert(0, str(ROOT / "packaging"))
    import render_icons
    from PySide6.QtGui import QColor

    image = render_icons.render(64)
    noisy = image.copy()
    for x in range(0, 64, 8):  # a few pixels off by one step, as another machine's rasteriser might draw them
        colour = noisy.pixelColor(x, 32)
        noisy.setPixelColor(x, 32, QColor(min(colour.red() + 1, 255), colour.green(), colour.blue(), colour.alpha()))
    assert 0 < render_icons.mean_difference(image, noisy) <= render_icons.TOLERANCE
    icons = tmp_path / "hicolor"
    monkeypatch.setattr(render_icons, "HICOLOR", icons)
    monkeypatch.setattr(render_icons, "SIZES", (64,))
    assert render_icons.main([]) == 0 and render_icons.main(["--check"]) == 0
    other = tmp_path / "other.svg"
    other.write_text(render_icons.SVG.read_text().replace("512", "511", 1))
    monkeypatch.setattr(render_icons, "SVG", other)
    assert render_icons.main(["--check"]) == 1
