"""The pipelines pane: bundled demos, recent files, Open, and drag and drop."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QFont
from PySide6.QtWidgets import (
    QLabel,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.widgets.common import dim

PATH_ROLE = Qt.ItemDataRole.UserRole


def droppable_paths(urls: list[str]) -> list[Path]:
    """Local ``.yaml``/``.yml`` pipelines, ``manifest.json`` files and bundle folders."""
    paths = []
    for url in urls:
        path = Path(url)
        if path.suffix.lower() in (".yaml", ".yml") or path.name == "manifest.json":
            paths.append(path)
        elif path.is_dir() and (path / "manifest.json").is_file():
            paths.append(path / "manifest.json")
    return paths


class PipelinesPane(QWidget):
    pipeline_chosen = Signal(object)  # Path
    open_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tree = QTreeWidget()
        self.tree.setHeaderHidden(True)
        self.tree.setRootIsDecorated(False)
        self.tree.setIndentation(12)
        self.demos = QTreeWidgetItem(["Bundled demos"])
        self.recent = QTreeWidgetItem(["Recent"])
        for group in (self.demos, self.recent):
            font = QFont(self.font())
            font.setBold(True)
            group.setFont(0, font)
            group.setFlags(Qt.ItemFlag.ItemIsEnabled)
            self.tree.addTopLevelItem(group)
            group.setExpanded(True)
        self.tree.itemActivated.connect(self._chosen)
        self.tree.itemClicked.connect(self._chosen)
        self.open_button = QPushButton("Open pipeline or manifest…")
        self.open_button.clicked.connect(self.open_requested)
        hint = QLabel("Drop a .yaml pipeline or a manifest.json here.")
        hint.setWordWrap(True)
        dim(hint)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        title = QLabel("Pipelines")
        font = title.font()
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 1.15)
        title.setFont(font)
        layout.addWidget(title)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.open_button)
        layout.addWidget(hint)
        self.setAcceptDrops(True)
        self._current: Path | None = None

    def set_demos(self, demos: list[tuple[Path, str]]) -> None:
        self._fill(self.demos, demos, "no demo pipelines found")

    def set_recent(self, recent: list[Path]) -> None:
        self._fill(self.recent, [(path, "") for path in recent], "nothing opened yet")

    def _fill(self, group: QTreeWidgetItem, entries: list[tuple[Path, str]], empty: str) -> None:
        group.takeChildren()
        for path, description in entries:
            name = path.parent.name if path.name == "manifest.json" else path.stem
            item = QTreeWidgetItem([name])
            item.setData(0, PATH_ROLE, str(path))
            item.setToolTip(0, f"{description}\n{path}" if description else str(path))
            group.addChild(item)
        if not entries:
            item = QTreeWidgetItem([empty])
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            group.addChild(item)
        self.mark_current(self._current)

    def items(self) -> list[QTreeWidgetItem]:
        found = []
        for group in (self.demos, self.recent):
            found += [group.child(i) for i in range(group.childCount())]
        return [item for item in found if item is not None and item.data(0, PATH_ROLE)]

    def item_for(self, path: Path, group: QTreeWidgetItem | None = None) -> QTreeWidgetItem | None:
        for item in self.items():
            if Path(item.data(0, PATH_ROLE)) == path and (group is None or item.parent() is group):
                return item
        return None

    def mark_current(self, path: Path | None) -> None:
        self._current = path
        for item in self.items():
            font = item.font(0)
            font.setBold(path is not None and Path(item.data(0, PATH_ROLE)) == path)
            item.setFont(0, font)

    def _chosen(self, item: QTreeWidgetItem, _column: int) -> None:
        data = item.data(0, PATH_ROLE)
        if data:
            self.pipeline_chosen.emit(Path(data))

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        urls = [url.toLocalFile() for url in event.mimeData().urls() if url.isLocalFile()]
        if droppable_paths(urls):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = [url.toLocalFile() for url in event.mimeData().urls() if url.isLocalFile()]
        paths = droppable_paths(urls)
        if paths:
            event.acceptProposedAction()
            self.pipeline_chosen.emit(paths[0])
