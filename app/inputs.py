"""Reading request inputs and references from ``.npz`` files, checked against the example."""

from __future__ import annotations

import zipfile
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path


class InputFileError(ValueError):
    """An ``.npz`` file that cannot serve as the pipeline's inputs (names the file and array)."""


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (never unpickling objects)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: np.array(archive[name]) for name in archive.files}
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputFileError(
            f"{path}: not a NumPy .npz archive of plain arrays ({exc}); accepted: a file written "
            "by numpy.savez with numeric arrays"
        ) from None


def read_inputs(path: Path, examples: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inputs from ``path``: the same names, dtypes and shapes as the example inputs."""
    arrays = read_npz(path)
    if examples:
        expected = ", ".join(
            f"{name} {array.dtype} {tuple(array.shape)}" for name, array in examples.items()
        )
        missing = sorted(set(examples) - set(arrays))
        extra = sorted(set(arrays) - set(examples))
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing)}")
            if extra:
                parts.append(f"unexpected {', '.join(extra)}")
            raise InputFileError(f"{path}: {'; '.join(parts)}; the pipeline takes {expected}")
        for name, example in examples.items():
            array = arrays[name]
            if array.dtype != example.dtype or array.shape != example.shape:
                raise InputFileError(
                    f"{path}: input {name!r} is {array.dtype} {tuple(array.shape)}, but the "
                    f"pipeline takes {example.dtype} {tuple(example.shape)}"
                )
    elif not arrays:
        raise InputFileError(f"{path}: the archive holds no arrays")
    return arrays
