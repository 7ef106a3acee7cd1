"""The Plan panel: the pre-load check, and per stage where it actually runs once loaded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.widgets.common import (
    BAD,
    OK,
    WARN,
    StatusChip,
    dim,
    format_amounts,
    format_bytes,
    format_seconds,
    machine_name,
    readonly_table,
    set_row,
)

if TYPE_CHECKING:
    from app.models import ExecutionView, PlanView

STAGE_COLUMNS = [
    "Stage",
    "Route",
    "Device",
    "Worker pid",
    "Generation",
    "Placement",
    "On target",
    "Reservation",
]


class PlanPanel(QWidget):
    """Routes, devices and budget before loading; pids, generations and placement after."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.plan: PlanView | None = None
        self.execution: ExecutionView | None = None
        self.chip = StatusChip("no pipeline")
        self.summary = QLabel("Open a pipeline to see its plan.")
        self.summary.setWordWrap(True)
        self.label_note = QLabel("")
        self.label_note.setWordWrap(True)
        dim(self.label_note)
        self.stages = QTreeWidget()
        self.stages.setHeaderLabels(STAGE_COLUMNS)
        self.stages.setAlternatingRowColors(True)
        self.stages.setRootIsDecorated(True)
        self.budget = readonly_table(
            ["Constraint", "Ceiling", "In use", "Plan needs", "Headroom", "Fits", "Demands"]
        )
        self.notes = QLabel("")
        self.notes.setWordWrap(True)
        self.notes.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        header = QHBoxLayout()
        header.addWidget(self.chip)
        header.addWidget(self.summary, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(header)
        layout.addWidget(self.notes)
        layout.addWidget(QLabel("Stages"))
        layout.addWidget(self.stages, 3)
        layout.addWidget(self.label_note)
        layout.addWidget(QLabel("Memory budget (declared pre-load ceilings)"))
        layout.addWidget(self.budget, 2)

    def show_plan(self, plan: PlanView) -> None:
        self.plan = plan
        if plan.admitted:
            self.chip.set_status("Admitted", OK)
            self.summary.setText(
                f"Every check passed on {machine_name(plan.topology)}; nothing is loaded until Run."
            )
        else:
            self.chip.set_status("Refused", BAD)
            self.summary.setText(
                f"{len(plan.refusals)} check(s) failed on {machine_name(plan.topology)}."
            )
        lines = [f"<b style='color:{BAD}'>refused:</b> {text}" for text in plan.refusals]
        lines += [f"<b style='color:{WARN}'>warning:</b> {text}" for text in plan.warnings]
        self.notes.setText("<br>".join(lines))
        self.notes.setVisible(bool(lines))
        self.budget.setRowCount(0)
        for row, entry in enumerate(plan.budget):
            set_row(
                self.budget,
                row,
                [
                    entry.constraint,
                    format_bytes(entry.capacity) if entry.declared else "not declared",
                    format_bytes(entry.in_use),
                    format_bytes(entry.total),
                    format_bytes(entry.headroom),
                    "yes" if entry.fits else "NO",
                    format_amounts(entry.demands),
                ],
                None if entry.fits else BAD,
            )
        self.budget.resizeColumnsToContents()
        self._fill()

    def show_execution(self, execution: ExecutionView | None) -> None:
        self.execution = execution
        self._fill()

    def _fill(self) -> None:
        self.stages.clear()
        plan = self.plan
        loaded = (
            {} if self.execution is None else {stage.name: stage for stage in self.execution.stages}
        )
        names = [stage.name for stage in plan.stages] if plan is not None else list(loaded)
        planned = {} if plan is None else {stage.name: stage for stage in plan.stages}
        for name in names:
            before = planned.get(name)
            after = loaded.get(name)
            route = (
                f"{before.route} ({before.ep}, {before.os_domain})"
                if before
                else (after.route if after else "")
            )
            device = (before.device if before else None) or "no device"
            if after is None:
                cells = [
                    name,
                    route,
                    device,
                    "not loaded",
                    "-",
                    "-",
                    "-",
                    format_amounts(before.demands) if before else "-",
                ]
            else:
                counts = ", ".join(
                    f"{count} {provider.removesuffix('ExecutionProvider')}"
                    for provider, count in after.provider_counts.items()
                )
                fraction = (
                    "-" if after.fraction_on_target is None else f"{after.fraction_on_target:.0%}"
                )
                cells = [
                    name,
                    route,
                    device,
                    str(after.pid),
                    str(after.generation),
                    f"{counts or 'not reported'} of {after.total_nodes} nodes",
                    fraction,
                    format_amounts(after.reservation),
                ]
            item = QTreeWidgetItem(cells)
            if after is not None and after.fraction_on_target is not None and before is not None:
                ok = after.fraction_on_target >= before.min_fraction_on_target
                item.setForeground(6, QColor(OK if ok else BAD))
            self.stages.addTopLevelItem(item)
            details: list[tuple[str, str]] = []
            if before is not None:
                details.append(("allowed providers", ", ".join(before.allowed_providers)))
                details.append(("minimum on target", f"{before.min_fraction_on_target:.0%}"))
                details.append(("demands", format_amounts(before.demands)))
            if after is not None:
                for provider, count in after.provider_counts.items():
                    details.append((provider, f"{count} node(s)"))
                details.append(("placement read by", after.placement_method or "-"))
                details.append(("reservation id", after.reservation_id or "-"))
                details.append(
                    (
                        "load / warm-up",
                        f"{format_seconds(after.load_s)} / {format_seconds(after.warmup_s)}",
                    )
                )
                if after.worker_rss_bytes:
                    details.append(
                        ("worker memory (RSS)", format_bytes(int(after.worker_rss_bytes)))
                    )
                details.append(("usable", "yes" if after.usable else "no (retired)"))
            for key, value in details:
                child = QTreeWidgetItem(["", key, value])
                child.setFirstColumnSpanned(False)
                item.addChild(child)
            item.setExpanded(True)
        for column in range(len(STAGE_COLUMNS)):
            self.stages.resizeColumnToContents(column)
        if self.execution is not None:
            self.label_note.setText(
                f"Label {self.execution.label}: backend execution of the listed graphs "
                "(placement read from ONNX Runtime after warm-up)."
            )
        else:
            self.label_note.setText(
                "Stages are not loaded; Run loads them (pids, generations and placement appear here)."
            )
