"""A worker's answer read by its layout: the same values as the decoder reads, or nothing.

Also the two ways a worker's answer gets cheaper to write: a result encoded before its run
(``prepare_answer``, sent with the run's time or withdrawn) and acknowledgement frames made
from the bytes kept for their owner."""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING

import numpy as np
import pytest

from runtime.contracts import binary
from runtime.contracts.buffers import DType
from runtime.contracts.codec import (
    FrameDecoder,
    encode_ack_frame,
    encode_frame,
)
from runtime.contracts.messages import (
    WORKER_TO_CONTROLLER,
    AckMessage,
    ResultMessage,
    decode_message,
)
from runtime.transport.answers import AnswerLayout, pack_run_s, prepare_answer, send_answer
from tests.helpers.answers import answer_write, learned

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.transport.channel import FramedChannel


def _patched(data: bytes, field: str, *, valid: bool = False) -> bytes:
    """``data`` with 2**63 as its first acknowledged generation or its last offset, or NaN
    as its run time (values no encoder writes); with ``valid``, 2**62 or 0.75 there."""
    raw = bytearray(data)
    value = (2**62 if valid else 2**63).to_bytes(8, "little")
    if field == "offset":
        at = len(raw) - 8
    elif field == "ack":
        at = 16 + int.from_bytes(raw[4:8], "little") - 8
    else:
        at = 0
        for _ in range(2):  # past the two acknowledgements
            at += 16 + int.from_bytes(raw[at + 4 : at + 8], "little")
        at += 16 + 4 + 16  # the result's prefix, kind, flags, count, call id and epoch
        value = struct.pack("<d", 0.75 if valid else math.nan)
    raw[at : at + 8] = value
    return bytes(raw)


def test_an_answer_of_a_learned_layout_reads_as_the_decoder_reads_it() -> None:
    layout = learned(answer_write([11, 12], 1))
    assert layout is not None
    data = answer_write(
        [21, 22],
        2,
        run_s=0.5,
        request_id="req-00000002",
        generations=(31, 32),
        offsets=(8192, 12288),
    )
    answer = layout.match(data)
    assert answer is not None
    frames = FrameDecoder().feed(data)
    acks = [decode_message(frame, WORKER_TO_CONTROLLER) for frame in frames[:-1]]
    result = decode_message(frames[-1], WORKER_TO_CONTROLLER)
    assert isinstance(result, ResultMessage)
    assert answer.acks == tuple(
        (ack.owner, ack.generation) for ack in acks if isinstance(ack, AckMessage)
    )
    assert answer.acks == (("stage-0", 21), ("stage-0", 22))
    assert (answer.call_id, answer.epoch, answer.run_s, answer.copied_bytes) == (
        result.call_id,
        result.epoch,
        result.run_s,
        result.copied_bytes,
    )
    assert answer.request_id == result.request_id.encode()
    assert answer.buffers == frames[-1].buffers
    assert layout.output_names == result.output_names == ("y", "z")


@pytest.mark.parametrize(
    ("name", "other"),
    [
        ("one more ack", lambda: answer_write([21, 22, 23], 2)),
        ("another shape", lambda: answer_write([21, 22], 2, shape=(2, 512))),
        ("another owner", lambda: answer_write([21, 22], 2, owner="ort-2")),
        ("a longer request id", lambda: answer_write([21, 22], 2, request_id="req-000000002")),
        ("a generation past 63 bits", lambda: _patched(answer_write([21, 22], 2), "ack")),
        ("an offset past 63 bits", lambda: _patched(answer_write([21, 22], 2), "offset")),
        ("a run time that is not a number", lambda: _patched(answer_write([21, 22], 2), "run_s")),
        ("a truncated write", lambda: answer_write([21, 22], 2)[:-1]),
        ("two answers in one read", lambda: answer_write([21, 22], 2) + answer_write([21, 22], 3)),
    ],
)
def test_anything_but_an_answer_of_the_layout_is_left_to_the_decoder(
    name: str, other: Callable[[], bytes]
) -> None:
    layout = learned(answer_write([11, 12], 1))
    assert layout is not None
    assert layout.match(other()) is None, name


