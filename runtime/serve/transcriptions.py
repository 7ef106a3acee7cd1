"""``POST /v1/audio/transcriptions``: OpenAI's multipart form read, checked and answered.

The body is parsed by Starlette's multipart parser (python-multipart) from the request's
stream, bounded by ``ServeLimits.max_audio_bytes`` as it arrives (413), into at most one file
(spooled to an anonymous temporary file past 1 MiB, closed by the caller) and a few short
fields. The file is decoded with :func:`runtime.audio.reader.read_audio` (soundfile, soxr) to
16 kHz mono; what cannot be decoded is a 400 naming the field ``file`` and what is accepted.

Answers follow OpenAI's shapes: ``json`` (``{"text"}``), ``text``, ``verbose_json``
(``text``, ``language``, ``duration``, ``segments``), ``srt``, ``vtt``; with ``stream=true``,
server-sent ``transcript.text.delta`` events (one per segment, as the pipeline finishes it)
and one ``transcript.text.done``. The recogniser is English-only (``language`` ``en`` or
empty) and decodes greedily (``temperature`` 0); ``prompt`` is refused when not empty, since
the transcription adapter takes no initial prompt (each 30 s window is prompted with the
text of the windows before it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from runtime.audio.reader import ACCEPTED_FORMATS, AudioReadError, read_audio
from runtime.errors import OmniError
from runtime.serve.errors import ApiError, from_runtime_error, invalid

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence

    import numpy as np
    from starlette.datastructures import FormData
    from starlette.requests import Request

    from runtime.api import OmniRequestOutput
    from runtime.serve.registry import Submitted

#: The form's fields; ``timestamp_granularities[]`` is how OpenAI's clients send that list.
TRANSCRIPTION_FIELDS: Final = (
    "file",
    "model",
    "language",
    "prompt",
    "response_format",
    "temperature",
    "timestamp_granularities[]",
    "stream",
)
TRANSCRIPTION_FORMATS: Final = ("json", "text", "verbose_json", "srt", "vtt")
#: The formats a streamed answer can stand for (the others need the whole transcript).
STREAM_FORMATS: Final = ("json", "text")
#: The recogniser is an English-only model (Whisper tiny.en).
LANGUAGES: Final = ("en",)
LANGUAGE_NAME: Final = "english"
#: The largest text field (model, language, prompt, ...); the file is bounded by the body.
MAX_FIELD_BYTES: Final = 64 * 1024
MULTIPART: Final = "multipart/form-data"
_ACCEPTED_BODY: Final = (
    f"{MULTIPART} with the fields file (an audio file) and model, and optionally "
    "language, prompt, response_format, temperature, stream"
)
_TEXT_MEDIA: Final = {
    "text": "text/plain; charset=utf-8",
    "srt": "text/plain; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


@dataclass(frozen=True, slots=True)
class TranscriptionRequest:
    """A checked ``/v1/audio/transcriptions`` form, less its file."""

    model: str
    filename: str
    response_format: str
    stream: bool


@dataclass(frozen=True, slots=True)
class TranscriptSegment:
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Transcript:
    """What the pipeline's final output says: the text (without Whisper's leading space),
    the segments and the audio's length in seconds."""

    text: str
    segments: tuple[TranscriptSegment, ...]
    duration: float


def _too_large(size: str, limit: int) -> ApiError:
    return ApiError(
        413,
        f"the multipart body has {size} bytes; accepted: at most {limit}",
        code="request_too_large",
    )


