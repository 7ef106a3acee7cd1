"""Answers of a graph worker (acknowledgements, then a result) made with the codec."""

from __future__ import annotations

from runtime.contracts.buffers import BufferDescriptor, DType
from runtime.contracts.codec import FrameDecoder, encode_frame_parts
from runtime.transport.answers import AnswerLayout

ARENA = "oe-1-2-arena-ort-1"


def answer_write(
    acks: list[int],
    call_id: int,
    *,
    run_s: float = 0.25,
    request_id: str = "req-00000001",
    generations: tuple[int, int] = (7, 8),
    offsets: tuple[int, int] = (0, 4096),
    shape: tuple[int, ...] = (4, 256),
    owner: str = "ort-1",
    binary_header: bool = True,
    location: str | None = ARENA,
) -> bytes:
    """One write as a graph worker makes it: an ack per input, then the result."""
    parts: list[bytes | memoryview] = []
    for generation in acks:
        parts += encode_frame_parts(
            "ack", {"owner": "stage-0", "generation": generation}, binary_header=binary_header
        )
    body = {
        "call_id": call_id,
        "request_id": request_id,
        "epoch": 3,
        "output_names": ["y", "z"],
        "run_s": run_s,
        "copied_bytes": 0,
    }
    buffers: list[tuple[BufferDescriptor, bytes | None]] = []
    for generation, offset in zip(generations, offsets, strict=True):
        if location is None:
            descriptor = BufferDescriptor.for_array(owner, generation, DType.FLOAT32, shape)
            buffers.append((descriptor, bytes(descriptor.nbytes)))
        else:
            descriptor = BufferDescriptor.for_array(
                owner, generation, DType.FLOAT32, shape, location, offset
            )
            buffers.append((descriptor, None))
    parts += encode_frame_parts("result", body, buffers, binary_header=binary_header)
    return b"".join(bytes(part) for part in parts)


def learned(data: bytes) -> AnswerLayout | None:
    return AnswerLayout.learn(data, FrameDecoder().feed(data))


def answer_layout_of_another_stage() -> AnswerLayout:
    """A layout learned from an answer no graph worker of the tests' pipelines writes."""
    layout = learned(answer_write([1, 2], 1))
    assert layout is not None
    return layout
