"""Render the scalable app icon to the hicolor PNG sizes with Qt's own SVG renderer.

    QT_QPA_PLATFORM=offscreen python packaging/render_icons.py          # writes the PNGs
    QT_QPA_PLATFORM=offscreen python packaging/render_icons.py --check  # exit 1 if any is stale

The PNGs are committed, so a user's install never needs this; run it after editing the SVG. Each
PNG records the SHA-256 of the SVG it was rendered from; --check demands that it is the current
SVG's and that a fresh rendering is close (Qt's rasteriser differs slightly between machines, so the
pixels are compared with a tolerance, not bit for bit).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
APP_ID = "io.github.kvviz.KVViz"
HICOLOR = ROOT / "resources" / "icons" / "hicolor"
SVG = HICOLOR / "scalable" / "apps" / f"{APP_ID}.svg"
SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
SOURCE_KEY = "kvviz-svg-sha256"  # PNG text chunk naming the SVG a PNG was rendered from
# mean absolute difference per 8-bit channel allowed between the committed PNG and a fresh rendering
TOLERANCE = 2.0


def svg_digest() -> str:
    return hashlib.sha256(SVG.read_bytes()).hexdigest()


def mean_difference(a, b) -> float:
    """Mean absolute difference of the ARGB channels of two images of one size (inf if the sizes differ)."""
    import numpy as np
    from PySide6.QtGui import QImage

    def channels(image):
        image = image.convertToFormat(QImage.Format.Format_ARGB32)
        rows = np.frombuffer(image.constBits(), np.uint8, count=image.sizeInBytes()).reshape(image.height(), -1)
        return rows[:, : image.width() * 4].astype(np.int16)

    if a.size() != b.size():
        return float("inf")
    return float(np.abs(channels(a) - channels(b)).mean())


def render(size: int):
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        raise SystemExit(f"cannot parse {SVG}")
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    image.setText(SOURCE_KEY, svg_digest())
    return image


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check that the PNGs match the SVG")
    args = ap.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication, QImage

    app = QGuiApplication.instance() or QGuiApplication([])  # noqa: F841 (keeps Qt alive)
    stale = []
    for size in SIZES:
        target = HICOLOR / f"{size}x{size}" / "apps" / f"{APP_ID}.png"
        image = render(size)
        if args.check:
            old = QImage(str(target))
            if old.isNull() or old.text(SOURCE_KEY) != svg_digest() or mean_difference(old, image) > TOLERANCE:
                stale.append(target)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if not image.save(str(target), "PNG"):
            raise SystemExit(f"cannot write {target}")
        print(f"wrote {target}")
    if stale:
        print("stale icons (run packaging/render_icons.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
