"""The hello handshake: accepted, refused by version, feature, pid or generation, and late."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from runtime.contracts.codec import encode_frame
from runtime.contracts.messages import CancelMessage, HelloMessage
from runtime.contracts.versions import KNOWN_FEATURES, PROTOCOL_VERSION
from runtime.transport.channel import ChannelClosed, FramedChannel, ProtocolError
from runtime.transport.handshake import HandshakeError, expect_hello, send_hello

Pair = Callable[..., tuple[FramedChannel, FramedChannel]]


def hello(**changes: Any) -> HelloMessage:
    fields: dict[str, Any] = {
        "protocol_version": PROTOCOL_VERSION,
        "required_features": (),
        "offered_features": ("inline-buffers",),
        "worker": "graph",
        "pid": os.getpid(),
        "create_time": psutil.Process().create_time(),
        "generation": 5,
    }
    fields.update(changes)
    return HelloMessage(**fields)


def refusal(pair: Pair, message: HelloMessage, **expect: Any) -> HandshakeError:
    worker, controller = pair()
    worker.send_message(message)
    options: dict[str, Any] = {"expected_generation": 5, "expected_pid": os.getpid()}
    options.update(expect)
    with pytest.raises(HandshakeError) as info:
        expect_hello(controller, timeout_s=5, **options)
    assert isinstance(info.value, ProtocolError)
    return info.value


def test_good_hello(channel_pair: Pair) -> None:
    worker, controller = channel_pair()
    sent = send_hello(worker, worker="graph", generation=5)
    received = expect_hello(
        controller, expected_generation=5, expected_pid=os.getpid(), timeout_s=5
    )
    assert received == sent
    assert received.pid == os.getpid()
    assert received.create_time == psutil.Process().create_time()
    assert set(received.offered_features) == KNOWN_FEATURES
    assert received.negotiate().features == KNOWN_FEATURES


def test_launcher_pid_is_not_checked(channel_pair: Pair) -> None:
    worker, controller = channel_pair()
    worker.send_message(hello(pid=1))
    assert expect_hello(controller, expected_generation=5, expected_pid=None, timeout_s=5).pid == 1


def test_wrong_version(channel_pair: Pair) -> None:
    error = refusal(channel_pair, hello(protocol_version=PROTOCOL_VERSION + 1))
    assert error.code == "unsupported_version"
    assert f"version {PROTOCOL_VERSION + 1}" in str(error)


def test_unknown_required_feature_is_named(channel_pair: Pair) -> None:
    error = refusal(channel_pair, hello(required_features=("shm-buffers", "gpu-direct")))
    assert error.code == "unknown_required_feature"
    assert "gpu-direct" in str(error)
    assert "shm-buffers" in str(error)  # listed among what this side implements


def test_unknown_offered_feature_is_ignored(channel_pair: Pair) -> None:
    worker, controller = channel_pair()
    worker.send_message(hello(offered_features=("gpu-direct", "cancel")))
    received = expect_hello(
        controller, expected_generation=5, expected_pid=os.getpid(), timeout_s=5
    )
    assert received.negotiate().features == {"cancel"}


def test_wrong_generation(channel_pair: Pair) -> None:
    error = refusal(channel_pair, hello(generation=4))
    assert error.code == "wrong_generation"
    assert "generation 4; expected 5" in str(error)


def test_wrong_pid(channel_pair: Pair) -> None:
    error = refusal(channel_pair, hello(), expected_pid=os.getpid() + 1)
    assert error.code == "wrong_pid"


def test_timeout(channel_pair: Pair) -> None:
    _worker, controller = channel_pair()
    started = time.monotonic()
    with pytest.raises(HandshakeError) as info:
        expect_hello(controller, expected_generation=5, expected_pid=None, timeout_s=0.2)
    assert info.value.code == "timeout"
    assert 0.19 <= time.monotonic() - started < 5


def test_other_first_frame(channel_pair: Pair) -> None:
    worker, controller = channel_pair()
    worker.send_message(CancelMessage(1))
    with pytest.raises(HandshakeError) as info:
        expect_hello(controller, expected_generation=5, expected_pid=None, timeout_s=5)
    assert info.value.code == "unexpected_kind"


def test_malformed_hello(channel_pair: Pair) -> None:
    worker, controller = channel_pair()
    body = hello().to_body()
    del body["pid"]
    worker.send("hello", body)
    with pytest.raises(HandshakeError) as info:
        expect_hello(controller, expected_generation=5, expected_pid=None, timeout_s=5)
    assert info.value.code == "missing_field"
    assert "pid" in str(info.value)


def raw_controller(data: bytes) -> FramedChannel:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, data)
    os.close(write_fd)
    return FramedChannel(os.fdopen(read_fd, "rb"), open(os.devnull, "wb"), name="controller")


def test_garbage_before_hello() -> None:
    with raw_controller(b"Traceback (most recent call last):\n") as controller:
        with pytest.raises(HandshakeError) as info:
            expect_hello(controller, expected_generation=5, expected_pid=None, timeout_s=5)
    assert info.value.code == "bad_magic"


def test_worker_exits_before_hello(channel_pair: Pair) -> None:
    worker, controller = channel_pair()
    worker.close()
    with pytest.raises(ChannelClosed):
        expect_hello(controller, expected_generation=5, expected_pid=None, timeout_s=5)


def test_frame_level_version_mismatch() -> None:
    frame = encode_frame("hello", hello().to_body())
    assert frame.count(b'"v":1,') == 1
    with raw_controller(frame.replace(b'"v":1,', b'"v":9,')) as controller:
        with pytest.raises(HandshakeError) as info:
            expect_hello(controller, expected_generation=5, expected_pid=None, timeout_s=5)
    assert info.value.code == "unsupported_version"


def test_real_worker_process_hello(echo_worker: Callable[..., Any]) -> None:
    worker = echo_worker(generation=11)
    received = expect_hello(
        worker.channel, expected_generation=11, expected_pid=worker.process.pid, timeout_s=30
    )
    assert received.create_time == psutil.Process(worker.process.pid).create_time()
    worker.channel.close()
    assert worker.process.wait(timeout=30) == 0