async def read_transcription_form(request: Request, limit: int) -> FormData:
    """The request's multipart form, read as it arrives; 413 past ``limit`` bytes, 400 for a
    body that is not a readable multipart form. The caller closes the form (its file)."""
    content_type = request.headers.get("content-type", "")
    media = content_type.partition(";")[0].strip().lower()
    if media != MULTIPART:
        raise invalid(
            f"the body is {media or 'untyped'}; accepted: {_ACCEPTED_BODY}",
            param=None,
            code="invalid_content_type",
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(declared, limit)

    async def bounded() -> AsyncGenerator[bytes, None]:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(f"more than {limit}", limit)
            yield chunk

    parser = MultiPartParser(
        request.headers,
        bounded(),
        max_files=1,
        max_fields=len(TRANSCRIPTION_FIELDS) + 4,
        max_part_size=MAX_FIELD_BYTES,
    )
    try:
        return await parser.parse()
    except MultiPartException as exc:
        raise invalid(
            f"the multipart body cannot be read ({exc.message}); accepted: {_ACCEPTED_BODY}",
            param=None,
            code="invalid_multipart",
        ) from None


def _text_field(form: FormData, name: str, *, multiple: bool = False) -> list[str]:
    values = form.getlist(name)
    if len(values) > 1 and not multiple:
        raise invalid(
            f"the field {name!r} is given {len(values)} times; accepted: once",
            param=name,
            code="duplicate_field",
        )
    for value in values:
        if not isinstance(value, str):
            raise invalid(f"the field {name!r} is a file; accepted: a text field", param=name)
    return [str(value) for value in values]


def _one(form: FormData, name: str, default: str = "") -> str:
    values = _text_field(form, name)
    return values[0] if values else default


def parse_transcription_form(form: FormData) -> tuple[TranscriptionRequest, UploadFile]:
    """The form -> the checked request and its file, or a 400 naming the field, the value
    and what is accepted."""
    unknown = sorted({name for name, _ in form.multi_items()} - set(TRANSCRIPTION_FIELDS))
    if unknown:
        raise invalid(
            f"unknown field {unknown[0]!r}; accepted: {', '.join(TRANSCRIPTION_FIELDS)}",
            param=unknown[0],
            code="unknown_field",
        )
    files = form.getlist("file")
    if not files:
        raise invalid(
            f"the field 'file' is missing; accepted: an audio file ({ACCEPTED_FORMATS})",
            param="file",
            code="missing_field",
        )
    upload = files[0]
    if not isinstance(upload, UploadFile):
        raise invalid(
            "the field 'file' is text; accepted: a file part (with a filename) holding "
            f"audio ({ACCEPTED_FORMATS})",
            param="file",
        )
    model = _one(form, "model")
    if not model:
        raise invalid(
            "the field 'model' is missing or empty; accepted: the name of a served "
            "transcription pipeline (GET /v1/models)",
            param="model",
            code="missing_field" if "model" not in form else "invalid_value",
        )
    language = _one(form, "language")
    if language not in ("", *LANGUAGES):
        raise invalid(
            f"'language' is {language!r}; accepted: {', '.join(LANGUAGES)} or empty (the "
            "recogniser is an English-only model)",
            param="language",
        )
    if _one(form, "prompt").strip():
        raise invalid(
            "'prompt' is given; accepted: no prompt or an empty one (the recogniser takes no "
            "initial prompt: each 30 s window is prompted with the text of those before it)",
            param="prompt",
        )
    response_format = _one(form, "response_format", "json")
    if response_format not in TRANSCRIPTION_FORMATS:
        raise invalid(
            f"'response_format' is {response_format!r}; accepted: "
            f"{', '.join(TRANSCRIPTION_FORMATS)}",
            param="response_format",
        )
    temperature = _one(form, "temperature", "0")
    try:
        greedy = float(temperature) == 0.0
    except ValueError:
        greedy = False
    if not greedy:
        raise invalid(
            f"'temperature' is {temperature!r}; accepted: 0 (the recogniser decodes greedily)",
            param="temperature",
        )
    for granularity in _text_field(form, "timestamp_granularities[]", multiple=True):
        if granularity != "segment":
            raise invalid(
                f"'timestamp_granularities[]' is {granularity!r}; accepted: segment",
                param="timestamp_granularities[]",
            )
    stream_value = _one(form, "stream", "false")
    if stream_value.lower() not in ("true", "false"):
        raise invalid(f"'stream' is {stream_value!r}; accepted: true or false", param="stream")
    stream = stream_value.lower() == "true"
    if stream and response_format not in STREAM_FORMATS:
        raise invalid(
            f"'stream' is true with response_format {response_format!r}; accepted: a stream "
            f"with {' or '.join(STREAM_FORMATS)}, or stream false",
            param="stream",
        )
    request = TranscriptionRequest(model, upload.filename or "", response_format, stream)
    return request, upload


def decode_upload(upload: UploadFile, *, max_seconds: float) -> np.ndarray:
    """The uploaded file as 16 kHz mono float32 (blocking: run it off the event loop), or a
    400 naming the field ``file``, the problem and what is accepted."""
    name = f"file {upload.filename!r}" if upload.filename else "file"
    if not upload.size:
        raise invalid(
            f"{name} is empty (0 bytes); accepted: {ACCEPTED_FORMATS}", param="file", code="empty"
        )
    upload.file.seek(0)
    try:
        return read_audio(upload.file, max_seconds=max_seconds, name=name)
    except AudioReadError as exc:
        # libsndfile's words name the spooled file object; the message names the upload.
        message = str(exc).replace(f"Error opening {upload.file!r}: ", "")
        raise invalid(message, param="file", code=exc.code) from None


def _transcript(final: OmniRequestOutput | None) -> Transcript:
    metrics = final.metrics if final is not None else {}
    segments = tuple(
        TranscriptSegment(
            float(entry["start"]),
            float(entry["end"]),
            str(entry["text"]),
            tuple(int(token) for token in entry.get("tokens", ())),
        )
        for entry in metrics.get("segments", ())
    )
    text = (final.text or "") if final is not None else ""
    return Transcript(text.strip(), segments, float(metrics.get("audio_seconds") or 0.0))


async def collect_transcript(submitted: Submitted) -> Transcript:
    """The whole transcript, once the request has finished."""
    final = None
    while (output := await submitted.next()) is not None:
        if output.finished:
            final = output
    return _transcript(final)


def _sse(document: Mapping[str, Any]) -> bytes:
    return f"data: {json.dumps(document, separators=(',', ':'))}\n\n".encode()


async def transcript_events(submitted: Submitted) -> AsyncIterator[bytes]:
    """OpenAI's streamed transcription: a ``transcript.text.delta`` per segment as it is
    finished, then ``transcript.text.done``; the deltas join into the done event's text."""
    started = False
    try:
        while (output := await submitted.next()) is not None:
            if output.finished:
                text = _transcript(output).text
                yield _sse({"type": "transcript.text.done", "text": text})
                return
            delta = output.text or ""
            if not started:
                delta = delta.lstrip()
            if delta:
                started = True
                yield _sse({"type": "transcript.text.delta", "delta": delta})
    except OmniError as exc:
        yield _sse({"type": "error", **from_runtime_error(exc).body()})


def _stamp(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def srt(segments: Sequence[TranscriptSegment]) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm`` times, a blank line after each cue."""
    return "".join(
        f"{index}\n{_stamp(seg.start, ',')} --> {_stamp(seg.end, ',')}\n{seg.text.strip()}\n\n"
        for index, seg in enumerate(segments, 1)
    )


def vtt(segments: Sequence[TranscriptSegment]) -> str:
    """WebVTT: the header, then cues with ``HH:MM:SS.mmm`` times."""
    cues = "".join(
        f"{_stamp(seg.start, '.')} --> {_stamp(seg.end, '.')}\n{seg.text.strip()}\n\n"
        for seg in segments
    )
    return f"WEBVTT\n\n{cues}"


def _usage(transcript: Transcript) -> dict[str, Any]:
    return {"type": "duration", "seconds": math.ceil(transcript.duration)}


def transcription_body(response_format: str, transcript: Transcript) -> tuple[Any, str | None]:
    """The answer in ``response_format``: a JSON document (media None) or text and its media
    type."""
    if response_format == "json":
        return {"text": transcript.text, "usage": _usage(transcript)}, None
    if response_format == "verbose_json":
        segments = [
            {
                "id": index,
                # Where the segment's window starts, in 10 ms log-mel frames (Whisper's seek).
                "seek": round(seg.start * 100),
                "start": seg.start,
                "end": seg.end,
                "text": seg.text,
                "tokens": list(seg.tokens),
                "temperature": 0.0,
            }
            for index, seg in enumerate(transcript.segments)
        ]
        document = {
            "task": "transcribe",
            "language": LANGUAGE_NAME,
            "duration": round(transcript.duration, 3),
            "text": transcript.text,
            "segments": segments,
            "usage": _usage(transcript),
        }
        return document, None
    if response_format == "srt":
        return srt(transcript.segments), _TEXT_MEDIA["srt"]
    if response_format == "vtt":
        return vtt(transcript.segments), _TEXT_MEDIA["vtt"]
    return transcript.text + "\n", _TEXT_MEDIA["text"]
