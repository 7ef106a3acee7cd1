"""What a request yields, as values: ``OmniRequestOutput``, and ``AudioChunk``, the audio an
output of a speaking pipeline carries.

The engine makes them and the studio, the server and scripts read them, so they live below
the engine (numpy and the runtime's errors only); :mod:`runtime.engine.outputs` adds the
stream that carries them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.errors import ModelError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from runtime.metrics import StageCallMetrics

__all__ = [
    "AUDIO_KEYS",
    "SPAN_KEYS",
    "STREAM_KEYS",
    "TEXT_KEY",
    "AudioChunk",
    "OmniRequestOutput",
    "TextSpan",
]


@dataclass(slots=True, eq=False)
class OmniRequestOutput:
    """One output of a request.

    ``outputs`` of a graph stage are read-only arrays over the worker's shared memory: they
    stay valid until :meth:`release_stage_buffers` is called, and the stage keeps its slot
    until then. The public generators call it when iteration advances or closes, direct
    consumers call it in ``finally``. Whatever must outlive the acknowledgement is copied by
    whoever keeps it (:meth:`kept_outputs`; ``Omni.run`` returns such copies).

    ``text`` is a language-model stage's text: on a partial output (``finished`` false) the
    text added since the previous one, so the partials concatenate to the whole; on the
    final output of a text-producing pipeline, the whole text. It is None on outputs that
    carry no text (tensors, audio chunks). Shaped like audio, it is also in ``outputs``: a
    text partial's outputs are ``{"text": <the new text>}``, as an audio partial's hold
    ``pcm``, ``sample_rate`` and its indices.
    """

    request_id: str
    stage: str
    outputs: Mapping[str, np.ndarray]
    finished: bool
    index: int = 0
    metrics: Mapping[str, Any] = field(default_factory=dict)
    text: str | None = None
    #: The request's stage calls so far, as values (``metrics["stages"]`` is their JSON).
    calls: tuple[StageCallMetrics, ...] = ()
    _release: Callable[[], None] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def audio(self) -> AudioChunk | None:
        """The audio this output carries (None where it carries none); :class:`ModelError`
        when its ``pcm`` or the numbers beside it are malformed."""
        return AudioChunk.from_output(self)

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        """The arrays this output carries besides audio and text (a graph chain's results),
        still over the stage's buffers: copy them to keep them."""
        return {
            name: value
            for name, value in self.outputs.items()
            if name not in STREAM_KEYS and isinstance(value, np.ndarray)
        }

    @property
    def span(self) -> TextSpan | None:
        """Where this output's text lies in the input audio (a transcription's segment);
        None for an output without ``start_s`` and ``end_s`` beside its text."""
        return TextSpan.from_output(self)

    @property
    def prompt(self) -> str | None:
        """The prompt text a language-model stage was given (its end when it is long), on a
        text pipeline's final output; None elsewhere and for a prompt of token ids."""
        if not self.finished:
            return None
        prompt = self.metrics.get("prompt")
        return prompt if isinstance(prompt, str) else None

    def kept_outputs(self) -> dict[str, Any]:
        """Copies of the outputs that stay valid after acknowledgement (copied once, here)."""
        kept: dict[str, Any] = {}
        for name, value in self.outputs.items():
            kept[name] = value.copy() if isinstance(value, np.ndarray) else value
        return kept

    def release_stage_buffers(self) -> None:
        """Acknowledge this output so its stage can take the next request. Idempotent."""
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release()


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """The audio of one output: ``pcm`` (mono float32, 1-D; empty on a speaking pipeline's
    final output), its ``sample_rate``, and the indices a speech program numbers it with
    (``chunk_index`` over the request, ``sentence_index``, ``sentence_samples``: the length of
    the sentence's whole audio), None where the output does not carry them.

    ``pcm`` is the output's own array, not a copy: copy it to keep it after the output is
    released.
    """

    pcm: np.ndarray
    sample_rate: int
    chunk_index: int | None = None
    sentence_index: int | None = None
    sentence_samples: int | None = None

    @classmethod
    def from_output(cls, output: OmniRequestOutput) -> AudioChunk | None:
        """The output's audio, or None when it carries no ``pcm``; :class:`ModelError` when
        its ``pcm`` or the numbers beside it are not what a speaking program emits."""
        return cls.from_outputs(
            output.outputs, source=f"output {output.index} of {output.request_id}"
        )

    @classmethod
    def from_outputs(
        cls, outputs: Mapping[str, object], *, source: str = "an output"
    ) -> AudioChunk | None:
        """:meth:`from_output` for the arrays of an output (as a program emits them)."""
        pcm = outputs.get("pcm")
        if pcm is None:
            return None
        if not isinstance(pcm, np.ndarray) or pcm.ndim != 1 or pcm.dtype != np.float32:
            shape = f"{pcm.dtype} {pcm.shape}" if isinstance(pcm, np.ndarray) else type(pcm)
            raise ModelError(f"{source}: 'pcm' is {shape}; expected a 1-D float32 array")
        rate = _one_int(outputs, "sample_rate", source)
        if rate is None or rate <= 0:
            raise ModelError(f"{source}: 'sample_rate' is {rate}; expected a positive number")
        return cls(
            pcm=pcm,
            sample_rate=rate,
            chunk_index=_one_int(outputs, "chunk_index", source),
            sentence_index=_one_int(outputs, "sentence_index", source),
            sentence_samples=_one_int(outputs, "sentence_samples", source),
        )

    def to_outputs(self) -> dict[str, Any]:
        """The arrays of an output carrying this audio (the indices that are not None)."""
        outputs: dict[str, Any] = {"pcm": self.pcm, "sample_rate": self.sample_rate}
        for name in ("chunk_index", "sentence_index", "sentence_samples"):
            value = getattr(self, name)
            if value is not None:
                outputs[name] = value
        return outputs

    @property
    def duration_s(self) -> float:
        return self.pcm.size / self.sample_rate


@dataclass(frozen=True, slots=True)
class TextSpan:
    """A piece of text and the seconds of input audio it stands for (a transcribed segment)."""

    text: str
    start_s: float
    end_s: float

    @classmethod
    def from_output(cls, output: OmniRequestOutput) -> TextSpan | None:
        """The span of a partial output that carries text, ``start_s`` and ``end_s`` (one
        number each); None for any other output."""
        outputs = output.outputs
        if output.finished or output.text is None or not SPAN_KEYS <= outputs.keys():
            return None
        try:
            start = float(np.asarray(outputs["start_s"]).reshape(()))
            end = float(np.asarray(outputs["end_s"]).reshape(()))
        except (TypeError, ValueError):
            return None
        return cls(output.text, start, end)


#: Names of the arrays :class:`AudioChunk` reads from an output.
AUDIO_KEYS = frozenset({"pcm", "sample_rate", "chunk_index", "sentence_index", "sentence_samples"})
#: The name of the output that carries a language-model stage's text.
TEXT_KEY = "text"
#: Names of the numbers that place a text output in the input audio.
SPAN_KEYS = frozenset({"start_s", "end_s"})
#: Names of the arrays that carry streamed audio or text rather than tensors.
STREAM_KEYS = AUDIO_KEYS | {TEXT_KEY}


def _one_int(outputs: Mapping[str, object], name: str, source: str) -> int | None:
    value = outputs.get(name)
    if value is None:
        return None
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "iuf":
        raise ModelError(f"{source}: {name!r} is {array.dtype} {array.shape}; expected one number")
    return int(array.reshape(()).item())
