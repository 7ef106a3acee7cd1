"""Render the application icon's PNG (Linux) and ICO (Windows) from its SVG.

``assets/icon/omni-edge-studio.svg`` is the source; the PNG (256 px) and the ICO (16, 32,
48 and 256 px, each a PNG entry) are written beside it and kept in the repository, so a
package build needs no renderer. Run again after editing the SVG:

    QT_QPA_PLATFORM=offscreen .venv/bin/python packaging/render_icon.py
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ICON = Path(__file__).resolve().parents[1] / "assets" / "icon" / "omni-edge-studio.svg"
PNG_SIZE = 256
ICO_SIZES = (16, 32, 48, 256)


def render_png(renderer: QSvgRenderer, size: int) -> bytes:
    """The icon drawn at ``size`` x ``size`` pixels, as PNG bytes."""
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    # PySide6's stub types the format as bytes, but the binding accepts only str.
    if not image.save(buffer, "PNG"):  # type: ignore[call-overload]
        raise SystemExit(f"render_icon: Qt could not encode a {size} px PNG")
    return bytes(data.data())


def ico_bytes(images: dict[int, bytes]) -> bytes:
    """An ICO file whose entries are PNG images (read by Windows Vista and later)."""
    header = struct.pack("<HHH", 0, 1, len(images))
    offset = len(header) + 16 * len(images)
    entries, payload = b"", b""
    for size, png in sorted(images.items()):
        # In an ICO directory a width or height of 0 means 256.
        side = 0 if size >= 256 else size
        entries += struct.pack("<BBBBHHII", side, side, 0, 0, 1, 32, len(png), offset)
        payload += png
        offset += len(png)
    return header + entries + payload


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--svg", type=Path, default=ICON, help="the source SVG")
    args = parser.parse_args(argv)
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(args.svg))
    if not renderer.isValid():
        raise SystemExit(f"render_icon: {args.svg} is not an SVG image Qt can draw")
    png = args.svg.with_suffix(".png")
    ico = args.svg.with_suffix(".ico")
    png.write_bytes(render_png(renderer, PNG_SIZE))
    ico.write_bytes(ico_bytes({size: render_png(renderer, size) for size in ICO_SIZES}))
    print(f"wrote {png} ({PNG_SIZE} px) and {ico} ({', '.join(map(str, ICO_SIZES))} px)")
    del app
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
