"""Conversations with a language-model pipeline: the turns, the request they make, and the
JSON files they are kept in. No Qt and no engine: the chat view (:mod:`app.widgets.chat`)
drives these values, and tests use them without a window.

A :class:`Conversation` is a frozen value: a system prompt and the turns, user and
assistant in turn. :meth:`Conversation.request` is what the pipeline receives,
``{"messages": [{"role": ..., "content": ...}, ...]}``; the runtime renders the messages
with the language-model stage's chat template. A reply that failed is kept in the
transcript but never sent back to the model; a reply the user stopped is sent as far as it
was written, since the user saw it.

:class:`ConversationStore` keeps one file per conversation, ``<id>.json``, in
``<user data>/conversations``, written atomically (a temporary file in the same folder,
then a rename). A file it cannot read (not JSON, another program's JSON, a newer format)
is reported by name with what is wrong and left exactly as it is.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, NoReturn

from runtime.chat import ChatMessage
from runtime.paths import data_dir

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "FOLDER",
    "FORMAT",
    "Conversation",
    "ConversationError",
    "ConversationStore",
    "ConversationSummary",
    "ReplyDraft",
    "StoreListing",
    "Turn",
]

#: The folder under the user data directory.
FOLDER: Final = "conversations"
#: The version of the file format this module writes and reads.
FORMAT: Final = 1
#: What the ``kind`` key of every conversation file holds (another program's JSON lacks it).
KIND: Final = "omni-edge-conversation"
#: Turn roles in a transcript (the system prompt is the conversation's own field).
TURN_ROLES: Final = ("user", "assistant")
#: How a reply ended: completed, stopped by the user, failed, or (a spoken reply) interrupted
#: by the user speaking over it, kept as far as it was heard.
REPLY_STATUSES: Final = ("done", "stopped", "failed", "interrupted")
TITLE_CHARS: Final = 60
DEFAULT_TITLE: Final = "New conversation"
_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_ACCEPTED: Final = f"a conversation the studio saved ('kind': {KIND!r}, 'format': {FORMAT})"

Role = Literal["user", "assistant"]
Status = Literal["done", "stopped", "failed", "interrupted"]


class ConversationError(ValueError):
    """A conversation file that cannot be read or written, or an id that names none."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)
        self.problem = problem


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn: the user's text, or a reply with how it ended (and, once finished, the
    prompt the language-model stage rendered for it, as the request's record gave it)."""

    role: Role
    content: str
    status: Status = "done"
    prompt: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        document: dict[str, object] = {"role": self.role, "content": self.content}
        if self.role == "assistant":
            document["status"] = self.status
            if self.prompt is not None:
                document["prompt"] = self.prompt
            if self.error:
                document["error"] = self.error
        return document


