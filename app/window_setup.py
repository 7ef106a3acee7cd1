"""The main window's first-use offer: when Run is pressed on a pipeline whose language-model
stage needs the managed environment or the built-in assistant's model and this machine does
not have it, the studio offers to make it (:class:`app.widgets.setup_offer.SetupDialog`)
instead of failing, then runs. Kept beside :mod:`app.window`, which asks it before running
and before closing (a job still running is cancelled first)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Protocol

from PySide6.QtCore import QObject, Signal

from app.first_use import SetupNeeds, recogniser_needs, setup_needs
from app.models import RunState
from app.widgets.setup_offer import SetupDialog

if TYPE_CHECKING:
    from pathlib import Path

    from PySide6.QtWidgets import QWidget

    from app.bridge import RuntimeBridge


class SetupHost(Protocol):
    """What the hook uses of the main window (:class:`app.window.MainWindow`)."""

    bridge: RuntimeBridge

    def open_path(self, path: Path | str) -> bool: ...

    def run(self) -> None: ...

    def close(self) -> bool: ...


class FirstUseHook(QObject):
    """``offers``: False runs without asking, as the headless self-test does (the run then
    fails with the runtime's message, or builds the model when its stage starts)."""

    #: An offer made before opening was closed without making anything.
    setup_declined = Signal()

    def __init__(self, window: SetupHost, *, parent: QWidget) -> None:
        super().__init__(parent)
        #: The window as a widget: the parent of this hook and of its dialogs.
        self.widget = parent
        self.window = window
        self.offers = True
        self.jobs = window.bridge.setup_jobs
        self.dialog: SetupDialog | None = None
        self._close_pending = False

    def needs(self) -> SetupNeeds | None:
        """What the open pipeline needs made before it can run, if anything."""
        bridge = self.window.bridge
        info = bridge.pipeline
        if not self.offers or info is None or info.origin != "pipeline":
            return None
        if bridge.state is RunState.LOADED:
            return None  # its stages run already
        jobs = self.jobs
        return setup_needs(
            info.path, env_root=jobs.env_root, recipes=jobs.recipes, model_dir=jobs.model_dir
        )

    def offer_before_run(self) -> bool:
        """True when Run must wait: the offer is shown (or already open)."""
        if self.dialog is not None:
            self.dialog.raise_()
            return True
        needs = self.needs()
        if needs is None:
            return False
        dialog = SetupDialog(self.jobs, needs, self.widget)
        dialog.ready.connect(partial(self._ready, dialog))
        dialog.finished.connect(partial(self._dialog_closed, dialog))
        self.dialog = dialog
        dialog.open()
        return True

    def offer_before_open(self, path: Path) -> bool:
        """True when opening ``path`` must wait: it names the built-in speech recogniser,
        whose bundles are missing, and the offer to make them is shown (or one is open).
        Once they are made the pipeline is opened; declined, nothing is opened."""
        if self.dialog is not None:
            self.dialog.raise_()
            return True
        if not self.offers or path.suffix.lower() not in (".yaml", ".yml"):
            return False
        needs = recogniser_needs(path)
        if needs is None:
            return False
        dialog = SetupDialog(self.jobs, needs, self.widget, action="Make them and open")
        dialog.ready.connect(partial(self._made_for_open, dialog, path))
        dialog.finished.connect(partial(self._dialog_closed, dialog))
        self.dialog = dialog
        dialog.open()
        return True

    def _made_for_open(self, dialog: SetupDialog, path: Path) -> None:
        if self.dialog is dialog:
            self.dialog = None
        self.window.open_path(path)

    def _dialog_closed(self, dialog: SetupDialog, result: int) -> None:
        if self.dialog is dialog:
            self.dialog = None
            if result != SetupDialog.DialogCode.Accepted:
                self.setup_declined.emit()
        dialog.deleteLater()

    def _ready(self, dialog: SetupDialog) -> None:
        """All is made: run (the offer closes right after)."""
        if self.dialog is dialog:
            self.dialog = None
        self.window.run()

    def defer_close(self) -> bool:
        """True while a job runs: it is cancelled and the window closes once it ends."""
        if not self.jobs.busy:
            return False
        if not self._close_pending:
            self._close_pending = True
            self.jobs.cancel()
            self.jobs.finished.connect(lambda _outcome: self.window.close())
        return True