def test_the_values_those_checks_refuse_are_read_where_they_lie() -> None:
    layout = learned(answer_write([11, 12], 1))
    assert layout is not None
    offset = layout.match(_patched(answer_write([21, 22], 2), "offset", valid=True))
    ack = layout.match(_patched(answer_write([21, 22], 2), "ack", valid=True))
    run = layout.match(_patched(answer_write([21, 22], 2), "run_s", valid=True))
    assert offset is not None
    assert offset.buffers[1].offset == 2**62
    assert ack is not None
    assert ack.acks[0] == ("stage-0", 2**62)
    assert run is not None
    assert run.run_s == 0.75


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("JSON headers", answer_write([11], 1, binary_header=False)),
        ("results in the frame", answer_write([11], 1, location=None)),
        ("acknowledgements alone", encode_frame("ack", {"owner": "stage-0", "generation": 3})),
    ],
)
def test_only_answers_with_binary_headers_and_arena_results_have_a_layout(
    name: str, data: bytes
) -> None:
    assert learned(data) is None, name


def test_a_result_before_its_acknowledgements_has_no_layout() -> None:
    result_first = answer_write([], 1) + encode_frame(
        "ack", {"owner": "stage-0", "generation": 3}, binary_header=True
    )
    assert learned(result_first) is None


@pytest.mark.parametrize("binary_header", [True, False], ids=["binary", "json"])
def test_an_ack_frame_is_the_bytes_the_encoder_gives(binary_header: bool) -> None:
    for generation in (1, 2, 2**63 - 1, 9):
        assert encode_ack_frame("stage-7", generation, binary_header=binary_header) == (
            encode_frame(
                "ack", {"owner": "stage-7", "generation": generation}, binary_header=binary_header
            )
        )


def test_a_result_header_takes_another_run_time_and_nothing_else_does() -> None:
    body = {
        "call_id": 5,
        "request_id": "req-1",
        "epoch": 0,
        "output_names": ["y"],
        "run_s": 0.0,
        "copied_bytes": 0,
    }
    header = binary.encode_header("result", body, [], [])
    assert header is not None
    replaced = binary.with_run_s(header, 1.25)
    assert replaced is not None
    assert binary.decode_header(replaced, 8)[1] == {**body, "run_s": 1.25}
    ack = binary.encode_header("ack", {"owner": "x", "generation": 1}, [], [])
    assert ack is not None
    assert binary.with_run_s(ack, 1.0) is None
    assert binary.with_run_s(header, math.inf) is None
    assert binary.with_run_s(header, -1.0) is None


def _slot_result(
    sender: FramedChannel, owner: str
) -> tuple[ResultMessage, dict[str, np.ndarray], dict[str, object]]:
    arena = sender.open_arena(owner, 1 << 16)
    assert arena is not None
    found = arena.allocate(4096)
    assert found is not None
    slot, raw = found
    view = raw.view(np.float32)
    view[:] = np.arange(1024, dtype=np.float32)
    message = ResultMessage(9, "req-9", 0, ("y",), 0.0, 0)
    return message, {"y": view}, {"y": slot}


def test_a_prepared_result_goes_out_with_the_run_time_after_its_acknowledgements(
    channel_pair: Callable[..., tuple[FramedChannel, FramedChannel]], shm_prefix: str
) -> None:
    worker, controller = channel_pair(shm_prefix=shm_prefix, same_domain=True)
    worker.binary_headers = True
    message, arrays, placed = _slot_result(worker, "ort-1")
    prepared = prepare_answer(
        worker, message, arrays, owner="ort-1", generation=9, placed=placed, acks=[("stage-0", 4)]
    )
    assert prepared is not None
    send_answer(worker, prepared, run_s=0.125)
    ack, _ = controller.read_message(WORKER_TO_CONTROLLER, timeout_s=5)
    assert ack == AckMessage("stage-0", 4)
    result, frame = controller.read_message(WORKER_TO_CONTROLLER, timeout_s=5)
    assert isinstance(result, ResultMessage)
    assert result.run_s == 0.125
    outputs, acks = controller.arrays_from_frame(frame, result.output_names)
    np.testing.assert_array_equal(outputs["y"], np.arange(1024, dtype=np.float32))
    arena = worker.arena("ort-1")
    assert arena is not None
    assert arena.retained_count == 1
    for owner, generation in acks:
        assert worker.acknowledge(owner, generation)
    assert arena.retained_count == 0


def test_a_withdrawn_result_frees_its_slots_and_writes_nothing(
    channel_pair: Callable[..., tuple[FramedChannel, FramedChannel]], shm_prefix: str
) -> None:
    worker, controller = channel_pair(shm_prefix=shm_prefix, same_domain=True)
    worker.binary_headers = True
    message, arrays, placed = _slot_result(worker, "ort-1")
    prepared = prepare_answer(worker, message, arrays, owner="ort-1", generation=9, placed=placed)
    assert prepared is not None
    prepared.withdraw()
    prepared.withdraw()
    arena = worker.arena("ort-1")
    assert arena is not None
    assert arena.retained_count == 0
    assert not controller.wait_readable(0.05)


