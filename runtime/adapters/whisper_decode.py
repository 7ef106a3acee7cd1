"""Whisper's greedy decoding, one window at a time, without running any graph itself.

:class:`WindowDecode` is a step machine: :meth:`~WindowDecode.step_inputs` gives the one-step
decoder graph's inputs (see :mod:`runtime.adapters.whisper_graphs`) and
:meth:`~WindowDecode.feed` takes its outputs, until the window's text ends. The prompt's
tokens go through the graph one position at a time, then each chosen token is fed back. The
rules are faster-whisper's (CTranslate2's greedy search) for ``beam_size=1, temperature=0,
without_timestamps=True``:

- the prompt is ``[<|startofprev|>, last 223 tokens of the previous windows' text]`` (when
  there is previous text), then ``<|startoftranscript|>`` and ``<|notimestamps|>``;
- the model's ``suppress_ids`` (non-speech symbols and the special tokens) never come out, and
  at the first generated position neither do its ``suppress_ids_begin`` (a blank, 220, and
  end of text, 50256);
- decoding stops at end of text or at the model's last text position (448);
- the no-speech probability is the softmax of ``<|nocaptions|>`` at the position after
  ``<|startoftranscript|>``; a window whose no-speech probability exceeds 0.6 while its
  average log probability is below -1 is skipped as silence.

:class:`Vocabulary` turns tokens into text (the byte-level BPE of ``vocabulary.txt``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

__all__ = [
    "DecodeRules",
    "Segment",
    "Vocabulary",
    "WindowDecode",
    "WindowResult",
    "cross_names",
]


def cross_names(layer: int) -> tuple[str, str]:
    """The names of decoder layer ``layer``'s cross-attention keys and values (here, not with
    the graphs: running the bundles needs no onnx)."""
    return f"cross_k_{layer}", f"cross_v_{layer}"


#: faster-whisper's thresholds: a window is silence when both hold.
NO_SPEECH_THRESHOLD: Final = 0.6
LOG_PROB_THRESHOLD: Final = -1.0


@dataclass(frozen=True, slots=True)
class DecodeRules:
    """The special tokens and suppression lists of one Whisper model (English-only here)."""

    eot: int
    sot: int
    sot_prev: int
    no_timestamps: int
    no_speech: int
    timestamp_begin: int
    suppress: tuple[int, ...]
    suppress_begin: tuple[int, ...]
    max_positions: int = 448

    def prompt(self, previous: Sequence[int]) -> list[int]:
        """The decoder prompt of a window after ``previous`` text tokens."""
        tokens: list[int] = []
        if previous:
            tokens.append(self.sot_prev)
            tokens.extend(previous[-(self.max_positions // 2 - 1) :])
        tokens.extend((self.sot, self.no_timestamps))
        return tokens


@dataclass(frozen=True, slots=True)
class WindowResult:
    """What one window decoded to: its text tokens (no end of text), the no-speech
    probability and the average log probability of the tokens chosen (end of text counted)."""

    tokens: tuple[int, ...]
    no_speech_prob: float
    avg_logprob: float

    @property
    def is_silence(self) -> bool:
        return self.no_speech_prob > NO_SPEECH_THRESHOLD and self.avg_logprob < LOG_PROB_THRESHOLD


@dataclass(frozen=True, slots=True)
class Segment:
    """One transcribed window: its text, tokens and times in seconds."""

    start: float
    end: float
    text: str
    tokens: tuple[int, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "text": self.text,
            "tokens": list(self.tokens),
        }


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - float(np.max(logits))
    return np.asarray(shifted - np.log(np.sum(np.exp(shifted))))


@dataclass(slots=True)
class WindowDecode:
    """Greedy decoding of one window (see the module); ``cache`` rows are positions."""

    rules: DecodeRules
    prompt: tuple[int, ...]
    cache: np.ndarray
    position: int = 0
    generated: list[int] = field(default_factory=list)
    logprob_sum: float = 0.0
    no_speech_prob: float = 0.0
    done: bool = False
    _next: int = -1

    @classmethod
    def start(cls, rules: DecodeRules, prompt: Sequence[int], cache: np.ndarray) -> WindowDecode:
        """A decode of ``prompt`` writing into ``cache`` ``[positions, L, 2, H, D]``."""
        if not prompt or len(prompt) >= min(rules.max_positions, cache.shape[0]):
            raise ValueError(
                f"a prompt of {len(prompt)} tokens; accepted: 1 to "
                f"{min(rules.max_positions, cache.shape[0]) - 1}"
            )
        return cls(rules, tuple(prompt), cache)

    def step_inputs(self) -> dict[str, np.ndarray]:
        """The decoder's inputs for the next position (without ``cross_kv``)."""
        token = self.prompt[self.position] if self.position < len(self.prompt) else self._next
        return {
            "tokens": np.array([[token]], dtype=np.int64),
            "self_kv": self.cache[: self.position + 1],
        }

    def feed(self, logits: np.ndarray, new_kv: np.ndarray) -> bool:
        """Take one step's outputs; True once the window's text has ended."""
        if self.done:
            raise RuntimeError("the window's decode has ended")
        self.cache[self.position] = new_kv.reshape(self.cache.shape[1:])
        if self.position < len(self.prompt) and self.prompt[self.position] == self.rules.sot:
            scores = np.asarray(logits, dtype=np.float32).reshape(-1)
            self.no_speech_prob = float(np.exp(_log_softmax(scores)[self.rules.no_speech]))
        self.position += 1
        if self.position < len(self.prompt):
            return False
        scores = np.array(logits, dtype=np.float32).reshape(-1)
        scores[list(self.rules.suppress)] = -np.inf
        if not self.generated:
            scores[list(self.rules.suppress_begin)] = -np.inf
        token = int(np.argmax(scores))
        self.logprob_sum += float(_log_softmax(scores)[token])
        if token == self.rules.eot or self.position >= min(
            self.rules.max_positions, self.cache.shape[0]
        ):
            if token != self.rules.eot:
                self.generated.append(token)
            self.done = True
            return True
        self.generated.append(token)
        self._next = token
        return False

    def result(self) -> WindowResult:
        count = len(self.generated)
        return WindowResult(
            tuple(self.generated), self.no_speech_prob, self.logprob_sum / (count + 1)
        )


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each byte's printable stand-in, reversed."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """Token strings in id order (``vocabulary.txt``), decoded as byte-level BPE."""

    tokens: tuple[str, ...]

    @classmethod
    def load(cls, path: Path) -> Vocabulary:
        return cls(tuple(path.read_text(encoding="utf-8").split("\n")[:-1]))

    @classmethod
    def from_tokens(cls, tokens: Sequence[str]) -> Vocabulary:
        return cls(tuple(tokens))

    def id_of(self, token: str) -> int:
        return self.tokens.index(token)

    def decode(self, ids: Sequence[int], *, eot: int) -> str:
        """The text of ``ids`` below end of text (special tokens left out), as UTF-8 with
        invalid sequences replaced."""
        table = _byte_table()
        raw = bytearray()
        for token in ids:
            if 0 <= token < eot:
                raw.extend(table[char] for char in self.tokens[token])
        return raw.decode("utf-8", errors="replace")


@functools.cache
def _byte_table() -> Mapping[str, int]:
    return _bytes_to_unicode()
