"""Fuzzing ``POST /v1/audio/transcriptions``: generated multipart bodies (valid forms, forms
with wrong fields, audio that is mutated, truncated, empty or not audio, broken boundaries,
lying or missing headers, bodies past the limit, chunked or sized) sent to the server's
application in this process, serving the transcription pipeline in its real workers.

Each answer must be a 200 or a typed refusal (400, 404 or 413 with an OpenAI error body
naming a code); the application may raise nothing (the test client re-raises what it
raised). After each example nothing is left: no request in flight, no new descriptor (the
upload's spooled file), process, segment or file under the test's ``TMPDIR``.

The default profile runs :data:`FAST_EXAMPLES` examples (the pipeline loads once per run);
``HYPOTHESIS_PROFILE=slow`` runs ``OMNI_FUZZ_EXAMPLES`` (``make reliability``).
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from runtime.adapters.whisper_export import export_missing_recognisers
from runtime.devices import discover_topology
from runtime.devices.selection import DeviceSelection
from runtime.serve import PipelineRegistry, ServeApp, ServeLimits
from runtime.serve.transcriptions import TRANSCRIPTION_FIELDS
from tests.reliability.conftest import PROFILE, SLOW_EXAMPLES
from tests.reliability.support import Census
from tests.reliability.test_fuzz import FUZZ, Examples, examples

__all__ = ["examples"]

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "assets" / "pipelines" / "transcribe.yaml"
MODEL = "transcribe"
#: Small enough that generated bodies cross it, large enough for a short clip.
LIMIT = 48 * 1024
#: Examples in the default profile: the suite's share stays a few seconds.
FAST_EXAMPLES = 25
EXAMPLES = SLOW_EXAMPLES if PROFILE == "slow" else FAST_EXAMPLES
#: What a refusal may be (the pipeline runs one request at a time and examples run in turn,
#: so 429 and 503 would be bugs here).
REFUSALS = {400, 404, 413}


def _wav(rate: int, seconds: float, channels: int = 1, subtype: str = "PCM_16") -> bytes:
    rng = np.random.default_rng(rate)
    audio = (0.1 * rng.standard_normal((int(rate * seconds), channels))).astype(np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, rate, format="WAV", subtype=subtype)
    return buffer.getvalue()


#: Audio the reader takes and audio it refuses (rates outside 8 to 384 kHz, no frames).
WAVS = (
    _wav(16000, 0.25),
    _wav(8000, 0.3, channels=2),
    _wav(44100, 0.2, subtype="FLOAT"),
    _wav(4000, 0.5),
    _wav(16000, 0.0),
)
FIELD_VALUES = {
    "model": (MODEL, "", "other", "transcribe\x00", "é" * 3),
    "language": ("en", "", "fr", "EN", "english"),
    "prompt": ("", " ", "Names: Stella."),
    "response_format": ("json", "text", "verbose_json", "srt", "vtt", "", "xml"),
    "temperature": ("0", "0.0", "1", "nan", "-0", "1e999", ""),
    "timestamp_granularities[]": ("segment", "word", ""),
    "stream": ("true", "false", "True", "1", ""),
}
NAMES = (*TRANSCRIPTION_FIELDS, "other", "", 'fi"le', "file\r\nX: y", "\u00e9")
BOUNDARY = st.text(st.sampled_from("abcXYZ0189'()+_,-./:=? "), min_size=1, max_size=70).filter(
    lambda b: not b.endswith(" ")
)


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    filename: str | None
    content_type: str | None
    payload: bytes


@st.composite
def audio_payloads(draw: st.DrawFn) -> bytes:
    wav = draw(st.sampled_from(WAVS))
    how = draw(st.sampled_from(("as is", "truncated", "flipped", "header only", "noise", "text")))
    if how == "truncated":
        return wav[: draw(st.integers(0, len(wav)))]
    if how == "flipped":
        data = bytearray(wav)
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, len(data) - 1))
            data[at] = draw(st.integers(0, 255))
        return bytes(data)
    if how == "header only":
        return wav[:44]
    if how == "noise":
        return draw(st.binary(max_size=512))
    if how == "text":
        return b"plain words, not audio\n" * draw(st.integers(0, 40))
    return wav


@st.composite
def parts(draw: st.DrawFn) -> Part:
    name = draw(st.sampled_from(NAMES))
    if name == "file" or draw(st.integers(0, 9)) == 0:
        filename = draw(st.sampled_from(("clip.wav", "", "a\u00e9.flac", "../x", None)))
        content_type = draw(st.sampled_from(("audio/wav", "text/plain", None)))
        return Part(name, filename, content_type, draw(audio_payloads()))
    values = FIELD_VALUES.get(name, ("x",))
    value = draw(st.sampled_from(values) | st.text(max_size=12))
    return Part(name, None, None, value.encode("utf-8", "surrogatepass"))


def _body(boundary: str, form: list[Part]) -> bytes:
    chunks = []
    for part in form:
        disposition = f'form-data; name="{part.name}"'
        if part.filename is not None:
            disposition += f'; filename="{part.filename}"'
        head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
        if part.content_type is not None:
            head += f"Content-Type: {part.content_type}\r\n"
        chunks.append(head.encode() + b"\r\n" + part.payload + b"\r\n")
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks)


@dataclass(frozen=True, slots=True)
class Upload:
    """One generated request: its body, Content-Type and whether it is sent chunked."""

    body: bytes
    content_type: str | None
    chunked: bool


@st.composite
def uploads(draw: st.DrawFn) -> Upload:
    boundary = draw(BOUNDARY)
    form = [
        Part("file", "clip.wav", "audio/wav", draw(audio_payloads())),
        Part("model", None, None, MODEL.encode()),
    ]
    how = draw(st.sampled_from(("valid", "extended", "replaced")))
    if how == "extended":
        form = form + draw(st.lists(parts(), max_size=4))
    elif how == "replaced":
        form = draw(st.lists(parts(), max_size=5))
    body = _body(boundary, draw(st.permutations(form)))
    mutation = draw(st.sampled_from(("none", "none", "cut", "insert", "pad")))
    if mutation == "cut":
        body = body[: draw(st.integers(0, len(body)))]
    elif mutation == "insert":
        at = draw(st.integers(0, len(body)))
        body = body[:at] + draw(st.binary(min_size=1, max_size=64)) + body[at:]
    elif mutation == "pad":
        body += b"\0" * draw(st.integers(LIMIT - len(body), LIMIT + 4096))
    right = (
        f'multipart/form-data; boundary="{boundary}"'
        if draw(st.booleans())
        else f"multipart/form-data; boundary={boundary}"
    )
    content_type = draw(
        st.sampled_from(
            (
                # The right type most of the time, so that most bodies reach the form.
                right,
                right,
                right,
                right,
                "multipart/form-data",
                "multipart/form-data; boundary=other",
                "Multipart/Form-Data; charset=latin-9; boundary=" + boundary,
                "application/json",
                None,
            )
        )
    )
    return Upload(body, content_type, draw(st.booleans()))


@pytest.fixture(scope="module")
def recogniser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The recogniser exported once into a data folder of this module's own."""
    root = tmp_path_factory.mktemp("fuzz-transcribe-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_EDGE_DATA_DIR", str(root))
        export_missing_recognisers(PIPELINE, lambda line: None)
        yield root


