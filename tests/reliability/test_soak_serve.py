"""The server's soak: 8 clients of one ``omni-edge serve`` for 10 minutes, with random
disconnects.

One server serves the text assistant (``chat``), the voice (``speak``), the speech
recogniser (``transcribe``), the embedding pipeline (``embed``) and the spoken conversation
(``voice-chat``, over ``/v1/realtime``). Eight client threads loop until the time is up, each
request picking an endpoint at random: a chat completion (streamed or not), speech (streamed
PCM), a transcription of a spoken clip, embeddings, or a realtime turn (the clip's audio at
24 kHz, then silence, until ``response.done``). About a fifth of the requests are cut off by
their client at a random point (a stream closed early, a socket closed mid-turn).

Every answer must be a 200 (or a realtime ``response.done``) or a typed refusal the server
declares (429 when its queue is full, none expected at the default queue; a realtime
connection beyond the conversation's slots is refused with ``pipeline_busy``); nothing may
fail, and no pipeline restarts (a client that leaves stops its request between stage calls). At the end nothing is in flight or queued, the server's resident memory grew by at most
:data:`RSS_GROWTH_LIMIT` from the first minute's end to the last, and once it stops no worker
process and no shared-memory segment of it is left.

``OMNI_SERVE_SOAK_S`` sets the duration (``benchmarks/reliability.py`` passes it).
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import soundfile
import soxr
from websockets.sync.client import connect

from tests.reliability.support import record
from tests.runtime.serve.support import ServeProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
PIPELINES = REPO / "assets" / "pipelines"
SERVED = ("chat", "speak", "transcribe", "embed", "voice-chat")
DURATION_S = float(os.environ.get("OMNI_SERVE_SOAK_S") or 600)
CLIENTS = 8
SEED = 20261207
DISCONNECT_FRACTION = 0.2
#: Share of requests per endpoint.
MIX = {"chat": 0.3, "speech": 0.25, "transcription": 0.15, "embeddings": 0.15, "realtime": 0.15}
#: The controller's growth allowed from the end of the first minute to the end.
RSS_GROWTH_LIMIT = 30 << 20
WARM_S = 60.0
SENTENCES = ("What is the capital of France?", "Tell me a short joke.", "Name a colour.")
REALTIME_RATE = 24_000
REQUEST_TIMEOUT_S = 120.0


class Soak:
    """What the clients share: the server, the clips, the counts and the failures."""

    def __init__(self, server: ServeProcess, clips: list[bytes]) -> None:
        self.server = server
        self.clips = clips
        self.pcm24 = [_pcm24(clip) for clip in clips]
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.deadline = time.monotonic() + DURATION_S

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)


def _pcm24(wav: bytes) -> bytes:
    audio, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    resampled = soxr.resample(audio, rate, REALTIME_RATE)
    pcm = (np.clip(resampled, -1, 1) * 32767).astype("<i2")
    return pcm.tobytes()


def _chat(soak: Soak, client: httpx.Client, rng: random.Random, cut: bool) -> int:
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": rng.choice(SENTENCES)}],
        "max_tokens": rng.choice((8, 16, 32)),
        "stream": cut or rng.random() < 0.5,
    }
    with client.stream("POST", "/chat/completions", json=body) as response:
        if response.status_code != 200 or not cut:
            response.read()
            return response.status_code
        for _ in response.iter_bytes():
            if rng.random() < 0.5:
                break
        return response.status_code


def _speech(soak: Soak, client: httpx.Client, rng: random.Random, cut: bool) -> int:
    body = {"model": "speak", "input": rng.choice(SENTENCES), "response_format": "pcm"}
    with client.stream("POST", "/audio/speech", json=body) as response:
        if response.status_code == 200:
            for _ in response.iter_bytes():
                if cut and rng.random() < 0.3:
                    break
        else:
            response.read()
        return response.status_code


def _transcription(soak: Soak, client: httpx.Client, rng: random.Random, cut: bool) -> int:
    files = {"file": ("clip.wav", rng.choice(soak.clips), "audio/wav")}
    # A client cutting off gives up long before the answer comes.
    timeout = 0.05 if cut else REQUEST_TIMEOUT_S
    try:
        response = client.post(
            "/audio/transcriptions", data={"model": "transcribe"}, files=files, timeout=timeout
        )
    except httpx.TimeoutException:
        if cut:
            return 0
        raise
    return response.status_code


def _embeddings(soak: Soak, client: httpx.Client, rng: random.Random, cut: bool) -> int:
    texts = rng.sample(SENTENCES, rng.randint(1, len(SENTENCES)))
    response = client.post("/embeddings", json={"model": "embed", "input": texts})
    if response.status_code == 200:
        assert len(response.json()["data"]) == len(texts)
    return response.status_code


def _realtime(soak: Soak, client: httpx.Client, rng: random.Random, cut: bool) -> int:
    url = soak.server.url.replace("http://", "ws://") + "/realtime?model=voice-chat"
    pcm = rng.choice(soak.pcm24) + bytes(2 * REALTIME_RATE)
    chunk = 2 * REALTIME_RATE // 10
    cut_at = rng.randrange(0, len(pcm), chunk) if cut else None
    with connect(
        url, additional_headers=soak.server.headers(), open_timeout=30, close_timeout=5
    ) as socket:
        first = json.loads(socket.recv(timeout=30))
        if first["type"] == "error" and first["error"]["code"] == "pipeline_busy":
            # Every conversation slot is taken: a declared refusal (close code 1013).
            return 429
        assert first["type"] == "session.created", first
        for start in range(0, len(pcm), chunk):
            if cut_at is not None and start >= cut_at:
                return 0
            event = {
                "type": "input_audio_buffer.append",
                "audio": base64.b64encode(pcm[start : start + chunk]).decode(),
            }
            socket.send(json.dumps(event))
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while time.monotonic() < deadline:
            event = json.loads(socket.recv(timeout=REQUEST_TIMEOUT_S))
            if event["type"] == "error":
                soak.fail(f"realtime error event: {event}")
                return 500
            if event["type"] == "response.done":
                return 200
            if cut and rng.random() < 0.05:
                return 0
    soak.fail("realtime: no response.done within the timeout")
    return 500


KINDS = {
    "chat": _chat,
    "speech": _speech,
    "transcription": _transcription,
    "embeddings": _embeddings,
    "realtime": _realtime,
}


def _client_loop(soak: Soak, number: int) -> None:
    try:
        _requests(soak, number)
    except BaseException as exc:
        soak.fail(f"client {number} stopped: {type(exc).__name__}: {exc}")
        raise


def _requests(soak: Soak, number: int) -> None:
    rng = random.Random(SEED + number)
    names, weights = zip(*MIX.items(), strict=True)
    server = soak.server
    with httpx.Client(
        base_url=server.url, headers=server.headers(), timeout=REQUEST_TIMEOUT_S
    ) as client:
        while time.monotonic() < soak.deadline:
            kind = rng.choices(names, weights)[0]
            cut = rng.random() < DISCONNECT_FRACTION
            try:
                status = KINDS[kind](soak, client, rng, cut)
            except Exception as exc:  # every failure is reported at the end
                soak.fail(f"client {number} {kind}: {type(exc).__name__}: {exc}")
                continue
            soak.count("requests")
            soak.count(f"{kind}:{'cut' if cut else status}")
            if status == 429:
                soak.count("429" if kind != "realtime" else "realtime_busy")
            elif status not in (0, 200):
                soak.fail(f"client {number} {kind}: status {status}")


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def _tree_rss(pid: int) -> int:
    root = psutil.Process(pid)
    total = root.memory_info().rss
    for child in root.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            continue
    return total


def test_eight_mixed_clients_with_random_disconnects_leave_nothing(smollm2_model: Path) -> None:
    server = ServeProcess([PIPELINES / f"{name}.yaml" for name in SERVED], start_timeout_s=900.0)
    try:
        with server.client() as client:
            clips = []
            for sentence in SENTENCES:
                response = client.post(
                    "/audio/speech",
                    json={"model": "speak", "input": sentence, "response_format": "wav"},
                )
                assert response.status_code == 200, response.text
                clips.append(response.content)
        soak = Soak(server, clips)
        workers_at_start = server.workers()
        threads = [
            threading.Thread(target=_client_loop, args=(soak, n), daemon=True)
            for n in range(CLIENTS)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(min(WARM_S, DURATION_S / 2))
        rss_start, tree_start = _rss(server.pid), _tree_rss(server.pid)
        samples = [[round(time.monotonic() - started), rss_start >> 20]]
        while any(thread.is_alive() for thread in threads):
            time.sleep(10)
            samples.append([round(time.monotonic() - started), _rss(server.pid) >> 20])
        for thread in threads:
            thread.join(REQUEST_TIMEOUT_S)
        settled = wait_until(
            lambda: all(
                entry["in_flight"] == 0 and entry.get("queued", 0) == 0
                for entry in server.pipelines().values()
            ),
            "every request wound up",
        )
        rss_end, tree_end = _rss(server.pid), _tree_rss(server.pid)
        workers = server.workers()
        segments_before_stop = server.segments()
    finally:
        status = server.stop()
    left = [pid for pid, _ in workers if psutil.pid_exists(pid)]
    segments = server.segments()
    entry = record(
        "serve_soak",
        duration_s=round(time.monotonic() - started, 1),
        clients=CLIENTS,
        requests=soak.counts["requests"],
        per_kind={key: value for key, value in soak.counts.items() if ":" in key},
        declared_429=soak.counts["429"],
        realtime_busy=soak.counts["realtime_busy"],
        rss_start_bytes=rss_start,
        rss_end_bytes=rss_end,
        rss_growth_bytes=rss_end - rss_start,
        tree_rss_start_bytes=tree_start,
        tree_rss_end_bytes=tree_end,
        rss_mib_at=samples,
        segments_while_serving=len(segments_before_stop),
        workers_replaced=len(workers_at_start - workers),
        leaks={"processes": len(left), "shm": len(segments)},
        failures=soak.failures[:20],
        exit_status=status,
        passed=False,
    )
    print({key: value for key, value in entry.items() if key != "rss_mib_at"})
    assert settled
    assert not soak.failures, soak.failures[:5]
    assert soak.counts["requests"] > CLIENTS
    assert status == 130, "\n".join(server.stderr)
    assert workers == workers_at_start, "a pipeline was recreated during the soak"
    assert not left, f"worker processes left: {left}"
    assert not segments, f"shared memory left: {sorted(segments)}"
    assert rss_end - rss_start <= RSS_GROWTH_LIMIT, samples
    entry["passed"] = True


from tests.runtime.vllm.conftest import smollm2_model, vllm_env  # noqa: E402

__all__ = ["smollm2_model", "vllm_env"]
