"""Small shared pieces: byte formatting, status chips, section titles."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QFontDatabase, QPalette
from PySide6.QtWidgets import QFrame, QLabel, QTableWidget, QTableWidgetItem, QWidget

from runtime.ledger import format_bytes

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "BAD",
    "NEUTRAL",
    "OK",
    "WARN",
    "StatusChip",
    "format_amounts",
    "format_bytes",
    "format_optional_bytes",
    "format_seconds",
    "machine_name",
    "monospace",
    "readonly_table",
    "section_title",
    "set_row",
]

OK = "#2e9d4f"
BAD = "#d64545"
WARN = "#d98a1c"
NEUTRAL = "#6b7785"
QUARANTINE = "#e0702a"


def machine_name(source: str) -> str:
    """How a topology source reads in a sentence: this machine, or the file's name."""
    return "this machine" if source == "discovered" else Path(source).stem


def format_optional_bytes(value: int | None) -> str:
    return "unknown" if value is None else format_bytes(value)


def format_amounts(amounts: Mapping[str, int]) -> str:
    """``machine:ram 128.0 MiB, wsl:quota 128.0 MiB``."""
    return ", ".join(f"{name} {format_bytes(amount)}" for name, amount in amounts.items()) or "-"


def format_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1.0:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f} s"


def monospace() -> QFont:
    font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    return font


def section_title(text: str, parent: QWidget | None = None) -> QLabel:
    label = QLabel(text, parent)
    font = label.font()
    font.setBold(True)
    font.setPointSizeF(font.pointSizeF() * 1.05)
    label.setFont(font)
    return label


class StatusChip(QLabel):
    """A rounded, coloured label for a state such as "Fits" or "Refused"."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.set_status(text, NEUTRAL)

    def set_status(self, text: str, color: str) -> None:
        self.setText(text)
        self.setProperty("statusColor", color)
        tint = QColor(color)
        tint.setAlpha(40)
        self.setStyleSheet(
            f"QLabel {{ color: {color}; background: rgba({tint.red()}, {tint.green()}, "
            f"{tint.blue()}, 0.16); border: 1px solid {color}; border-radius: 9px; "
            "padding: 2px 10px; font-weight: 600; }"
        )


def readonly_table(headers: list[str], parent: QWidget | None = None) -> QTableWidget:
    table = QTableWidget(0, len(headers), parent)
    table.setHorizontalHeaderLabels(headers)
    table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
    table.setAlternatingRowColors(True)
    table.verticalHeader().setVisible(False)
    table.horizontalHeader().setStretchLastSection(True)
    table.setFrameShape(QFrame.Shape.StyledPanel)
    table.setWordWrap(False)
    return table


def set_row(table: QTableWidget, row: int, cells: list[str], color: str | None = None) -> None:
    """Fill one row; ``color`` tints the text of the whole row."""
    if table.rowCount() <= row:
        table.setRowCount(row + 1)
    for column, text in enumerate(cells):
        item = QTableWidgetItem(text)
        item.setToolTip(text)
        if color is not None:
            item.setForeground(QColor(color))
        table.setItem(row, column, item)


def dim(widget: QWidget) -> None:
    """Show a label's text in the palette's placeholder colour (secondary information)."""
    palette = widget.palette()
    palette.setColor(
        QPalette.ColorRole.WindowText, palette.color(QPalette.ColorRole.PlaceholderText)
    )
    widget.setPalette(palette)
