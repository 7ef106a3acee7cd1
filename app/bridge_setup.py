"""The part of the bridge that makes what a pipeline needs before its first run: the managed
environment of its language-model stage (:func:`runtime.envs.create_env`), the built-in
assistant's converted model (:func:`runtime.models.smollm2.ensure_smollm2_model`) and the
built-in speech recogniser's bundles
(:func:`runtime.adapters.whisper_export.ensure_whisper_bundles`), on a thread of its own, with
progress lines and the step count as Qt signals, carried to the GUI thread by the bridge's one
hop.

Cancel is cooperative, as for imports (:mod:`app.bridge_models`): the progress callback raises
once Cancel is pressed. Making an environment reports every line its steps print, so Cancel
ends the running step's process group at its next line and the half-made environment is
removed. The model's conversion is one process that reports nothing while it runs: Cancel
takes effect when it ends, and the model, complete and verified by then, is kept. The
recogniser's export reports each step, so Cancel ends it at its next step and its staging
folder is removed.
"""

from __future__ import annotations

import re
from functools import partial
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from app.bridge_models import CancellableJobs, Cancelled
from app.my_pipelines import JobOutcome
from runtime.adapters.whisper_ct2 import WhisperConvertError
from runtime.adapters.whisper_export import ensure_whisper_bundles
from runtime.envs import RECIPES, create_env, env_python
from runtime.errors import OmniError
from runtime.models.marker import ModelBuildError
from runtime.models.smollm2 import ensure_smollm2_model

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from app.first_use import SetupNeeds
    from runtime.envs import EnvRecipe

#: ``[2/5] install ...``: the environment's step lines.
STEP_LINE = re.compile(r"^\[(\d+)/(\d+)\] ")


class SetupJobs(CancellableJobs):
    """Makes one pipeline's SetupNeeds at a time; ``finished`` carries an JobOutcome
    (``made``, ``failed`` or ``cancelled``; ``made`` is None for this job).

    ``env_root``, ``recipes`` and ``model_dir`` are the defaults of the runtime (tests give
    their own)."""

    step = Signal(int)  # steps done so far, out of SetupNeeds.steps

    def __init__(
        self,
        *,
        post: Callable[[Callable[[], None]], None],
        env_root: Path | None = None,
        recipes: Mapping[str, EnvRecipe] = RECIPES,
        model_dir: Path | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(post=post, parent=parent)
        self.env_root = env_root
        self.recipes = recipes
        self.model_dir = model_dir

    def start(self, needs: SetupNeeds) -> bool:
        """Start making ``needs`` (GUI thread); False while another job runs."""
        return self._launch("omni-studio-setup", partial(self._make, needs))

    # -- the job's thread -------------------------------------------------------------------

    def _make(self, needs: SetupNeeds, cancel: threading.Event) -> None:
        report = self._progress_until_cancelled(cancel)

        def progress(line: str) -> None:
            report(line)
            found = STEP_LINE.match(line)
            if found is not None:
                self._step(int(found.group(1)) - 1)

        try:
            for done, name in enumerate(needs.recognisers, start=1):
                ensure_whisper_bundles(name, progress=progress)
                self._step(done)
            if needs.env:
                self._make_env_and_model(needs, progress)
        except Cancelled:
            outcome = JobOutcome("cancelled", "cancelled; nothing half-made was kept")
        except (OmniError, ModelBuildError, WhisperConvertError, OSError) as exc:
            outcome = JobOutcome("failed", str(exc))
        except Exception as exc:  # noqa: BLE001 - reported in the dialog, never lost in a thread
            outcome = JobOutcome("failed", f"{type(exc).__name__}: {exc}")
        else:
            if cancel.is_set():
                outcome = JobOutcome(
                    "cancelled",
                    "cancelled after the last step had finished: what it made is complete and kept",
                )
            else:
                outcome = JobOutcome("made", "ready to run")
        self._done(outcome)

    def _step(self, done: int) -> None:
        self._post(partial(self.step.emit, done))

    def _make_env_and_model(self, needs: SetupNeeds, progress: Callable[[str], None]) -> None:
        if needs.create_env:
            python = create_env(
                needs.env, progress=progress, root=self.env_root, recipes=self.recipes
            ).python
            self._step(needs.env_steps)
        else:
            python = env_python(needs.env, root=self.env_root)
        if needs.model is not None:
            ensure_smollm2_model(python, out_dir=self.model_dir, progress=progress)
            self._step(needs.steps)
