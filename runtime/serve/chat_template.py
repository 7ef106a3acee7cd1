"""Chat messages rendered into one prompt with the model's own chat template.

A Hugging Face model directory carries its template in ``chat_template.jinja`` or in
``tokenizer_config.json`` (``chat_template``: a string, or a list of named templates). It is
rendered in Jinja's immutable sandbox, as ``transformers`` renders it, with the generation
prompt added. A model without a template (the tiny test model, a remote route) gets
:data:`FALLBACK`: one ``role: content`` line per message and ``assistant:`` last.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from runtime.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from runtime.serve.requests import ChatMessage

FALLBACK: Final = "fallback"
TEMPLATE_FILE: Final = "chat_template.jinja"
TOKENIZER_CONFIG: Final = "tokenizer_config.json"


def _token(config: Mapping[str, Any], name: str) -> str:
    value = config.get(name)
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """How a model's messages become its prompt. ``source`` says where the template came
    from (a file path) or is :data:`FALLBACK`."""

    source: str
    template: str | None = None
    bos_token: str = ""
    eos_token: str = ""

    @classmethod
    def fallback(cls) -> ChatTemplate:
        return cls(FALLBACK)

    @classmethod
    def from_model_dir(cls, model_dir: Path | None) -> ChatTemplate:
        """The template a model directory ships, or the fallback when it ships none."""
        if model_dir is None or not model_dir.is_dir():
            return cls.fallback()
        config_path = model_dir / TOKENIZER_CONFIG
        config: dict[str, Any] = {}
        if config_path.is_file():
            try:
                loaded = json.loads(config_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ConfigError(
                    f"cannot read the tokenizer config: {exc}", file=str(config_path)
                ) from None
            config = loaded if isinstance(loaded, dict) else {}
        bos, eos = _token(config, "bos_token"), _token(config, "eos_token")
        template_path = model_dir / TEMPLATE_FILE
        if template_path.is_file():
            return cls(str(template_path), template_path.read_text(encoding="utf-8"), bos, eos)
        template = config.get("chat_template")
        if isinstance(template, list):
            named = {
                entry.get("name"): entry.get("template")
                for entry in template
                if isinstance(entry, Mapping)
            }
            template = named.get("default")
        if isinstance(template, str) and template.strip():
            return cls(str(config_path), template, bos, eos)
        return cls.fallback()

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt for ``messages``, ending where the assistant's reply begins."""
        if self.template is None:
            lines = [f"{message.role}: {message.content}" for message in messages]
            return "\n".join([*lines, "assistant:"])
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise UsageError(f"the model's chat template refused the messages: {message}")

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = raise_exception
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            prompt = environment.from_string(self.template).render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as exc:
            raise UsageError(f"the chat template of {self.source} failed: {exc}") from None
        # The engine tokenizes a text prompt with its special tokens: it adds the BOS itself.
        if self.bos_token and prompt.startswith(self.bos_token):
            prompt = prompt[len(self.bos_token) :]
        return prompt
