"""``POST /v1/audio/transcriptions`` on a real ``omni-edge serve``: the transcription
pipeline's two graph stages in worker processes, driven with the official ``openai`` client
(each response format, streaming) and with plain HTTP (the refusals, a client that leaves).

The server exports the recogniser on first use into a data folder of this module's own; the
reference transcript is the same pipeline's through the Python API on the same decoded audio.
"""

from __future__ import annotations

import io
import json
import re
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile
import soxr

from runtime.adapters.whisper import EXAMPLE_SENTENCE
from runtime.adapters.whisper_export import spoken_clips
from runtime.api import Omni
from runtime.audio.reader import read_audio
from runtime.config import load_pipeline
from runtime.devices import discover_topology
from runtime.devices.selection import DeviceSelection
from runtime.serve.limits import ServeLimits
from tests.runtime.serve.support import API_KEY, REPO, ServeProcess, wait_until

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

PIPELINE = REPO / "assets" / "pipelines" / "transcribe.yaml"
MODEL = "transcribe"
#: The clip's rate on the wire: the server resamples it to 16 kHz.
RATE = 22050
SECOND_SENTENCE = "Margaret Thompson flew from Chicago to Lisbon with her brother Daniel."
#: Times the clip is repeated for a request that runs long enough to be left (two windows).
LONG_REPEATS = 14
SRT_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d),(\d\d\d) --> (\d\d):(\d\d):(\d\d),(\d\d\d)$")
VTT_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d\d\d) --> (\d\d):(\d\d):(\d\d)\.(\d\d\d)$")


