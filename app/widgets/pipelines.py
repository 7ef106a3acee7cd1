"""The pipelines pane: bundled demos, My pipelines (the user's own models), recent files,
Open, Add model, and drag and drop."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QFont
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMenu,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.widgets.common import dim

PATH_ROLE = Qt.ItemDataRole.UserRole
#: A made pipeline's file (``<name>/pipeline.yaml``): the entry is named by its folder.
MY_PIPELINE_FILE = "pipeline.yaml"


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
    add_model_requested = Signal()
    remove_requested = Signal(str)  # the name of one of My pipelines

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tree = QTreeWidget()
        self.tree.setHeaderHidden(True)
        self.tree.setRootIsDecorated(False)
        self.tree.setIndentation(12)
        self.demos = QTreeWidgetItem(["Bundled demos"])
        self.mine = QTreeWidgetItem(["My pipelines"])
        self.recent = QTreeWidgetItem(["Recent"])
        for group in (self.demos, self.mine, self.recent):
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
        self.add_model_button = QPushButton("Add model…")
        self.add_model_button.setToolTip(
            "Make an ONNX file, a GGUF file or a Hugging Face model folder into a pipeline"
        )
        self.add_model_button.clicked.connect(self.add_model_requested)
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Remove the selected one of My pipelines")
        self.remove_button.setEnabled(False)
        self.remove_button.clicked.connect(self._remove_selected)
        self.tree.currentItemChanged.connect(self._update_remove)
        self.tree.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.tree.customContextMenuRequested.connect(self._context_menu)
        mine_row = QHBoxLayout()
        mine_row.addWidget(self.add_model_button, 1)
        mine_row.addWidget(self.remove_button)
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
        layout.addLayout(mine_row)
        layout.addWidget(hint)
        self.setAcceptDrops(True)
        self._current: Path | None = None

    def set_demos(self, demos: list[tuple[Path, str]]) -> None:
        self._fill(self.demos, demos, "no demo pipelines found")

    def set_mine(self, entries: list[tuple[Path, str]]) -> None:
        """My pipelines: (pipeline file, description), each named by its folder."""
        self._fill(self.mine, entries, "none yet: Add model…")
        self._update_remove()

    def set_recent(self, recent: list[Path]) -> None:
        self._fill(self.recent, [(path, "") for path in recent], "nothing opened yet")

    def _fill(self, group: QTreeWidgetItem, entries: list[tuple[Path, str]], empty: str) -> None:
        group.takeChildren()
        for path, description in entries:
            named_by_folder = path.name in ("manifest.json", MY_PIPELINE_FILE)
            name = path.parent.name if named_by_folder else path.stem
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
        for group in (self.demos, self.mine, self.recent):
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

    def mine_item(self, name: str) -> QTreeWidgetItem | None:
        for index in range(self.mine.childCount()):
            item = self.mine.child(index)
            if item is not None and item.data(0, PATH_ROLE) and item.text(0) == name:
                return item
        return None

    def _selected_mine(self) -> QTreeWidgetItem | None:
        item = self.tree.currentItem()
        if item is None or item.parent() is not self.mine or not item.data(0, PATH_ROLE):
            return None
        return item

    def _update_remove(self, *_args: object) -> None:
        self.remove_button.setEnabled(self._selected_mine() is not None)

    def _remove_selected(self) -> None:
        item = self._selected_mine()
        if item is not None:
            self.remove_requested.emit(item.text(0))

    def _context_menu(self, point: QPoint) -> None:
        item = self.tree.itemAt(point)
        if item is None or item.parent() is not self.mine or not item.data(0, PATH_ROLE):
            return
        menu = QMenu(self)
        remove = menu.addAction(f"Remove {item.text(0)}…")
        if menu.exec(self.tree.viewport().mapToGlobal(point)) is remove:
            self.remove_requested.emit(item.text(0))

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
