"""The graph-worker protocol messages: exact round trips and every refusal."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.contracts.buffers import BufferDescriptor, DType
from runtime.contracts.codec import decode_frame, encode_frame
from runtime.contracts.ep_device import AppliedDevice, EpDeviceRequest
from runtime.contracts.messages import (
    CONTROLLER_TO_WORKER,
    MESSAGE_ERROR_CODES,
    MESSAGE_TYPES,
    WORKER_TO_CONTROLLER,
    AckMessage,
    ByeMessage,
    CallMessage,
    CancelMessage,
    ErrorMessage,
    HelloMessage,
    LoadMessage,
    Message,
    MessageError,
    ReadyMessage,
    ResultMessage,
    ShutdownMessage,
    TensorSpec,
    decode_message,
)
from runtime.contracts.versions import KNOWN_FEATURES, PROTOCOL_VERSION, FeatureError

CPU = "CPUExecutionProvider"


def sample_messages() -> list[Message]:
    return [
        LoadMessage(
            manifest_path="/bundles/voice/manifest.json",
            expected_identity="sha256:" + "ab" * 32,
            providers=(CPU,),
            allowed_providers=(CPU,),
            target_provider=CPU,
            max_io_bytes=8 << 20,
            min_fraction_on_target=1.0,
            shm_prefix="oe-100-1-0a0b0c0d-",
        ),
        CallMessage(call_id=7, request_id="req-1", epoch=2, input_names=("input", "scales")),
        CancelMessage(call_id=7),
        AckMessage(owner="worker", generation=12),
        ShutdownMessage(),
        HelloMessage(
            protocol_version=PROTOCOL_VERSION,
            required_features=("inline-buffers",),
            offered_features=tuple(sorted(KNOWN_FEATURES)),
            worker="ort-graph",
            pid=4242,
            create_time=1_790_000_000.25,
            generation=3,
        ),
        ReadyMessage(
            placement={CPU: 2750, "DmlExecutionProvider": 5},
            total_nodes=2755,
            placement_method="assignment_info",
            inputs=(
                TensorSpec("input", DType.INT64, (1, "n")),
                TensorSpec("scales", DType.FLOAT32, (3,)),
            ),
            outputs=(TensorSpec("output", DType.FLOAT32, (1, 1, 1, None)),),
            load_s=0.5,
            warmup_s=0.25,
            rss_bytes=123_456_789,
        ),
        ResultMessage(call_id=7, request_id="req-1", epoch=2, output_names=("output",), run_s=0.03),
        ErrorMessage(call_id=7, code="model_error", message="Got invalid dimensions", fatal=False),
        ErrorMessage(call_id=None, code="load_failed", message="", fatal=True),
        ByeMessage(),
        LoadMessage(
            manifest_path="/bundles/add/manifest.json",
            expected_identity="sha256:" + "cd" * 32,
            providers=("DmlExecutionProvider", CPU),
            allowed_providers=("DmlExecutionProvider", CPU),
            target_provider="DmlExecutionProvider",
            max_io_bytes=1 << 20,
            min_fraction_on_target=1.0,
            shm_prefix=None,
            device=EpDeviceRequest(
                "LUID-00000000-0000F2A1", "gpu", 0x1002, 0x150E, luid="LUID-00000000-0000F2A1"
            ),
            provider_options={"device_id": "1"},
            ep_library="C:\\plugins\\onnxruntime_providers_dml.dll",
        ),
        ReadyMessage(
            placement={"DmlExecutionProvider": 1},
            total_nodes=1,
            placement_method="assignment_info",
            inputs=(TensorSpec("a", DType.FLOAT32, (4,)),),
            outputs=(TensorSpec("b", DType.FLOAT32, (4,)),),
            load_s=0.5,
            warmup_s=0.25,
            rss_bytes=1,
            device=AppliedDevice(
                method="ep_device",
                ep_name="DmlExecutionProvider",
                type="gpu",
                vendor="AMD",
                vendor_id=0x1002,
                device_id=0x150E,
                provider_options={"device_id": "1"},
            ),
        ),
    ]


def frame_for(message: Message) -> bytes:
    buffers = [
        (BufferDescriptor.for_array("controller", 1, DType.FLOAT32, (2,)), bytes(8))
        for _ in message.buffer_names
    ]
    return encode_frame(message.KIND, message.to_body(), buffers)


@pytest.mark.parametrize("message", sample_messages(), ids=lambda m: m.KIND)
def test_round_trip_through_json_and_frames(message: Message) -> None:
    body = json.loads(json.dumps(message.to_body()))
    assert type(message).from_body(body) == message
    decoded = decode_message(decode_frame(frame_for(message)))
    assert decoded == message
    assert type(decoded) is type(message)


def test_every_kind_has_one_direction_or_is_ack() -> None:
    assert set(MESSAGE_TYPES) == CONTROLLER_TO_WORKER | WORKER_TO_CONTROLLER
    assert CONTROLLER_TO_WORKER & WORKER_TO_CONTROLLER == {"ack"}
    assert {type(m).KIND for m in sample_messages()} == set(MESSAGE_TYPES)


def test_lists_become_tuples_and_ints_become_floats() -> None:
    call = CallMessage(call_id=1, request_id="r", epoch=0, input_names=["a", "b"])  # type: ignore[arg-type]
    assert call.input_names == ("a", "b")
    result = ResultMessage(1, "r", 0, (), run_s=1)
    assert isinstance(result.run_s, float)
    assert result.to_body()["output_names"] == []


def test_unknown_kind() -> None:
    frame = decode_frame(encode_frame("launch", {}))
    with pytest.raises(MessageError) as info:
        decode_message(frame)
    assert info.value.code == "unknown_kind"
    assert "'launch'" in str(info.value)
    assert "hello" in str(info.value)


def test_wrong_direction_is_refused() -> None:
    frame = decode_frame(encode_frame("hello", sample_messages()[5].to_body()))
    with pytest.raises(MessageError) as info:
        decode_message(frame, CONTROLLER_TO_WORKER)
    assert info.value.code == "unexpected_kind"
    assert isinstance(decode_message(frame, WORKER_TO_CONTROLLER), HelloMessage)


@pytest.mark.parametrize(
    ("kind", "body", "buffers"),
    [
        ("call", {"call_id": 1, "request_id": "r", "epoch": 0, "input_names": ["a"]}, 0),
        ("call", {"call_id": 1, "request_id": "r", "epoch": 0, "input_names": []}, 1),
        (
            "result",
            {"call_id": 1, "request_id": "r", "epoch": 0, "output_names": [], "run_s": 0},
            2,
        ),
        ("cancel", {"call_id": 1}, 1),
    ],
)
def test_buffer_count_must_match_names(kind: str, body: dict[str, Any], buffers: int) -> None:
    parts = [(BufferDescriptor.for_array("c", 0, DType.UINT8, (1,)), b"x")] * buffers
    frame = decode_frame(encode_frame(kind, body, parts))
    with pytest.raises(MessageError) as info:
        decode_message(frame)
    assert info.value.code == "buffer_count"


def test_body_must_be_an_object() -> None:
    with pytest.raises(MessageError) as info:
        CancelMessage.from_body([1])
    assert info.value.code == "bad_body"


def test_missing_and_unknown_fields_are_named() -> None:
    with pytest.raises(MessageError) as info:
        CallMessage.from_body({"call_id": 1, "request_id": "r", "epoch": 0})
    assert info.value.code == "missing_field"
    assert "input_names" in str(info.value)
    with pytest.raises(MessageError) as info:
        AckMessage.from_body({"owner": "w", "generation": 1, "extra": True})
    assert info.value.code == "unknown_field"
    assert "extra" in str(info.value)
    assert "generation" in str(info.value)
    with pytest.raises(MessageError) as info:
        ErrorMessage.from_body({"code": "x", "message": "", "fatal": False})
    assert info.value.code == "missing_field"
    assert "call_id" in str(info.value)


def _replace(original: Message, /, **changes: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(original.to_body()))
    body.update(changes)
    return body


LOAD, CALL, CANCEL, ACK, _, HELLO, READY, RESULT, ERROR, *_rest = sample_messages()
LOAD_ON_DEVICE, READY_ON_DEVICE = _rest[-2:]


@pytest.mark.parametrize(
    ("message", "changes", "field"),
    [
        (LOAD, {"manifest_path": ""}, "load.manifest_path"),
        (LOAD, {"expected_identity": 5}, "load.expected_identity"),
        (LOAD, {"providers": []}, "load.providers"),
        (LOAD, {"providers": "CPUExecutionProvider"}, "load.providers"),
        (LOAD, {"providers": [CPU, CPU]}, "load.providers"),
        (LOAD, {"allowed_providers": [""]}, "load.allowed_providers"),
        (LOAD, {"target_provider": "CUDAExecutionProvider"}, "load.target_provider"),
        (LOAD, {"providers": [CPU, "X"], "target_provider": "X"}, "load.target_provider"),
        (LOAD, {"max_io_bytes": 0}, "load.max_io_bytes"),
        (LOAD, {"max_io_bytes": 1.5}, "load.max_io_bytes"),
        (LOAD, {"min_fraction_on_target": 1.01}, "load.min_fraction_on_target"),
        (LOAD, {"min_fraction_on_target": -0.1}, "load.min_fraction_on_target"),
        (LOAD, {"min_fraction_on_target": True}, "load.min_fraction_on_target"),
        (LOAD, {"shm_prefix": ""}, "load.shm_prefix"),
        (LOAD_ON_DEVICE, {"device": {"physical_id": "x"}}, "load.device"),
        (
            LOAD_ON_DEVICE,
            {"device": {"physical_id": "x", "type": "tpu", "vendor_id": 1, "device_id": 2}},
            "load.device: device.type",
        ),
        (
            LOAD_ON_DEVICE,
            {"device": {"physical_id": "x", "type": "gpu", "vendor_id": -1, "device_id": 2}},
            "device.vendor_id",
        ),
        (
            LOAD_ON_DEVICE,
            {
                "device": {
                    "physical_id": "x",
                    "type": "gpu",
                    "vendor_id": 1,
                    "device_id": 2,
                    "pci_bus_id": "slot-3",
                }
            },
            "device.pci_bus_id",
        ),
        (LOAD_ON_DEVICE, {"provider_options": {"device_id": 1}}, "load.provider_options"),
        (LOAD_ON_DEVICE, {"ep_library": ""}, "load.ep_library"),
        (READY_ON_DEVICE, {"device": {"method": "guess"}}, "ready.device"),
        (CALL, {"call_id": -1}, "call.call_id"),
        (CALL, {"call_id": True}, "call.call_id"),
        (CALL, {"request_id": ""}, "call.request_id"),
        (CALL, {"epoch": "0"}, "call.epoch"),
        (CALL, {"input_names": ["a", "a"]}, "call.input_names"),
        (CALL, {"input_names": ["a", 3]}, "call.input_names"),
        (CANCEL, {"call_id": None}, "cancel.call_id"),
        (ACK, {"owner": ""}, "ack.owner"),
        (ACK, {"generation": -3}, "ack.generation"),
        (HELLO, {"protocol_version": -1}, "hello.protocol_version"),
        (HELLO, {"required_features": "shm-buffers"}, "hello.required_features"),
        (HELLO, {"offered_features": [""]}, "hello.offered_features"),
        (HELLO, {"worker": None}, "hello.worker"),
        (HELLO, {"pid": 0}, "hello.pid"),
        (HELLO, {"create_time": -1.0}, "hello.create_time"),
        (HELLO, {"create_time": "now"}, "hello.create_time"),
        (HELLO, {"generation": 1.0}, "hello.generation"),
        (READY, {"placement": [CPU]}, "ready.placement"),
        (READY, {"placement": {CPU: -1}}, "ready.placement['CPUExecutionProvider']"),
        (READY, {"placement": {"": 1}}, "ready.placement"),
        (READY, {"placement": {CPU: 2756}}, "ready.placement"),
        (READY, {"total_nodes": -1}, "ready.total_nodes"),
        (READY, {"placement_method": "guess"}, "ready.placement_method"),
        (READY, {"inputs": {"name": "x"}}, "ready.inputs"),
        (READY, {"inputs": [{"name": "x", "dtype": "float32"}]}, "ready.inputs"),
        (READY, {"inputs": [{"name": "x", "dtype": "complex64", "shape": []}]}, "ready.inputs"),
        (READY, {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1]}]}, "tensor.x.shape"),
        (READY, {"inputs": [{"name": "x", "dtype": "float32", "shape": [""]}]}, "tensor.x.shape"),
        (READY, {"inputs": [{"name": "", "dtype": "float32", "shape": []}]}, "tensor.name"),
        (
            READY,
            {"outputs": [{"name": "y", "dtype": "int8", "shape": []}] * 2},
            "ready.outputs",
        ),
        (READY, {"load_s": -0.5}, "ready.load_s"),
        (READY, {"warmup_s": None}, "ready.warmup_s"),
        (READY, {"rss_bytes": 1.5}, "ready.rss_bytes"),
        (RESULT, {"run_s": -1}, "result.run_s"),
        (RESULT, {"output_names": None}, "result.output_names"),
        (ERROR, {"call_id": "7"}, "error.call_id"),
        (ERROR, {"code": ""}, "error.code"),
        (ERROR, {"message": None}, "error.message"),
        (ERROR, {"fatal": 0}, "error.fatal"),
    ],
)
def test_bad_fields_are_named(message: Message, changes: dict[str, Any], field: str) -> None:
    with pytest.raises(MessageError) as info:
        type(message).from_body(_replace(message, **changes))
    assert info.value.code == "bad_field"
    assert field in str(info.value)
    assert "expected" in str(info.value) or "accepted" in str(info.value)


def test_a_peer_without_the_device_fields_is_still_understood() -> None:
    body = LOAD_ON_DEVICE.to_body()
    for name in ("device", "provider_options", "ep_library"):
        del body[name]
    older = LoadMessage.from_body(body)
    assert older.device is None
    assert dict(older.provider_options) == {}
    ready = READY_ON_DEVICE.to_body()
    del ready["device"]
    assert ReadyMessage.from_body(ready).device is None


def test_bad_dtype_lists_the_accepted_ones() -> None:
    body = _replace(READY, inputs=[{"name": "x", "dtype": "complex64", "shape": []}])
    with pytest.raises(MessageError) as info:
        ReadyMessage.from_body(body)
    assert "float16" in str(info.value)
    assert "complex64" in str(info.value)


def test_constructors_validate_too() -> None:
    with pytest.raises(MessageError, match=r"hello\.create_time"):
        HelloMessage(PROTOCOL_VERSION, (), (), "w", 1, math.nan, 0)
    with pytest.raises(MessageError, match=r"ready\.inputs"):
        ReadyMessage({}, 0, "profiling", ("x",), (), 0.0, 0.0, 0)  # type: ignore[arg-type]
    with pytest.raises(MessageError, match=r"tensor\.dtype"):
        TensorSpec("x", "float32", ())  # type: ignore[arg-type]


def test_error_codes_are_all_used_and_message_error_is_a_value_error() -> None:
    assert issubclass(MessageError, ValueError)
    assert {"unknown_kind", "unexpected_kind", "bad_body", "missing_field"} <= MESSAGE_ERROR_CODES
    with pytest.raises(AssertionError):
        MessageError("not-a-code", "x")


def test_hello_negotiation() -> None:
    assert isinstance(HELLO, HelloMessage)
    assert HELLO.negotiate().features == frozenset(KNOWN_FEATURES)
    future = HelloMessage(PROTOCOL_VERSION + 1, (), (), "w", 1, 0.0, 0)
    with pytest.raises(FeatureError, match="version"):
        future.negotiate()
    demanding = HelloMessage(PROTOCOL_VERSION, ("teleport",), ("teleport",), "w", 1, 0.0, 0)
    with pytest.raises(FeatureError) as info:
        demanding.negotiate()
    assert info.value.unknown == ("teleport",)


names = st.lists(st.text(min_size=1, max_size=12), max_size=6, unique=True)


@given(
    call_id=st.integers(0, 2**63 - 1),
    request_id=st.text(min_size=1, max_size=20),
    epoch=st.integers(0, 2**31),
    input_names=names,
)
def test_call_round_trip_property(
    call_id: int, request_id: str, epoch: int, input_names: list[str]
) -> None:
    call = CallMessage(call_id, request_id, epoch, tuple(input_names))
    assert decode_message(decode_frame(frame_for(call))) == call


@given(
    placement=st.dictionaries(st.text(min_size=1, max_size=10), st.integers(0, 1000), max_size=4),
    extra=st.integers(0, 1000),
    seconds=st.floats(0, 1e6, allow_nan=False),
)
def test_ready_round_trip_property(placement: dict[str, int], extra: int, seconds: float) -> None:
    ready = ReadyMessage(
        placement, sum(placement.values()) + extra, "profiling", (), (), seconds, seconds, extra
    )
    assert decode_message(decode_frame(frame_for(ready))) == ready


def test_the_message_fixtures_decode_as_messages_with_their_devices() -> None:
    from runtime.contracts.conformance import load_fixtures

    fixtures = {f["name"]: f for f in load_fixtures() if f["name"].startswith("ok/messages/")}
    load = decode_message(
        decode_frame(bytes.fromhex(fixtures["ok/messages/load_on_a_device"]["hex"]))
    )
    assert isinstance(load, LoadMessage)
    assert load.device == EpDeviceRequest("LUID-00000000-0000F2A1", "gpu", 0x1002, 0x150E)
    assert dict(load.provider_options) == {"device_id": "0"}
    ready = decode_message(
        decode_frame(bytes.fromhex(fixtures["ok/messages/ready_with_the_applied_device"]["hex"]))
    )
    assert isinstance(ready, ReadyMessage)
    assert ready.device is not None
    assert (ready.device.method, ready.device.vendor_id) == ("ep_device", 0x1002)