def _wav(audio: np.ndarray, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("transcribe-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_EDGE_DATA_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def clips() -> dict[str, bytes]:
    """The bundled voice saying two sentences, as 16-bit WAVs at 22.05 kHz."""
    spoken = spoken_clips([EXAMPLE_SENTENCE, SECOND_SENTENCE])
    pause = np.zeros(8000, np.float32)
    joined = np.concatenate([spoken[0], pause, spoken[1]])
    at_rate = np.asarray(soxr.resample(joined, 16000, RATE), np.float32)
    long = np.tile(np.concatenate([at_rate, np.zeros(RATE // 2, np.float32)]), LONG_REPEATS)
    return {"clip": _wav(at_rate), "long": _wav(long)}


@pytest.fixture(scope="module")
def server(data_dir: Path) -> Iterator[ServeProcess]:
    # The recogniser is exported by the server on first use, before the pipeline loads.
    process = ServeProcess(
        [PIPELINE],
        env={"OMNI_EDGE_DATA_DIR": str(data_dir)},
        start_timeout_s=400,
        # No server queue: a busy pipeline answers 429 at once (the busy test below).
        extra_args=("--max-queue", "0"),
    )
    try:
        yield process
    finally:
        workers = process.workers()
        status = process.stop()
        stderr = "\n".join(process.stderr)
        assert status == 130, stderr
        assert "stopped; every pipeline was closed" in stderr
        for pid, _ in workers:
            wait_until(lambda pid=pid: not _alive(pid), f"worker {pid} to exit", 10)
        assert not process.segments()


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def reference(server: ServeProcess, clips: dict[str, bytes]) -> str:
    """The pipeline's transcript of the clip through the Python API (the bundles the server
    exported), on the audio the server decodes from the same bytes."""
    audio = read_audio(io.BytesIO(clips["clip"]))
    config = load_pipeline(PIPELINE)
    with Omni(config, topology=discover_topology(), selection=DeviceSelection()) as omni:
        final = [o for o in omni.generate({"audio": audio, "sample_rate": 16000}) if o.finished]
    text = (final[0].text or "").strip()
    # The transcript is the sentences spoken, as the recogniser hears them.
    assert "quick brown fox" in text.lower()
    assert "lisbon" in text.lower()
    return text


@pytest.fixture
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0)


@pytest.fixture(autouse=True)
def settled(server: ServeProcess) -> Iterator[None]:
    """Each test leaves the pipeline ready, nothing in flight, the same number of workers
    and segments."""
    wait_until(lambda: _idle(server), "the pipeline to be ready and idle", 60)
    workers, segments = len(server.workers()), len(server.segments())
    yield
    wait_until(lambda: _idle(server), "the pipeline to be ready and idle", 60)
    wait_until(lambda: len(server.workers()) == workers, f"{workers} worker processes", 30)
    wait_until(lambda: len(server.segments()) == segments, f"{segments} segments", 30)


def _idle(server: ServeProcess) -> bool:
    return all(
        entry["state"] == "ready" and entry["in_flight"] == 0
        for entry in server.pipelines().values()
    )


def _seconds(match: re.Match[str], first: int) -> float:
    hours, minutes, secs, millis = (int(match.group(first + i)) for i in range(4))
    return hours * 3600 + minutes * 60 + secs + millis / 1000


def _cues(text: str, pattern: re.Pattern[str]) -> list[tuple[float, float, str]]:
    lines = text.splitlines()
    cues = []
    for index, line in enumerate(lines):
        match = pattern.match(line)
        if match:
            cues.append((_seconds(match, 1), _seconds(match, 5), lines[index + 1]))
    return cues


# -- the answers ---------------------------------------------------------------------------


def test_models_lists_the_transcription_pipeline(client: openai.OpenAI) -> None:
    models = {model.id: model for model in client.models.list()}
    assert getattr(models[MODEL], "kind", None) == "transcription"


def test_json_gives_the_pipelines_transcript(
    client: openai.OpenAI, clips: dict[str, bytes], reference: str
) -> None:
    result = client.audio.transcriptions.create(
        model=MODEL, file=("clip.wav", clips["clip"]), language="en"
    )
    assert result.text == reference


def test_text_gives_the_transcript_as_plain_text(
    client: openai.OpenAI, clips: dict[str, bytes], reference: str
) -> None:
    text = client.audio.transcriptions.create(
        model=MODEL, file=("clip.wav", clips["clip"]), response_format="text"
    )
    assert text == reference + "\n"


def test_verbose_json_has_the_language_duration_and_segments(
    client: openai.OpenAI, clips: dict[str, bytes], reference: str
) -> None:
    result = client.audio.transcriptions.create(
        model=MODEL,
        file=("clip.wav", clips["clip"]),
        response_format="verbose_json",
        timestamp_granularities=["segment"],
    )
    assert result.text == reference
    assert result.language == "english"
    seconds = soundfile.info(io.BytesIO(clips["clip"])).duration
    assert result.duration == pytest.approx(seconds, abs=0.02)
    assert result.segments
    assert [segment.id for segment in result.segments] == list(range(len(result.segments)))
    assert "".join(segment.text for segment in result.segments).strip() == reference
    for segment in result.segments:
        assert 0 <= segment.start < segment.end <= seconds + 0.02


def test_srt_and_vtt_time_each_segment(
    client: openai.OpenAI, clips: dict[str, bytes], reference: str
) -> None:
    seconds = soundfile.info(io.BytesIO(clips["clip"])).duration
    srt = client.audio.transcriptions.create(
        model=MODEL, file=("clip.wav", clips["clip"]), response_format="srt"
    )
    assert srt.startswith("1\n")
    vtt = client.audio.transcriptions.create(
        model=MODEL, file=("clip.wav", clips["clip"]), response_format="vtt"
    )
    assert vtt.startswith("WEBVTT\n\n")
    for cues in (_cues(srt, SRT_TIME), _cues(vtt, VTT_TIME)):
        assert cues
        assert " ".join(text for _, _, text in cues) == reference
        for start, end, _ in cues:
            assert 0 <= start < end <= seconds + 0.02
    assert [cue[:2] for cue in _cues(srt, SRT_TIME)] == [cue[:2] for cue in _cues(vtt, VTT_TIME)]


def test_streaming_sends_deltas_then_done(
    client: openai.OpenAI, clips: dict[str, bytes], reference: str
) -> None:
    stream = client.audio.transcriptions.create(
        model=MODEL, file=("clip.wav", clips["clip"]), stream=True
    )
    events = list(stream)
    assert [event.type for event in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert len(events) >= 2
    done = events[-1]
    assert done.type == "transcript.text.done"
    assert done.text == reference
    assert "".join(event.delta for event in events[:-1]) == reference


# -- refusals ------------------------------------------------------------------------------


def test_an_oversized_file_is_a_413_naming_the_limit(client: openai.OpenAI) -> None:
    limit = ServeLimits().max_audio_bytes
    with pytest.raises(openai.APIStatusError) as refused:
        client.audio.transcriptions.create(model=MODEL, file=("big.wav", b"\0" * (limit + 1)))
    assert refused.value.status_code == 413
    assert f"accepted: at most {limit}" in refused.value.message


def test_a_file_that_is_not_audio_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.transcriptions.create(model=MODEL, file=("notes.txt", b"plain words\n" * 50))
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["param"] == "file"
    assert error["code"] == "not_audio"
    assert "'notes.txt'" in error["message"]
    assert "accepted: audio files libsndfile reads" in error["message"]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"language": "fr"}, "language", "'language' is 'fr'; accepted: en or empty"),
        ({"prompt": "Names: Stella."}, "prompt", "the recogniser takes no initial prompt"),
        ({"response_format": "tsv"}, "response_format", "accepted: json, text, verbose_json"),
        ({"temperature": "0.4"}, "temperature", "accepted: 0"),
        ({"stream": "true", "response_format": "srt"}, "stream", "accepted: a stream with json"),
        ({"speaker": "me"}, "speaker", "unknown field 'speaker'"),
    ],
)
def test_bad_fields_are_400s_naming_the_field(
    server: ServeProcess,
    clips: dict[str, bytes],
    fields: dict[str, str],
    param: str,
    words: str,
) -> None:
    with server.client() as http:
        response = http.post(
            "/audio/transcriptions",
            data={"model": MODEL, **fields},
            files={"file": ("clip.wav", clips["clip"], "audio/wav")},
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert words in error["message"]


def test_missing_fields_and_other_bodies_are_400s(
    server: ServeProcess, clips: dict[str, bytes]
) -> None:
    with server.client() as http:
        # httpx sends a form without files url-encoded: named as not multipart.
        response = http.post("/audio/transcriptions", data={"model": MODEL})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_content_type"
        assert "accepted: multipart/form-data" in response.json()["error"]["message"]
        response = http.post("/audio/transcriptions", files={"model": (None, MODEL)})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "file"
        assert response.json()["error"]["code"] == "missing_field"
        response = http.post(
            "/audio/transcriptions", files={"file": ("clip.wav", clips["clip"], "audio/wav")}
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "model"
        assert response.json()["error"]["code"] == "missing_field"
        response = http.post(
            "/audio/transcriptions",
            files={"model": (None, MODEL), "file": (None, "not a file part")},
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "file"
        assert "the field 'file' is text" in response.json()["error"]["message"]
        response = http.post(
            "/audio/transcriptions",
            data={"model": MODEL},
            files={"file": ("empty.wav", b"", "audio/wav")},
        )
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "empty"
        response = http.post(
            "/audio/transcriptions",
            content=b"--x\r\nnot a part",
            headers={"Content-Type": "multipart/form-data"},
        )
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_multipart"
        response = http.post(
            "/audio/transcriptions",
            data={"model": "nope"},
            files={"file": ("clip.wav", clips["clip"], "audio/wav")},
        )
        assert response.status_code == 404
        assert "served: transcribe" in response.json()["error"]["message"]


# -- busy and disconnected -----------------------------------------------------------------


def _multipart(fields: dict[str, str], wav: bytes) -> tuple[bytes, str]:
    request = httpx.Request(
        "POST", "http://x/", data=fields, files={"file": ("long.wav", wav, "audio/wav")}
    )
    return request.read(), request.headers["content-type"]


def test_a_busy_pipeline_is_a_429_and_a_client_leaving_cancels_its_request(
    server: ServeProcess, clips: dict[str, bytes]
) -> None:
    from tests.runtime.serve.test_serve_http import RawPost

    before = server.pipelines()[MODEL]["finished"]
    body, content_type = _multipart({"model": MODEL}, clips["long"])
    raw = RawPost(server, "/audio/transcriptions", body, content_type)
    try:
        wait_until(lambda: server.pipelines()[MODEL]["in_flight"] == 1, "the request to run")
        with server.client() as http:
            response = http.post(
                "/audio/transcriptions",
                data={"model": MODEL},
                files={"file": ("clip.wav", clips["clip"], "audio/wav")},
            )
        assert response.status_code == 429, response.text
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["code"] == "pipeline_busy"
    finally:
        raw.leave()
    wait_until(lambda: server.pipelines()[MODEL]["in_flight"] == 0, "the request to end", 10)
    finished = server.pipelines()[MODEL]["finished"]
    assert finished["cancelled"] == before["cancelled"] + 1, finished
    assert finished["completed"] == before["completed"]


def test_a_client_leaving_a_stream_cancels_it(
    server: ServeProcess, clips: dict[str, bytes]
) -> None:
    from tests.runtime.serve.test_serve_http import RawPost

    before = server.pipelines()[MODEL]["finished"]
    body, content_type = _multipart({"model": MODEL, "stream": "true"}, clips["long"])
    raw = RawPost(server, "/audio/transcriptions", body, content_type)
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 4096:
        head += raw.read(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"text/event-stream" in head
    wait_until(lambda: server.pipelines()[MODEL]["in_flight"] == 1, "the request to run")
    raw.leave()
    wait_until(lambda: server.pipelines()[MODEL]["in_flight"] == 0, "the request to end", 10)
    finished = server.pipelines()[MODEL]["finished"]
    assert finished["cancelled"] == before["cancelled"] + 1, finished


def test_a_client_leaving_mid_upload_leaves_nothing(
    server: ServeProcess, clips: dict[str, bytes]
) -> None:
    import psutil

    from tests.runtime.serve.test_serve_http import API_KEY as KEY

    process = psutil.Process(server.pid)
    body, content_type = _multipart({"model": MODEL}, clips["long"])
    fds = process.num_fds()
    url = httpx.URL(server.url)
    sock = socket.create_connection((url.host, url.port), timeout=60)
    head = (
        f"POST {url.path}/audio/transcriptions HTTP/1.1\r\nHost: {url.host}\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    # More than the 1 MiB the parser keeps in memory: the upload is spooled to a file.
    sock.sendall(head.encode() + body[: len(body) // 2])
    time.sleep(0.5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    wait_until(lambda: process.num_fds() <= fds, f"the server's descriptors back to {fds}", 10)
    # The disconnect is an ordinary end of a request, not an error of the application.
    assert not [line for line in server.stderr if "Traceback" in line], "\n".join(server.stderr)
    assert server.pipelines()[MODEL]["in_flight"] == 0
    with server.client() as http:
        response = http.post(
            "/audio/transcriptions",
            data={"model": MODEL, "response_format": "text"},
            files={"file": ("clip.wav", clips["clip"], "audio/wav")},
        )
    assert response.status_code == 200, response.text


def test_the_sse_body_is_openais_shape(server: ServeProcess, clips: dict[str, bytes]) -> None:
    with (
        server.client() as http,
        http.stream(
            "POST",
            "/audio/transcriptions",
            data={"model": MODEL, "stream": "true"},
            files={"file": ("clip.wav", clips["clip"], "audio/wav")},
        ) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    documents = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert all(line.startswith("data: ") for line in lines)
    assert set(documents[0]) == {"type", "delta"}
    assert set(documents[-1]) == {"type", "text"}
