"""Managed worker environments: ``omni-edge env create|list|remove NAME``.

* :mod:`runtime.envs.recipes` -- recipes as data (``ort-cpu``, ``vllm-cpu``, ``vllm-cuda``).
* :mod:`runtime.envs.manager` -- idempotent, all-or-nothing creation; listing; removal.
* :mod:`runtime.envs.commands` -- the ``env`` command of the ``omni-edge`` command line.

A route runs a worker in one with ``interpreter: env:NAME``.
"""

from __future__ import annotations

from runtime.envs.manager import (
    DATA_DIR_VARIABLE,
    MARKER_NAME,
    EnvCreateError,
    EnvError,
    EnvInfo,
    EnvUnsupported,
    Progress,
    create_env,
    data_dir,
    directory_size,
    env_python,
    envs_root,
    list_envs,
    recipe_unsupported_reason,
    remove_env,
)
from runtime.envs.recipes import RECIPES, EnvRecipe, EnvStep, env_python_path, step_argv

__all__ = [
    "DATA_DIR_VARIABLE",
    "MARKER_NAME",
    "RECIPES",
    "EnvCreateError",
    "EnvError",
    "EnvInfo",
    "EnvRecipe",
    "EnvStep",
    "EnvUnsupported",
    "Progress",
    "create_env",
    "data_dir",
    "directory_size",
    "env_python",
    "env_python_path",
    "envs_root",
    "list_envs",
    "recipe_unsupported_reason",
    "remove_env",
    "step_argv",
]
