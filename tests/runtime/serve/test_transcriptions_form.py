"""The transcription form's checks and answer formats without a server: each refusal names
the field, the value and what is accepted."""

from __future__ import annotations

import io
from typing import Any

import pytest
from starlette.datastructures import FormData, UploadFile

from runtime.serve.errors import ApiError
from runtime.serve.transcriptions import (
    Transcript,
    TranscriptSegment,
    decode_upload,
    parse_transcription_form,
    transcription_body,
)


def _upload(content: bytes = b"RIFF", name: str = "clip.wav") -> UploadFile:
    return UploadFile(io.BytesIO(content), size=len(content), filename=name)


def _form(*items: tuple[str, Any]) -> FormData:
    return FormData([("file", _upload()), ("model", "transcribe"), *items])


def _refused(form: FormData) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_transcription_form(form)
    assert caught.value.status == 400
    return caught.value


def test_a_form_parses_with_openais_defaults() -> None:
    request, upload = parse_transcription_form(_form())
    assert (request.model, request.filename, request.response_format, request.stream) == (
        "transcribe",
        "clip.wav",
        "json",
        False,
    )
    assert upload.filename == "clip.wav"
    request, _ = parse_transcription_form(
        _form(
            ("language", "en"),
            ("prompt", " "),
            ("temperature", "0.0"),
            ("timestamp_granularities[]", "segment"),
            ("stream", "True"),
            ("response_format", "text"),
        )
    )
    assert request.stream
    assert request.response_format == "text"


@pytest.mark.parametrize(
    ("items", "param", "words"),
    [
        ((("model", "again"),), "model", "the field 'model' is given 2 times"),
        ((("timestamp_granularities[]", "word"),), "timestamp_granularities[]", "segment"),
        ((("stream", "yes"),), "stream", "'stream' is 'yes'; accepted: true or false"),
        ((("temperature", "warm"),), "temperature", "'temperature' is 'warm'; accepted: 0"),
        ((("language", _upload()),), "language", "the field 'language' is a file"),
        ((("language", "EN"),), "language", "accepted: en or empty"),
    ],
)
def test_bad_fields_are_refused_by_name(
    items: tuple[tuple[str, Any], ...], param: str, words: str
) -> None:
    error = _refused(_form(*items))
    assert error.param == param
    assert words in error.message


def test_an_empty_model_is_named() -> None:
    error = _refused(FormData([("file", _upload()), ("model", "")]))
    assert error.param == "model"
    assert error.code == "invalid_value"


def test_an_undecodable_upload_names_the_file_and_what_is_accepted() -> None:
    with pytest.raises(ApiError) as caught:
        decode_upload(_upload(b"\x00" * 64, "noise.bin"), max_seconds=60.0)
    assert caught.value.param == "file"
    assert caught.value.code == "not_audio"
    assert "file 'noise.bin': not audio that can be read (Format not recognised" in (
        caught.value.message
    )
    assert "object at 0x" not in caught.value.message
    with pytest.raises(ApiError) as caught:
        decode_upload(_upload(b"", "empty.wav"), max_seconds=60.0)
    assert caught.value.code == "empty"


TRANSCRIPT = Transcript(
    "One. Two.",
    (
        TranscriptSegment(0.0, 1.5, " One.", (1, 2)),
        TranscriptSegment(3725.25, 3727.0, " Two.", (3,)),
    ),
    3727.4,
)


def test_srt_and_vtt_number_and_time_the_segments() -> None:
    srt, media = transcription_body("srt", TRANSCRIPT)
    assert str(media).startswith("text/plain")
    assert srt == (
        "1\n00:00:00,000 --> 00:00:01,500\nOne.\n\n2\n01:02:05,250 --> 01:02:07,000\nTwo.\n\n"
    )
    vtt, media = transcription_body("vtt", TRANSCRIPT)
    assert str(media).startswith("text/vtt")
    assert vtt == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nOne.\n\n01:02:05.250 --> 01:02:07.000\nTwo.\n\n"
    )


def test_json_bodies_carry_the_text_duration_and_segments() -> None:
    document, media = transcription_body("json", TRANSCRIPT)
    assert media is None
    assert document == {"text": "One. Two.", "usage": {"type": "duration", "seconds": 3728}}
    verbose, _ = transcription_body("verbose_json", TRANSCRIPT)
    assert verbose["language"] == "english"
    assert verbose["duration"] == 3727.4
    assert [(s["id"], s["seek"], s["start"], s["text"]) for s in verbose["segments"]] == [
        (0, 0, 0.0, " One."),
        (1, 372525, 3725.25, " Two."),
    ]
    text, media = transcription_body("text", TRANSCRIPT)
    assert text == "One. Two.\n"
