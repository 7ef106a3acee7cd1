"""The microphone in the studio: a level meter, and the Devices panel's input chooser (the
device Dictate records from) with a Test switch that shows its level live."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from PySide6.QtCore import QRectF, QSize, Signal
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import (
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.widgets.common import BAD, OK, WARN, dim

if TYPE_CHECKING:
    from app.bridge_audio_input import InputLevel

#: The meter's range in dBFS.
FLOOR_DBFS: Final = -60.0
#: The default input, as the chooser lists it.
DEFAULT_INPUT: Final = "Default input"


class LevelMeter(QWidget):
    """A horizontal bar: RMS filled, peak as a tick, from -60 to 0 dBFS."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rms_dbfs = FLOOR_DBFS
        self.peak_dbfs = FLOOR_DBFS
        self.updates = 0
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setToolTip("Input level (dBFS): the bar is the RMS, the tick the peak")

    def sizeHint(self) -> QSize:
        return QSize(160, 14)

    def show_level(self, level: InputLevel) -> None:
        self.rms_dbfs = max(FLOOR_DBFS, min(0.0, level.rms_dbfs))
        self.peak_dbfs = max(FLOOR_DBFS, min(0.0, level.peak_dbfs))
        self.updates += 1
        self.update()

    def clear(self) -> None:
        self.rms_dbfs = self.peak_dbfs = FLOOR_DBFS
        self.update()

    @staticmethod
    def _fraction(dbfs: float) -> float:
        return (dbfs - FLOOR_DBFS) / -FLOOR_DBFS

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        rect = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        painter.setPen(self.palette().color(QPalette.ColorRole.Mid))
        painter.setBrush(self.palette().color(QPalette.ColorRole.Base))
        painter.drawRect(rect)
        color = OK if self.rms_dbfs < -12 else WARN if self.rms_dbfs < -3 else BAD
        width = rect.width() * self._fraction(self.rms_dbfs)
        painter.fillRect(QRectF(rect.left(), rect.top(), width, rect.height()), QColor(color))
        peak_x = rect.left() + rect.width() * self._fraction(self.peak_dbfs)
        painter.setPen(self.palette().color(QPalette.ColorRole.Text))
        painter.drawLine(int(peak_x), int(rect.top()), int(peak_x), int(rect.bottom()))
        painter.end()


class AudioInputBox(QGroupBox):
    """Which input Dictate records from and a spoken conversation hears, and its level while
    testing, dictating or talking."""

    device_chosen = Signal(object)  # str | None (the default input)
    test_toggled = Signal(bool)
    refresh_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Audio input (Dictate and conversations use it)", parent)
        self.device_box = QComboBox()
        self.device_box.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.device_box.setMinimumContentsLength(16)
        self.device_box.addItem(DEFAULT_INPUT, None)
        self.refresh_button = QPushButton("Refresh")
        self.test_button = QPushButton("Test")
        self.test_button.setCheckable(True)
        self.test_button.setToolTip("Show the input's level live, without recording")
        self.meter = LevelMeter()
        self.level_label = QLabel("level: not listening")
        dim(self.level_label)
        self.device_box.currentIndexChanged.connect(
            lambda _index: self.device_chosen.emit(self.device_box.currentData())
        )
        self.test_button.toggled.connect(self.test_toggled)
        self.refresh_button.clicked.connect(self.refresh_requested)
        row = QHBoxLayout()
        row.addWidget(QLabel("Input:"))
        row.addWidget(self.device_box, 1)
        row.addWidget(self.refresh_button)
        row.addWidget(self.test_button)
        meter_row = QHBoxLayout()
        meter_row.addWidget(self.meter, 1)
        meter_row.addWidget(self.level_label)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addLayout(meter_row)

    def show_devices(self, names: list[str], chosen: str | None, problem: str | None) -> None:
        """List ``names`` after the default input and select ``chosen`` (kept even when it is
        not connected now, so a saved choice is not lost)."""
        self.device_box.blockSignals(True)
        self.device_box.clear()
        self.device_box.addItem(DEFAULT_INPUT, None)
        for name in names:
            self.device_box.addItem(name, name)
        if chosen is not None and chosen not in names:
            self.device_box.addItem(f"{chosen} (not found)", chosen)
        index = self.device_box.findData(chosen) if chosen is not None else 0
        self.device_box.setCurrentIndex(max(index, 0))
        self.device_box.blockSignals(False)
        if problem is not None:
            self.level_label.setText(problem)

    def chosen(self) -> str | None:
        data = self.device_box.currentData()
        return data if isinstance(data, str) else None

    def show_level(self, level: InputLevel) -> None:
        self.meter.show_level(level)
        self.level_label.setText(f"{level.rms_dbfs:.0f} dBFS · {level.device}")

    def set_listening(self, listening: bool) -> None:
        if not listening:
            self.meter.clear()
            self.level_label.setText("level: not listening")
            self.test_button.blockSignals(True)
            self.test_button.setChecked(False)
            self.test_button.blockSignals(False)