@dataclass(frozen=True, slots=True)
class Conversation:
    """A system prompt and the turns so far, saved as ``<id>.json``."""

    id: str
    pipeline: str
    system: str = ""
    turns: tuple[Turn, ...] = ()
    created: float = 0.0
    updated: float = 0.0

    @classmethod
    def new(cls, pipeline: str, system: str = "", *, now: float | None = None) -> Conversation:
        at = time.time() if now is None else now
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(at))
        return cls(f"{stamp}-{secrets.token_hex(3)}", pipeline, system, (), at, at)

    @property
    def title(self) -> str:
        """The first user turn, cut to one short line."""
        first = next((turn.content for turn in self.turns if turn.role == "user"), "")
        line = " ".join(first.split())
        if not line:
            return DEFAULT_TITLE
        return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"

    @property
    def last_reply(self) -> str | None:
        """The text of the latest reply that produced any, or None."""
        for turn in reversed(self.turns):
            if turn.role == "assistant" and turn.content:
                return turn.content
        return None

    @property
    def awaits_reply(self) -> bool:
        """True when the last turn is the user's (a reply is due, or can be regenerated)."""
        return bool(self.turns) and self.turns[-1].role == "user"

    def with_system(self, system: str) -> Conversation:
        return self if system == self.system else replace(self, system=system)

    def with_user(self, text: str, *, now: float | None = None) -> Conversation:
        if not text.strip():
            raise ValueError("a user turn needs some text")
        return self._appended(Turn("user", text), now)

    def with_reply(
        self,
        text: str,
        status: Status = "done",
        *,
        prompt: str | None = None,
        error: str | None = None,
        now: float | None = None,
    ) -> Conversation:
        if status not in REPLY_STATUSES:
            raise ValueError(f"reply status {status!r}; accepted: {', '.join(REPLY_STATUSES)}")
        if not self.awaits_reply:
            raise ValueError("a reply follows a user turn")
        return self._appended(Turn("assistant", text, status, prompt, error), now)

    def with_reply_at(self, index: int, text: str, status: Status) -> Conversation:
        """The conversation with the reply at ``index`` of the turns replaced (a spoken reply
        interrupted after it was written, kept as far as it was heard)."""
        if not 0 <= index < len(self.turns) or self.turns[index].role != "assistant":
            raise ValueError(f"turn {index} is not a reply")
        if status not in REPLY_STATUSES:
            raise ValueError(f"reply status {status!r}; accepted: {', '.join(REPLY_STATUSES)}")
        turn = replace(self.turns[index], content=text, status=status)
        return replace(self, turns=(*self.turns[:index], turn, *self.turns[index + 1 :]))

    def for_regeneration(self) -> Conversation:
        """The conversation without its last reply, ending with the user turn to re-run."""
        turns = self.turns
        if turns and turns[-1].role == "assistant":
            turns = turns[:-1]
        if not turns or turns[-1].role != "user":
            raise ValueError("there is no user turn to regenerate a reply for")
        return replace(self, turns=turns)

    def messages(self) -> tuple[ChatMessage, ...]:
        """The chat messages of the next request: the system prompt when it has text, then
        every turn except failed replies (a stopped reply goes as far as it was written, an
        interrupted one as far as it was heard)."""
        messages = [ChatMessage("system", self.system)] if self.system.strip() else []
        for turn in self.turns:
            if turn.role == "assistant" and (turn.status == "failed" or not turn.content):
                continue
            messages.append(ChatMessage(turn.role, turn.content))
        return tuple(messages)

    def request(self) -> dict[str, object]:
        """What the pipeline is sent for the next reply: ``{"messages": [...]}``, which the
        runtime renders with the language-model stage's chat template."""
        if not self.awaits_reply:
            raise ValueError("the conversation does not end with a user turn")
        return {"messages": [message.to_json() for message in self.messages()]}

    def _appended(self, turn: Turn, now: float | None) -> Conversation:
        at = time.time() if now is None else now
        return replace(self, turns=(*self.turns, turn), updated=at)

    # -- JSON --------------------------------------------------------------------------

    def to_json(self) -> dict[str, object]:
        return {
            "kind": KIND,
            "format": FORMAT,
            "id": self.id,
            "pipeline": self.pipeline,
            "title": self.title,
            "created": self.created,
            "updated": self.updated,
            "system": self.system,
            "turns": [turn.to_json() for turn in self.turns],
        }

    @classmethod
    def from_json(cls, document: object, *, source: Path | str) -> Conversation:
        """A conversation from a parsed file; :class:`ConversationError` names the file, the
        field, the value found and what is accepted."""
        reader = _Reader(Path(source))
        top = reader.mapping(document, "the file", _ACCEPTED)
        if top.get("kind") != KIND:
            reader.fail(f"'kind' is {top.get('kind')!r}; accepted: {_ACCEPTED}")
        if top.get("format") != FORMAT:
            reader.fail(
                f"'format' is {top.get('format')!r}; accepted: {FORMAT} (a file written by "
                "another version of the studio)"
            )
        reader.keys(
            top,
            "the file",
            {"kind", "format", "id", "pipeline", "title", "created", "updated", "system", "turns"},
        )
        conversation_id = reader.text(top, "id")
        if not _ID.fullmatch(conversation_id):
            reader.fail(f"'id' is {conversation_id!r}; accepted: letters, digits, '_' and '-'")
        turns_value = top.get("turns")
        if not isinstance(turns_value, list):
            reader.fail(f"'turns' is {_kind(turns_value)}; accepted: a list of turns")
        turns = tuple(reader.turn(item, index) for index, item in enumerate(turns_value))
        return cls(
            id=conversation_id,
            pipeline=reader.text(top, "pipeline", empty=True),
            system=reader.text(top, "system", empty=True),
            turns=turns,
            created=reader.number(top, "created"),
            updated=reader.number(top, "updated"),
        )