@pytest.fixture
def served(recogniser: Path) -> Iterator[tuple[TestClient, PipelineRegistry]]:
    """The application serving the transcription pipeline (workers loaded once per test,
    before the test's private ``TMPDIR``: their own temporary folders live as long as they
    do), warmed up by one transcription."""
    registry = PipelineRegistry(
        [PIPELINE], topology=discover_topology(), selection=DeviceSelection()
    )
    try:
        app = ServeApp(registry, limits=ServeLimits(max_audio_bytes=LIMIT))
        with TestClient(app.asgi, base_url="http://127.0.0.1/v1") as client:
            warm = client.post(
                "/audio/transcriptions",
                data={"model": MODEL},
                files={"file": ("clip.wav", WAVS[0], "audio/wav")},
            )
            assert warm.status_code == 200, warm.text
            yield client, registry
    finally:
        registry.close()


def _settled(registry: PipelineRegistry) -> bool:
    status = registry.get(MODEL).status()
    return status.in_flight == 0 and status.state == "ready"


@settings(FUZZ, max_examples=EXAMPLES)
@given(upload=uploads())
def test_transcription_uploads(
    examples: Examples,
    served: tuple[TestClient, PipelineRegistry],
    private_tmpdir: Path,
    upload: Upload,
) -> None:
    client, registry = served
    census = Census.take(private_tmpdir)
    examples.count += 1
    headers = {} if upload.content_type is None else {"Content-Type": upload.content_type}
    body = upload.body
    content = iter([body[: len(body) // 2], body[len(body) // 2 :]]) if upload.chunked else body
    response = client.post("/audio/transcriptions", content=content, headers=headers)
    if response.status_code != 200:
        assert response.status_code in REFUSALS, response.text
        error = response.json()["error"]
        assert isinstance(error["code"], str), error
        assert error["code"]
        assert error["message"]
    deadline = time.monotonic() + 10
    while not _settled(registry):
        assert time.monotonic() < deadline, registry.get(MODEL).status()
        time.sleep(0.01)
    leaks = census.leaks(grace_s=2.0)
    assert not leaks.total, leaks.describe()
