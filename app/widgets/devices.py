"""The Devices panel: the machine's devices, the memory constraints they draw on, and
what the ledger holds of each, live; plus the device subset pipelines may use."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from PySide6.QtCore import QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QPainter, QPaintEvent, QPalette, QPen
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.models import EMPTY_LEDGER, LedgerView, TopologyView
from app.widgets.audio_input import AudioInputBox
from app.widgets.common import (
    BAD,
    QUARANTINE,
    dim,
    format_amounts,
    format_bytes,
    format_optional_bytes,
    readonly_table,
    set_row,
)

KIND_LABELS = {"cpu": "CPU", "igpu": "iGPU", "npu": "NPU", "dgpu": "dGPU"}


class TopologyDiagram(QWidget):
    """Devices on top, constraints below, a line for every constraint a device draws on.

    Each constraint shows a bar: what the ledger has reserved and quarantined against its
    declared ceiling, on the scale of the machine's capacity.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.topology: TopologyView | None = None
        self.ledger: LedgerView = EMPTY_LEDGER
        self.setMinimumHeight(250)

    def sizeHint(self) -> QSize:
        return QSize(520, 250)

    def show_topology(self, topology: TopologyView) -> None:
        self.topology = topology
        self.update()

    def show_ledger(self, ledger: LedgerView) -> None:
        self.ledger = ledger
        self.update()

    def _constraint_names(self) -> list[str]:
        names = [] if self.topology is None else [c.name for c in self.topology.constraints]
        names += [row.name for row in self.ledger.rows if row.name not in names]
        return names

    def paintEvent(self, _event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        palette = self.palette()
        text = palette.color(QPalette.ColorRole.Text)
        muted = palette.color(QPalette.ColorRole.PlaceholderText)
        base = palette.color(QPalette.ColorRole.Base)
        accent = palette.color(QPalette.ColorRole.Highlight)
        border = palette.color(QPalette.ColorRole.Mid)
        painter.fillRect(self.rect(), palette.color(QPalette.ColorRole.Window))
        topology = self.topology
        if topology is None:
            painter.setPen(muted)
            painter.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "Discovering devices…")
            return
        margin = 14.0
        width = self.width() - 2 * margin
        devices = topology.devices
        constraints = self._constraint_names()
        device_h, constraint_h = 78.0, 78.0
        top = margin
        bottom = self.height() - margin - constraint_h
        device_boxes: dict[str, QRectF] = {}
        gap = 14.0
        box_w = min(240.0, (width - gap * (len(devices) - 1)) / max(1, len(devices)))
        start = margin + (width - (box_w * len(devices) + gap * (len(devices) - 1))) / 2
        for index, device in enumerate(devices):
            device_boxes[device.physical_id] = QRectF(
                start + index * (box_w + gap), top, box_w, device_h
            )
        constraint_boxes: dict[str, QRectF] = {}
        c_w = min(300.0, (width - gap * (len(constraints) - 1)) / max(1, len(constraints)))
        c_start = margin + (width - (c_w * len(constraints) + gap * (len(constraints) - 1))) / 2
        for index, name in enumerate(constraints):
            constraint_boxes[name] = QRectF(
                c_start + index * (c_w + gap), bottom, c_w, constraint_h
            )

        for device in devices:
            source = device_boxes[device.physical_id]
            for name in device.constraints:
                target = constraint_boxes.get(name)
                if target is None:
                    continue
                color = QColor(accent if device.allowed else muted)
                color.setAlpha(170 if device.allowed else 90)
                pen = QPen(color, 1.6)
                if not device.allowed:
                    pen.setStyle(Qt.PenStyle.DashLine)
                painter.setPen(pen)
                a = QPointF(source.center().x(), source.bottom())
                b = QPointF(target.center().x(), target.top())
                mid = (a.y() + b.y()) / 2
                path_points = [a, QPointF(a.x(), mid), QPointF(b.x(), mid), b]
                for first, second in pairwise(path_points):
                    painter.drawLine(first, second)

        title_font = QFont(self.font())
        title_font.setBold(True)
        small_font = QFont(self.font())
        small_font.setPointSizeF(max(7.0, self.font().pointSizeF() * 0.85))
        for device in devices:
            box = device_boxes[device.physical_id]
            painter.setPen(
                QPen(
                    accent if device.allowed else border,
                    1.4,
                    Qt.PenStyle.SolidLine if device.allowed else Qt.PenStyle.DashLine,
                )
            )
            painter.setBrush(base)
            painter.drawRoundedRect(box, 8, 8)
            badge = QRectF(box.left() + 8, box.top() + 8, 42, 20)
            painter.setPen(Qt.PenStyle.NoPen)
            badge_color = QColor(accent if device.allowed else muted)
            badge_color.setAlpha(60)
            painter.setBrush(badge_color)
            painter.drawRoundedRect(badge, 5, 5)
            painter.setPen(text)
            painter.setFont(small_font)
            painter.drawText(
                badge, Qt.AlignmentFlag.AlignCenter, KIND_LABELS.get(device.kind, device.kind)
            )
            painter.setFont(small_font)
            painter.setPen(muted)
            status = "allowed" if device.allowed else "excluded"
            providers = (
                ", ".join(p.removesuffix("ExecutionProvider") for p in device.providers)
                or "no provider"
            )
            detail = QRectF(
                badge.right() + 6, badge.top(), box.right() - badge.right() - 14, badge.height()
            )
            painter.drawText(
                detail,
                Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                painter.fontMetrics().elidedText(
                    f"{status} · {providers}", Qt.TextElideMode.ElideRight, int(detail.width())
                ),
            )
            # The name gets two lines under the badge: device names are long.
            painter.setFont(title_font)
            painter.setPen(text if device.allowed else muted)
            name_rect = QRectF(
                box.left() + 8,
                badge.bottom() + 4,
                box.width() - 16,
                box.bottom() - badge.bottom() - 8,
            )
            metrics = painter.fontMetrics()
            words = device.name.split()
            line_one = ""
            while (
                words
                and metrics.horizontalAdvance(f"{line_one} {words[0]}".strip()) <= name_rect.width()
            ):
                line_one = f"{line_one} {words.pop(0)}".strip()
            line_two = metrics.elidedText(
                " ".join(words), Qt.TextElideMode.ElideRight, int(name_rect.width())
            )
            if not line_one:
                line_one, line_two = (
                    metrics.elidedText(
                        device.name, Qt.TextElideMode.ElideRight, int(name_rect.width())
                    ),
                    "",
                )
            label = f"{line_one}\n{line_two}" if line_two else line_one
            painter.drawText(
                name_rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop, label
            )

        machine = {} if topology is None else {c.name: c for c in topology.constraints}
        for name in constraints:
            box = constraint_boxes[name]
            painter.setPen(QPen(border, 1.2))
            painter.setBrush(base)
            painter.drawRoundedRect(box, 8, 8)
            painter.setFont(title_font)
            painter.setPen(text)
            painter.drawText(
                QRectF(box.left() + 10, box.top() + 4, box.width() - 20, 22),
                Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                name,
            )
            row = self.ledger.row(name)
            info = machine.get(name)
            scale = max(
                (info.capacity or 0) if info is not None else 0,
                row.capacity if row is not None else 0,
                1,
            )
            bar = QRectF(box.left() + 10, box.top() + 30, box.width() - 20, 12)
            painter.setPen(Qt.PenStyle.NoPen)
            track = QColor(muted)
            track.setAlpha(50)
            painter.setBrush(track)
            painter.drawRoundedRect(bar, 4, 4)
            if row is not None:
                reserved_w = bar.width() * row.reserved / scale
                quarantined_w = bar.width() * row.quarantined / scale
                if reserved_w > 0:
                    painter.setBrush(accent)
                    painter.drawRoundedRect(
                        QRectF(bar.left(), bar.top(), max(3.0, reserved_w), bar.height()), 3, 3
                    )
                if quarantined_w > 0:
                    painter.setBrush(QColor(QUARANTINE))
                    painter.drawRoundedRect(
                        QRectF(
                            bar.left() + reserved_w,
                            bar.top(),
                            max(3.0, quarantined_w),
                            bar.height(),
                        ),
                        3,
                        3,
                    )
                ceiling_x = bar.left() + bar.width() * min(1.0, row.capacity / scale)
                painter.setPen(QPen(text, 1.5))
                painter.drawLine(
                    QPointF(ceiling_x, bar.top() - 3), QPointF(ceiling_x, bar.bottom() + 3)
                )
            painter.setFont(small_font)
            painter.setPen(muted)
            if row is None:
                line = "ledger: not declared by any loaded pipeline"
            else:
                line = (
                    f"reserved {format_bytes(row.reserved)} · quarantined "
                    f"{format_bytes(row.quarantined)} · ceiling {format_bytes(row.capacity)}"
                )
            machine_line = (
                f"machine {format_optional_bytes(info.capacity)}, free now {format_optional_bytes(info.observed_free)}"
                if info is not None
                else "not a constraint of this machine"
            )
            for offset, content in ((46, line), (60, machine_line)):
                rect = QRectF(box.left() + 10, box.top() + offset, box.width() - 20, 14)
                painter.drawText(
                    rect,
                    Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                    painter.fontMetrics().elidedText(
                        content, Qt.TextElideMode.ElideRight, int(rect.width())
                    ),
                )
        painter.end()