def _kind(value: object) -> str:
    return "missing" if value is None else f"{type(value).__name__} {value!r}"[:80]


@dataclass(frozen=True, slots=True)
class _Reader:
    """Checks of one parsed file; every failure names the file."""

    path: Path

    def fail(self, problem: str) -> NoReturn:
        raise ConversationError(self.path, f"{problem}; the file was left as it is")

    def mapping(self, value: object, where: str, accepted: str) -> Mapping[str, object]:
        if not isinstance(value, dict):
            self.fail(f"{where} is {type(value).__name__}, not an object; accepted: {accepted}")
        return value

    def keys(self, value: Mapping[str, object], where: str, known: set[str]) -> None:
        unknown = sorted(set(value) - known)
        if unknown:
            self.fail(
                f"{where} has unknown key {unknown[0]!r}; accepted: {', '.join(sorted(known))}"
            )

    def text(self, value: Mapping[str, object], key: str, *, empty: bool = False) -> str:
        found = value.get(key)
        if not isinstance(found, str) or (not empty and not found):
            self.fail(
                f"{key!r} is {_kind(found)}; accepted: a {'' if empty else 'non-empty '}string"
            )
        return found

    def number(self, value: Mapping[str, object], key: str) -> float:
        found = value.get(key)
        if (
            isinstance(found, bool)
            or not isinstance(found, (int, float))
            or not math.isfinite(found)
        ):
            self.fail(f"{key!r} is {_kind(found)}; accepted: seconds since the epoch")
        return float(found)

    def turn(self, item: object, index: int) -> Turn:
        where = f"turns[{index}]"
        turn = self.mapping(item, where, "an object with 'role' and 'content'")
        self.keys(turn, where, {"role", "content", "status", "prompt", "error"})
        role = turn.get("role")
        if role not in TURN_ROLES:
            self.fail(f"{where}.role is {_kind(role)}; accepted: {', '.join(TURN_ROLES)}")
        content = turn.get("content")
        if not isinstance(content, str):
            self.fail(f"{where}.content is {_kind(content)}; accepted: a string")
        status = turn.get("status", "done")
        if status not in REPLY_STATUSES:
            self.fail(f"{where}.status is {_kind(status)}; accepted: {', '.join(REPLY_STATUSES)}")
        prompt = turn.get("prompt")
        error = turn.get("error")
        for key, value in (("prompt", prompt), ("error", error)):
            if value is not None and not isinstance(value, str):
                self.fail(f"{where}.{key} is {_kind(value)}; accepted: a string")
        return Turn(role, content, status, prompt, error)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- drafts


@dataclass
class ReplyDraft:
    """The reply being written: the partial outputs' text added up, replaced by the final
    output's whole text (and the prompt the stage rendered) when it arrives."""

    request_id: str | None = None
    text: str = ""
    prompt: str | None = None
    chunks: int = 0
    finished: bool = False

    def add(self, text: str, *, finished: bool, prompt: str | None = None) -> None:
        self.chunks += 1
        if finished:
            self.finished = True
            self.text = text or self.text
            self.prompt = prompt if prompt is not None else self.prompt
        else:
            self.text += text


