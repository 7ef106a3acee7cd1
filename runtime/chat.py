"""Conversations: chat messages checked, and rendered into one prompt with the model's own
chat template (the CLI's ``--chat``, ``generate({"messages": ...})``, the studio's chat view
and the server's chat completions all go through here).

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

#: The roles a message may have (``developer`` is OpenAI's newer name for ``system``).
ROLES: Final = ("system", "developer", "user", "assistant")
#: The most messages one conversation sends, and the most characters they hold together.
MAX_MESSAGES: Final = 1000
MAX_CHARS: Final = 100_000
FALLBACK: Final = "fallback"
TEMPLATE_FILE: Final = "chat_template.jinja"
TOKENIZER_CONFIG: Final = "tokenizer_config.json"
TOKENIZER_FILE: Final = "tokenizer.json"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn of a conversation."""

    role: str
    content: str

    def to_json(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def parse_messages(raw: object, *, where: str) -> tuple[ChatMessage, ...]:
    """A list of ``{"role", "content"}`` objects -> messages; UsageError naming ``where``, the
    entry and what is accepted. The conversation must end with the user's turn."""
    accepted = "a non-empty list of {'role': system|user|assistant, 'content': str} objects"
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes) or not raw:
        found = "empty" if isinstance(raw, Sequence) and not raw else type(raw).__name__
        raise UsageError(f"{where}: the messages are {found}; accepted: {accepted}")
    if len(raw) > MAX_MESSAGES:
        raise UsageError(
            f"{where}: {len(raw)} messages; accepted: at most {MAX_MESSAGES} in one conversation"
        )
    messages: list[ChatMessage] = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise UsageError(
                f"{where}: messages[{index}] is {type(entry).__name__}; accepted: an object "
                "with 'role' and 'content'"
            )
        unknown = sorted(str(key) for key in entry if key not in ("role", "content", "name"))
        if unknown:
            raise UsageError(
                f"{where}: messages[{index}] has unknown key {unknown[0]!r}; accepted: "
                "'role' and 'content'"
            )
        role, content = entry.get("role"), entry.get("content")
        if role not in ROLES:
            raise UsageError(
                f"{where}: messages[{index}].role is {role!r}; accepted: {', '.join(ROLES)}"
            )
        if not isinstance(content, str):
            raise UsageError(
                f"{where}: messages[{index}].content is {type(content).__name__}; accepted: text"
            )
        messages.append(ChatMessage(str(role), content))
    chars = sum(len(message.content) for message in messages)
    if chars > MAX_CHARS:
        raise UsageError(
            f"{where}: the messages hold {chars} characters; accepted: at most {MAX_CHARS}"
        )
    last = messages[-1]
    if last.role != "user":
        raise UsageError(
            f"{where}: the last message is the {last.role}'s; accepted: a conversation that "
            "ends with the user's turn"
        )
    if not last.content.strip():
        raise UsageError(f"{where}: the last user message has no text; accepted: some text")
    return tuple(messages)


def _token(config: Mapping[str, Any], name: str) -> str:
    value = config.get(name)
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _adds_bos(config: Mapping[str, Any], tokenizer_path: Path, bos: str) -> bool:
    """Whether the tokenizer starts a text prompt with ``bos`` by itself: its config's
    ``add_bos_token`` when set, else whether ``tokenizer.json``'s post-processor puts the
    BOS first. Unknown means no (a ChatML model's BOS is its first turn marker)."""
    flag = config.get("add_bos_token")
    if isinstance(flag, bool):
        return flag
    if not bos or not tokenizer_path.is_file():
        return False
    try:
        processor = json.loads(tokenizer_path.read_text(encoding="utf-8")).get("post_processor")
    except (OSError, ValueError, AttributeError):
        return False
    processors = (
        processor.get("processors", [])
        if isinstance(processor, Mapping) and processor.get("type") == "Sequence"
        else [processor]
    )
    for step in processors:
        if isinstance(step, Mapping) and step.get("type") == "TemplateProcessing":
            single = step.get("single")
            first = single[0] if isinstance(single, list) and single else None
            token = first.get("SpecialToken") if isinstance(first, Mapping) else None
            return isinstance(token, Mapping) and token.get("id") == bos
    return False


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """How a model's messages become its prompt. ``source`` says where the template came
    from (a file path) or is :data:`FALLBACK`."""

    source: str
    template: str | None = None
    bos_token: str = ""
    eos_token: str = ""
    #: Whether the model's tokenizer puts the BOS token before a text prompt itself (then a
    #: rendered prompt's leading BOS is dropped, not doubled).
    adds_bos: bool = False

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
        adds = _adds_bos(config, model_dir / TOKENIZER_FILE, bos)
        template_path = model_dir / TEMPLATE_FILE
        if template_path.is_file():
            text = template_path.read_text(encoding="utf-8")
            return cls(str(template_path), text, bos, eos, adds)
        template = config.get("chat_template")
        if isinstance(template, list):
            named = {
                entry.get("name"): entry.get("template")
                for entry in template
                if isinstance(entry, Mapping)
            }
            template = named.get("default")
        if isinstance(template, str) and template.strip():
            return cls(str(config_path), template, bos, eos, adds)
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
        if self.adds_bos and self.bos_token and prompt.startswith(self.bos_token):
            prompt = prompt[len(self.bos_token) :]
        return prompt