class DevicesPanel(QWidget):
    """Topology view, device subset checkboxes, and the ledger's constraints and reservations."""

    device_toggled = Signal(str, bool)  # physical id, allowed
    allow_all_requested = Signal()
    topology_source_chosen = Signal(object)  # Path | None

    def __init__(self, topology_files: list[Path], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.topology: TopologyView | None = None
        self.ledger: LedgerView = EMPTY_LEDGER
        self.machine_box = QComboBox()
        self.machine_box.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.machine_box.setMinimumContentsLength(20)
        self.machine_box.addItem("This machine (discovered)", None)
        for path in topology_files:
            self.machine_box.addItem(f"Topology file: {path.stem}", str(path))
        self.machine_box.currentIndexChanged.connect(self._machine_chosen)
        self.allow_all_button = QPushButton("Allow all devices")
        self.allow_all_button.clicked.connect(self.allow_all_requested)
        self.diagram = TopologyDiagram()
        self.device_group = QGroupBox("Devices pipelines may use")
        self.device_layout = QVBoxLayout(self.device_group)
        self.checkboxes: dict[str, QCheckBox] = {}
        self.selection_label = QLabel("")
        self.selection_label.setWordWrap(True)
        dim(self.selection_label)
        self.notes_label = QLabel("")
        self.notes_label.setWordWrap(True)
        dim(self.notes_label)

        self.constraints_table = readonly_table(
            [
                "Constraint",
                "Machine",
                "Free now",
                "Ledger ceiling",
                "Reserved",
                "Quarantined",
                "Free in ledger",
                "Drawn on by",
            ]
        )
        self.reservations_table = readonly_table(
            ["Reservation", "Owner", "Stage", "Holds", "State"]
        )

        header = QHBoxLayout()
        header.addWidget(QLabel("Machine:"))
        header.addWidget(self.machine_box, 1)
        header.addWidget(self.allow_all_button)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addLayout(header)
        top_layout.addWidget(self.diagram, 1)
        top_layout.addWidget(self.notes_label)
        bottom = QWidget()
        bottom_layout = QVBoxLayout(bottom)
        bottom_layout.setContentsMargins(0, 0, 0, 0)
        bottom_layout.addWidget(self.device_group)
        #: The audio input Dictate records from, and its level.
        self.audio_input = AudioInputBox()
        bottom_layout.addWidget(self.audio_input)
        constraints_title = QLabel(
            "Memory constraints: capacity from the machine; ceiling, reserved and quarantined "
            "from the ledger, live"
        )
        constraints_title.setWordWrap(True)
        bottom_layout.addWidget(constraints_title)
        bottom_layout.addWidget(self.constraints_table, 1)
        bottom_layout.addWidget(QLabel("Reservations held now"))
        bottom_layout.addWidget(self.reservations_table, 1)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(top)
        splitter.addWidget(bottom)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 4)
        splitter.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

    def _machine_chosen(self, _index: int) -> None:
        data = self.machine_box.currentData()
        self.topology_source_chosen.emit(None if data is None else Path(data))

    def select_machine(self, path: Path | None) -> None:
        index = 0 if path is None else self.machine_box.findData(str(path))
        if index >= 0:
            self.machine_box.blockSignals(True)
            self.machine_box.setCurrentIndex(index)
            self.machine_box.blockSignals(False)

    def show_topology(self, topology: TopologyView) -> None:
        self.topology = topology
        self.diagram.show_topology(topology)
        for checkbox in self.checkboxes.values():
            self.device_layout.removeWidget(checkbox)
            checkbox.deleteLater()
        self.checkboxes.clear()
        for device in topology.devices:
            providers = ", ".join(device.providers) or "no provider"
            checkbox = QCheckBox(f"{device.name} ({KIND_LABELS.get(device.kind, device.kind)})")
            checkbox.setToolTip(
                f"{device.physical_id}\nproviders: {providers}\nmemory: {', '.join(device.constraints)}"
            )
            checkbox.setChecked(device.allowed)
            checkbox.toggled.connect(
                lambda checked, pid=device.physical_id: self.device_toggled.emit(pid, checked)
            )
            self.device_layout.addWidget(checkbox)
            self.checkboxes[device.physical_id] = checkbox
        self.device_layout.addWidget(self.selection_label)
        subset = "every device" if topology.all_allowed else "only the checked devices"
        self.selection_label.setText(
            f"Pipelines may use {subset}. Saved to {topology.selection_file} "
            "(the same file `omni-edge devices` reads)."
        )
        self.notes_label.setText("\n".join(f"note: {note}" for note in topology.notes))
        self.notes_label.setVisible(bool(topology.notes))
        self._fill_constraints()

    def show_ledger(self, ledger: LedgerView) -> None:
        self.ledger = ledger
        self.diagram.show_ledger(ledger)
        self._fill_constraints()
        self.reservations_table.setRowCount(0)
        row = 0
        for reservation in ledger.reservations:
            set_row(
                self.reservations_table,
                row,
                [
                    reservation.id,
                    reservation.owner,
                    reservation.stage,
                    format_amounts(reservation.amounts),
                    "reserved",
                ],
            )
            row += 1
        for record in ledger.quarantined:
            set_row(
                self.reservations_table,
                row,
                [
                    record.id,
                    record.owner,
                    record.stage,
                    format_amounts(record.amounts),
                    f"quarantined: {record.reason}",
                ],
                QUARANTINE,
            )
            row += 1
        self.reservations_table.resizeColumnsToContents()

    def _fill_constraints(self) -> None:
        machine = {} if self.topology is None else {c.name: c for c in self.topology.constraints}
        names = list(machine) + [row.name for row in self.ledger.rows if row.name not in machine]
        self.constraints_table.setRowCount(0)
        for index, name in enumerate(names):
            info = machine.get(name)
            row = self.ledger.row(name)
            set_row(
                self.constraints_table,
                index,
                [
                    name,
                    "-" if info is None else format_optional_bytes(info.capacity),
                    "-" if info is None else format_optional_bytes(info.observed_free),
                    "not declared" if row is None else format_bytes(row.capacity),
                    "0 B" if row is None else format_bytes(row.reserved),
                    "0 B" if row is None else format_bytes(row.quarantined),
                    "-" if row is None else format_bytes(row.free),
                    "-" if info is None else ", ".join(info.devices),
                ],
                BAD
                if info is None
                else (QUARANTINE if row is not None and row.quarantined else None),
            )
        self.constraints_table.resizeColumnsToContents()
