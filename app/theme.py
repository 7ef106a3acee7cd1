"""Follow the system's light or dark colour scheme with the Fusion style."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

if TYPE_CHECKING:
    from collections.abc import Callable


def dark_palette() -> QPalette:
    palette = QPalette()
    window = QColor(37, 40, 45)
    base = QColor(28, 30, 34)
    text = QColor(226, 229, 233)
    disabled = QColor(128, 133, 140)
    highlight = QColor(64, 140, 230)
    roles = {
        QPalette.ColorRole.Window: window,
        QPalette.ColorRole.WindowText: text,
        QPalette.ColorRole.Base: base,
        QPalette.ColorRole.AlternateBase: QColor(34, 37, 42),
        QPalette.ColorRole.ToolTipBase: QColor(50, 54, 60),
        QPalette.ColorRole.ToolTipText: text,
        QPalette.ColorRole.PlaceholderText: QColor(140, 146, 154),
        QPalette.ColorRole.Text: text,
        QPalette.ColorRole.Button: QColor(48, 52, 58),
        QPalette.ColorRole.ButtonText: text,
        QPalette.ColorRole.BrightText: QColor(255, 90, 90),
        QPalette.ColorRole.Link: highlight,
        QPalette.ColorRole.Highlight: highlight,
        QPalette.ColorRole.HighlightedText: QColor(255, 255, 255),
        QPalette.ColorRole.Mid: QColor(70, 75, 82),
        QPalette.ColorRole.Dark: QColor(20, 22, 25),
        QPalette.ColorRole.Light: QColor(80, 86, 94),
    }
    for role, color in roles.items():
        palette.setColor(role, color)
    for role in (
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
        QPalette.ColorRole.WindowText,
    ):
        palette.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return palette


def light_palette() -> QPalette:
    palette = QApplication.style().standardPalette()
    palette.setColor(QPalette.ColorRole.Highlight, QColor(38, 117, 214))
    palette.setColor(QPalette.ColorRole.AlternateBase, QColor(244, 246, 249))
    return palette


def is_dark(scheme: Qt.ColorScheme) -> bool:
    return scheme == Qt.ColorScheme.Dark


def apply_scheme(app: QApplication, scheme: Qt.ColorScheme) -> None:
    app.setPalette(dark_palette() if is_dark(scheme) else light_palette())


def follow_system_scheme(app: QApplication) -> Callable[[], None]:
    """Use Fusion and keep the palette in step with the system's light/dark setting.

    Returns a function that stops following it.
    """
    app.setStyle("Fusion")
    hints = QGuiApplication.styleHints()

    def changed(scheme: Qt.ColorScheme) -> None:
        apply_scheme(app, scheme)

    hints.colorSchemeChanged.connect(changed)
    apply_scheme(app, hints.colorScheme())

    def stop() -> None:
        hints.colorSchemeChanged.disconnect(changed)

    return stop
