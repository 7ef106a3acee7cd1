"""The main window's "My pipelines": the Add model action and dialog, the pane's group (read
from the user data folder at start and after each change) and Remove.

Kept beside :mod:`app.window`, which only creates it and asks it before closing: an import
still running is cancelled first, and the window closes when it has ended."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QMessageBox, QWidget

from app.models import ErrorInfo, RunState
from app.my_pipelines import MyPipeline, my_pipelines, remove_entry
from app.widgets.add_model import AddModelDialog
from runtime.model_import import ModelImportError

if TYPE_CHECKING:
    from pathlib import Path

    from PySide6.QtGui import QAction

    from app.bridge import RuntimeBridge
    from app.settings import StudioSettings
    from app.widgets.banner import ErrorBanner
    from app.widgets.pipelines import PipelinesPane


class MyPipelinesHost(Protocol):
    """What the hook uses of the main window (:class:`app.window.MainWindow`)."""

    bridge: RuntimeBridge
    banner: ErrorBanner
    pipelines: PipelinesPane
    settings: StudioSettings

    def open_path(self, path: Path | str) -> bool: ...

    def close(self) -> bool: ...


class MyPipelinesHook(QObject):
    """Wires "My pipelines" into ``window``: ``add_action`` and the pane's buttons open the
    dialog; a made pipeline is listed and opened; Remove asks, then deletes its folder."""

    def __init__(
        self,
        window: MyPipelinesHost,
        add_action: QAction,
        *,
        parent: QWidget,
        root: Path | None = None,
    ) -> None:
        super().__init__(parent)
        #: The window as a widget: the parent of this hook and of its dialogs.
        self.widget = parent
        self.window = window
        self.root = root
        self.imports = window.bridge.imports
        self.imports.root = root
        self.dialog: AddModelDialog | None = None
        self.entries: list[MyPipeline] = []
        self._close_pending = False
        add_action.triggered.connect(self.open_dialog)
        window.pipelines.add_model_requested.connect(self.open_dialog)
        window.pipelines.remove_requested.connect(self.remove)
        self.refresh()

    def refresh(self) -> list[MyPipeline]:
        """List My pipelines again from the user data folder."""
        try:
            self.entries = my_pipelines(self.root)
        except OSError as exc:
            self.entries = []
            self.window.banner.show_error(ErrorInfo("My pipelines could not be listed", str(exc)))
        self.window.pipelines.set_mine([(entry.path, entry.description) for entry in self.entries])
        return self.entries

    def open_dialog(self) -> AddModelDialog:
        """Show the Add model dialog (the one already open, if any)."""
        if self.dialog is None:
            dialog = AddModelDialog(self.imports, self.widget)
            dialog.added.connect(self._added)
            dialog.finished.connect(self._dialog_closed)
            self.dialog = dialog
        self.dialog.open()
        self.dialog.raise_()
        return self.dialog

    def _dialog_closed(self, _result: int) -> None:
        dialog, self.dialog = self.dialog, None
        if dialog is not None:
            dialog.deleteLater()

    def _added(self, made: MyPipeline) -> None:
        """List it, and open it unless a run is under way (it is in the list to open then)."""
        self.refresh()
        if not self.window.bridge.state.busy:
            self.window.open_path(made.path)

    def remove(self, name: str, *, confirm: bool = True) -> bool:
        """Remove one of My pipelines (not while its stages are loaded or running)."""
        entry = next((entry for entry in self.entries if entry.name == name), None)
        if entry is None:
            return False
        bridge = self.window.bridge
        current = bridge.pipeline
        if (
            current is not None
            and current.path == entry.path
            and (bridge.state.busy or bridge.state is RunState.LOADED)
        ):
            self.window.banner.show_error(
                ErrorInfo(
                    f"{name} is in use",
                    f"{entry.path}: its stages are loaded; unload them (Run > Unload stages) "
                    "or open another pipeline, then remove it",
                    kind="warning",
                )
            )
            return False
        if confirm:
            answer = QMessageBox.question(
                self.widget,
                "Remove pipeline",
                f"Remove {name} from My pipelines?\n\nIts folder {entry.path.parent} is "
                "deleted (a model folder it only referenced stays).",
            )
            if answer != QMessageBox.StandardButton.Yes:
                return False
        try:
            remove_entry(name, self.root)
        except (ModelImportError, OSError) as exc:
            self.window.banner.show_error(ErrorInfo(f"{name} was not removed", str(exc)))
            return False
        self.refresh()
        self.window.pipelines.set_recent(
            [path for path in self.window.settings.recent if path.exists()]
        )
        return True

    def defer_close(self) -> bool:
        """True while an import runs: it is cancelled and the window closes once it ends."""
        if not self.imports.busy:
            return False
        if not self._close_pending:
            self._close_pending = True
            self.imports.cancel()
            self.imports.finished.connect(self._close_window)
        return True

    def _close_window(self, _outcome: object) -> None:
        self.window.close()