def test_a_result_is_prepared_only_with_binary_headers_and_every_array_placed(
    channel_pair: Callable[..., tuple[FramedChannel, FramedChannel]], shm_prefix: str
) -> None:
    worker, _ = channel_pair(shm_prefix=shm_prefix, same_domain=True)
    message, arrays, placed = _slot_result(worker, "ort-1")
    assert (
        prepare_answer(worker, message, arrays, owner="ort-1", generation=9, placed=placed) is None
    )
    worker.binary_headers = True
    assert prepare_answer(worker, message, arrays, owner="ort-1", generation=9, placed={}) is None
    with pytest.raises(ValueError, match="names tensors"):
        prepare_answer(
            worker,
            ResultMessage(9, "req-9", 0, ("z",), 0.0, 0),
            arrays,
            owner="ort-1",
            generation=9,
            placed=placed,
        )
    arena = worker.arena("ort-1")
    assert arena is not None
    # Nothing was prepared: the slot is the caller's, still held.
    assert arena.retained_count == 1


def test_a_prepared_result_refuses_a_run_time_that_is_not_a_number(
    channel_pair: Callable[..., tuple[FramedChannel, FramedChannel]], shm_prefix: str
) -> None:
    worker, controller = channel_pair(shm_prefix=shm_prefix, same_domain=True)
    worker.binary_headers = True
    message, arrays, placed = _slot_result(worker, "ort-1")
    prepared = prepare_answer(worker, message, arrays, owner="ort-1", generation=9, placed=placed)
    assert prepared is not None
    with pytest.raises(ValueError, match="run time nan"):
        send_answer(worker, prepared, run_s=math.nan)
    arena = worker.arena("ort-1")
    assert arena is not None
    assert arena.retained_count == 0
    assert not controller.wait_readable(0.05)


def test_learning_needs_the_bytes_of_whole_frames() -> None:
    data = answer_write([1], 1)
    frames = FrameDecoder().feed(data)
    assert AnswerLayout.learn(data[: len(data) - 8], frames) is None
    assert AnswerLayout.learn(data + bytes(8), frames) is None


def test_an_answer_packed_by_its_layout_is_the_bytes_its_frames_encode_to() -> None:
    layout = learned(answer_write([11, 12], 1))
    assert layout is not None
    assert layout.ack_owners == ("stage-0", "stage-0")
    assert layout.request_id_size == len(b"req-00000001")
    assert layout.buffer_specs == ((DType.FLOAT32, (4, 256)), (DType.FLOAT32, (4, 256)))
    for call_id, run_s in ((2, 0.5), (2**63 - 1, 0.0), (40, 1e-9)):
        packed = layout.pack(
            [21, 2**63 - 1],
            call_id,
            3,
            run_s,
            0,
            b"req-00000002",
            [31, 32],
            [8192, 12288],
        )
        assert packed == answer_write(
            [21, 2**63 - 1],
            call_id,
            run_s=run_s,
            request_id="req-00000002",
            generations=(31, 32),
            offsets=(8192, 12288),
        )


def test_an_answer_packed_before_its_run_takes_the_run_time_where_it_lies() -> None:
    layout = learned(answer_write([11, 12], 1))
    assert layout is not None
    data = bytearray(layout.pack([21, 22], 2, 3, 0.0, 0, b"req-00000002", [31, 32], [0, 4096]))
    pack_run_s(data, layout.run_s_at, 0.375)
    assert bytes(data) == answer_write(
        [21, 22], 2, run_s=0.375, request_id="req-00000002", generations=(31, 32)
    )
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="run time"):
            pack_run_s(data, layout.run_s_at, bad)
    assert layout.match(bytes(data)) is not None


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("one ack fewer", {"acks": [21]}),
        ("a longer request id", {"request_id": b"req-000000002"}),
        ("a negative generation", {"generations": [-1, 32]}),
        ("an offset past 63 bits", {"offsets": [0, 2**63]}),
        ("a run time that is not a number", {"run_s": math.inf}),
    ],
)
def test_values_an_answer_of_the_layout_cannot_carry_are_refused(
    name: str, change: dict[str, object]
) -> None:
    layout = learned(answer_write([11, 12], 1))
    assert layout is not None
    values: dict[str, object] = {
        "acks": [21, 22],
        "call_id": 2,
        "epoch": 3,
        "run_s": 0.5,
        "copied_bytes": 0,
        "request_id": b"req-00000002",
        "generations": [31, 32],
        "offsets": [0, 4096],
    }
    values.update(change)
    with pytest.raises(ValueError, match=r"layout|counter"):
        layout.pack(**values)  # type: ignore[arg-type]