# ----------------------------------------------------------------------------- the store


@dataclass(frozen=True, slots=True)
class ConversationSummary:
    id: str
    title: str
    pipeline: str
    updated: float
    turns: int
    path: Path


@dataclass(frozen=True, slots=True)
class StoreListing:
    """The conversations found (newest first) and the files that could not be read."""

    conversations: tuple[ConversationSummary, ...] = ()
    problems: tuple[ConversationError, ...] = field(default=())


class ConversationStore:
    """One JSON file per conversation in ``folder`` (default ``<user data>/conversations``)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder if folder is not None else data_dir() / FOLDER

    def path_of(self, conversation_id: str) -> Path:
        if not _ID.fullmatch(conversation_id):
            raise ConversationError(
                self.folder / conversation_id,
                f"{conversation_id!r} is not a conversation id; accepted: letters, digits, "
                "'_' and '-'",
            )
        return self.folder / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> Path:
        """Write the conversation atomically; the previous version stays whole on failure."""
        path = self.path_of(conversation.id)
        data = json.dumps(conversation.to_json(), ensure_ascii=False, indent=1) + "\n"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            descriptor, temporary = tempfile.mkstemp(
                prefix=f".{conversation.id}.", suffix=".tmp", dir=self.folder
            )
        except OSError as exc:
            raise ConversationError(path, f"could not be written: {exc.strerror or exc}") from exc
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except OSError as exc:
            Path(temporary).unlink(missing_ok=True)
            raise ConversationError(path, f"could not be written: {exc.strerror or exc}") from exc
        return path

    def load(self, conversation_id: str) -> Conversation:
        return self.read(self.path_of(conversation_id))

    @staticmethod
    def read(path: Path) -> Conversation:
        """The conversation in ``path``; :class:`ConversationError` says what is wrong."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise ConversationError(path, "no such conversation file") from exc
        except UnicodeDecodeError as exc:
            raise ConversationError(
                path, f"is not UTF-8 text ({exc.reason}); the file was left as it is"
            ) from exc
        except OSError as exc:
            raise ConversationError(path, f"could not be read: {exc.strerror or exc}") from exc
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConversationError(
                path,
                f"is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); accepted: "
                f"{_ACCEPTED}; the file was left as it is",
            ) from exc
        conversation = Conversation.from_json(document, source=path)
        if path.stem != conversation.id:
            raise ConversationError(
                path,
                f"holds conversation {conversation.id!r} but is named {path.name!r}; accepted: "
                f"{conversation.id}.json; the file was left as it is",
            )
        return conversation

    def delete(self, conversation_id: str) -> None:
        path = self.path_of(conversation_id)
        try:
            path.unlink()
        except FileNotFoundError as exc:
            raise ConversationError(path, "no such conversation file") from exc
        except OSError as exc:
            raise ConversationError(path, f"could not be deleted: {exc.strerror or exc}") from exc

    def listing(self) -> StoreListing:
        """Every conversation file, newest first; unreadable ones become problems."""
        try:
            paths = sorted(self.folder.glob("*.json"))
        except OSError as exc:
            return StoreListing((), (ConversationError(self.folder, str(exc)),))
        found: list[ConversationSummary] = []
        problems: list[ConversationError] = []
        for path in paths:
            if path.name.startswith("."):
                continue
            try:
                conversation = self.read(path)
            except ConversationError as exc:
                problems.append(exc)
                continue
            found.append(
                ConversationSummary(
                    conversation.id,
                    conversation.title,
                    conversation.pipeline,
                    conversation.updated,
                    len(conversation.turns),
                    path,
                )
            )
        found.sort(key=lambda summary: (summary.updated, summary.id), reverse=True)
        return StoreListing(tuple(found), tuple(problems))
