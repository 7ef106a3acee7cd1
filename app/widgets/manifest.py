"""The Manifest panel: each stage's bundle, its files, hashes, verification and metadata."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.widgets.common import (
    BAD,
    OK,
    StatusChip,
    format_optional_bytes,
    monospace,
    readonly_table,
    set_row,
)

if TYPE_CHECKING:
    from app.models import ManifestView


#: Lists and objects longer than this many entries show their first ones and a count.
MAX_CHILDREN = 50


def metadata_item(key: str, value: object) -> QTreeWidgetItem:
    """A tree row for one metadata value; objects and lists become expandable children."""
    if isinstance(value, dict):
        item = QTreeWidgetItem([key, f"{len(value)} entries"])
        for index, (child_key, child) in enumerate(value.items()):
            if index == MAX_CHILDREN:
                item.addChild(QTreeWidgetItem(["…", f"{len(value) - MAX_CHILDREN} more"]))
                break
            item.addChild(metadata_item(str(child_key), child))
        return item
    if isinstance(value, list):
        if all(isinstance(entry, (int, float, str, bool)) or entry is None for entry in value):
            text = json.dumps(value)
            item = QTreeWidgetItem([key, text if len(text) <= 200 else text[:200] + "…"])
            item.setToolTip(1, text[:2000])
            return item
        item = QTreeWidgetItem([key, f"{len(value)} items"])
        for index, entry in enumerate(value[:MAX_CHILDREN]):
            item.addChild(metadata_item(f"[{index}]", entry))
        if len(value) > MAX_CHILDREN:
            item.addChild(QTreeWidgetItem(["…", f"{len(value) - MAX_CHILDREN} more"]))
        return item
    text = value if isinstance(value, str) else json.dumps(value)
    item = QTreeWidgetItem([key, text])
    item.setToolTip(1, text)
    return item


class ManifestPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.manifests: tuple[ManifestView, ...] = ()
        self.stage_box = QComboBox()
        self.stage_box.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.stage_box.setMinimumContentsLength(16)
        self.stage_box.currentIndexChanged.connect(self._show_current)
        self.chip = StatusChip("no bundle")
        self.component = QLabel("-")
        self.identity = QLabel("-")
        self.identity.setFont(monospace())
        self.path = QLabel("-")
        for label in (self.component, self.identity, self.path):
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            # Hashes and paths are clipped rather than widening the window (tooltips hold them).
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.errors = QLabel("")
        self.errors.setWordWrap(True)
        self.errors.setStyleSheet(f"color: {BAD};")
        self.files = readonly_table(
            ["File", "Status", "Size", "sha256 (manifest)", "sha256 (on disk)"]
        )
        self.files.setFont(monospace())
        self.metadata = QTreeWidget()
        self.metadata.setHeaderLabels(["Key", "Value"])
        self.metadata.setAlternatingRowColors(True)
        header = QHBoxLayout()
        header.addWidget(QLabel("Stage:"))
        header.addWidget(self.stage_box, 1)
        header.addWidget(self.chip)
        form = QFormLayout()
        form.addRow("Component", self.component)
        form.addRow("Identity (sha256 of manifest.json)", self.identity)
        form.addRow("Manifest", self.path)
        layout = QVBoxLayout(self)
        layout.addLayout(header)
        layout.addLayout(form)
        layout.addWidget(self.errors)
        layout.addWidget(QLabel("Files"))
        layout.addWidget(self.files, 2)
        layout.addWidget(QLabel("Metadata"))
        layout.addWidget(self.metadata, 2)

    def show_manifests(self, manifests: tuple[ManifestView, ...]) -> None:
        self.manifests = manifests
        self.stage_box.blockSignals(True)
        self.stage_box.clear()
        for manifest in manifests:
            self.stage_box.addItem(
                f"{manifest.stage}: {manifest.component or 'unreadable manifest'}"
            )
        self.stage_box.blockSignals(False)
        self._show_current()

    def _show_current(self) -> None:
        index = self.stage_box.currentIndex()
        if not 0 <= index < len(self.manifests):
            return
        manifest = self.manifests[index]
        self.chip.set_status(
            "verified" if manifest.ok else "verification failed", OK if manifest.ok else BAD
        )
        self.component.setText(manifest.component or "-")
        self.identity.setText(manifest.identity or "-")
        self.identity.setToolTip(manifest.identity or "")
        self.path.setText(manifest.manifest_path)
        self.path.setToolTip(manifest.manifest_path)
        self.errors.setText("\n".join(manifest.errors))
        self.errors.setVisible(bool(manifest.errors))
        self.files.setRowCount(0)
        for row, file in enumerate(manifest.files):
            status = file.status if file.detail is None else f"{file.status}: {file.detail}"
            set_row(
                self.files,
                row,
                [
                    file.name,
                    status,
                    format_optional_bytes(file.size),
                    file.expected_sha256,
                    file.actual_sha256 or "-",
                ],
                OK if file.ok else BAD,
            )
        self.files.resizeColumnsToContents()
        self.metadata.clear()
        for key, value in manifest.metadata:
            self.metadata.addTopLevelItem(metadata_item(key, value))
        self.metadata.resizeColumnToContents(0)
