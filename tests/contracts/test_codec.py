"""The frame codec: properties over random frames and bytes, and its edge cases."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.contracts import (
    KNOWN_FEATURES,
    BufferDescriptor,
    DType,
    Frame,
    FrameDecoder,
    FrameError,
    FrameLimits,
    decode_frame,
    encode_frame,
    encode_frame_parts,
)
from runtime.contracts.codec import MAGIC, PREFIX_SIZE
from runtime.contracts.conformance import describe_frame

PREFIX = struct.Struct("<4sIQ")

# Lone surrogates cannot be encoded as UTF-8, so no frame can carry them.
text = st.text(st.characters(codec="utf-8"), max_size=12)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=8,
)
bodies = st.dictionaries(text, json_values, max_size=5)
owners = st.text(st.characters(codec="utf-8"), min_size=1, max_size=16)
shapes = st.lists(st.integers(0, 5), max_size=4).map(tuple)


@st.composite
def buffers(draw: st.DrawFn) -> tuple[BufferDescriptor, bytes | None]:
    dtype = draw(st.sampled_from(DType))
    shape = draw(shapes)
    location = draw(st.none() | st.text("abcdef-_0123456789", min_size=1, max_size=20))
    descriptor = BufferDescriptor.for_array(
        draw(owners), draw(st.integers(0, 2**63 - 1)), dtype, shape, location
    )
    if location is not None:
        return descriptor, None
    return descriptor, draw(st.binary(min_size=descriptor.nbytes, max_size=descriptor.nbytes))


@st.composite
def frames(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "kind": draw(owners),
        "body": draw(bodies),
        "buffers": draw(st.lists(buffers(), max_size=3)),
        "required": draw(st.lists(st.sampled_from(sorted(KNOWN_FEATURES)), unique=True)),
    }


def encode(spec: dict[str, Any]) -> bytes:
    return encode_frame(spec["kind"], spec["body"], spec["buffers"], spec["required"])


def canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def decode_all(data: bytes, limits: FrameLimits | None = None) -> list[Frame]:
    """Decode a whole stream; only FrameError may escape."""
    decoder = FrameDecoder(limits)
    out = decoder.feed(data)
    decoder.close()
    return out


@given(frames())
def test_round_trip(spec: dict[str, Any]) -> None:
    frame = decode_frame(encode(spec))
    assert frame.kind == spec["kind"]
    assert canonical(frame.body) == canonical(spec["body"])
    assert frame.buffers == tuple(d for d, _ in spec["buffers"])
    assert frame.payloads == tuple(p for _, p in spec["buffers"])
    required = list(spec["required"])
    if any(not d.inline for d, _ in spec["buffers"]) and "shm-buffers" not in required:
        required.append("shm-buffers")
    assert list(frame.required) == required


@given(frames())
def test_header_matches_the_encoded_header(spec: dict[str, Any]) -> None:
    data = encode(spec)
    header_len = PREFIX.unpack(data[:PREFIX_SIZE])[1]
    header = json.loads(data[PREFIX_SIZE : PREFIX_SIZE + header_len])
    assert canonical(decode_frame(data).header()) == canonical(header)


@given(st.lists(frames(), max_size=3), st.lists(st.integers(1, 64), min_size=1, max_size=8))
def test_any_chunking_gives_the_same_frames(specs: list[dict[str, Any]], sizes: list[int]) -> None:
    stream = b"".join(encode(spec) for spec in specs)
    whole = [describe_frame(f) for f in decode_all(stream)]
    assert len(whole) == len(specs)
    decoder = FrameDecoder()
    chunked: list[Frame] = []
    offset = 0
    index = 0
    while offset < len(stream):
        size = sizes[index % len(sizes)]
        chunked.extend(decoder.feed(stream[offset : offset + size]))
        offset += size
        index += 1
    decoder.close()
    assert canonical([describe_frame(f) for f in chunked]) == canonical(whole)


small_limits = st.builds(
    FrameLimits,
    max_header_bytes=st.integers(2, 600),
    max_buffers=st.integers(0, 4),
    max_total_bytes=st.integers(18, 2000),
)


@given(st.binary(max_size=600), st.none() | small_limits)
def test_random_bytes_raise_only_frame_error(data: bytes, limits: FrameLimits | None) -> None:
    try:
        decode_all(data, limits)
    except FrameError:
        pass


@given(st.binary(max_size=300), st.integers(0, 400), st.integers(0, 2**64 - 1))
def test_random_bytes_after_a_valid_prefix_raise_only_frame_error(
    tail: bytes, header_len: int, payload_len: int
) -> None:
    try:
        decode_all(PREFIX.pack(MAGIC, header_len, payload_len % 4096) + tail)
    except FrameError:
        pass


header_keys = st.sampled_from(["v", "kind", "required", "buffers", "body", "extra"])
descriptor_like = st.dictionaries(
    st.sampled_from(["owner", "generation", "nbytes", "dtype", "shape", "location", "strides"]),
    json_values | st.sampled_from([d.value for d in DType]) | st.lists(st.integers(-3, 2**64)),
)
header_values = (
    json_values
    | st.just(1)
    | st.lists(descriptor_like, max_size=3)
    | st.lists(st.sampled_from([*sorted(KNOWN_FEATURES), "x-future"]), max_size=3)
)


@given(st.dictionaries(header_keys, header_values), st.integers(0, 64), st.binary(max_size=64))
def test_random_headers_raise_only_frame_error(
    header: dict[str, Any], payload_len: int, payload: bytes
) -> None:
    raw = json.dumps(header, ensure_ascii=False).encode()
    try:
        decode_all(PREFIX.pack(MAGIC, len(raw), payload_len) + raw + payload)
    except FrameError:
        pass


@given(
    st.lists(frames(), min_size=1, max_size=2),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    st.integers(0, 10_000),
)
def test_mutated_and_truncated_frames_raise_only_frame_error(
    specs: list[dict[str, Any]], flips: list[tuple[int, int]], cut: int
) -> None:
    stream = bytearray(b"".join(encode(spec) for spec in specs))
    for position, value in flips:
        stream[position % len(stream)] = value
    del stream[cut % (len(stream) + 1) :]
    try:
        decode_all(bytes(stream))
    except FrameError:
        pass


@given(frames(), st.integers(1, 10_000))
def test_every_proper_prefix_of_a_frame_is_truncated(spec: dict[str, Any], cut: int) -> None:
    data = encode(spec)
    with pytest.raises(FrameError) as info:
        decode_all(data[: cut % len(data)] if cut % len(data) else data[:1])
    assert info.value.code == "truncated"


@given(
    st.integers(1, 200),
    st.integers(0, 2**64 - 1),
    st.integers(18, 4096),
)
def test_oversized_frames_are_refused_from_the_prefix_alone(
    header_len: int, payload_len: int, max_total: int
) -> None:
    limits = FrameLimits(max_header_bytes=256, max_total_bytes=max_total)
    decoder = FrameDecoder(limits)
    prefix = PREFIX.pack(MAGIC, header_len, payload_len)
    if PREFIX_SIZE + header_len + payload_len > max_total:
        with pytest.raises(FrameError) as info:
            decoder.feed(prefix)
        assert info.value.code == "frame_too_large"
    else:
        assert decoder.feed(prefix) == []
        assert decoder.bytes_needed() <= max_total


def test_a_huge_payload_is_refused_before_buffering() -> None:
    decoder = FrameDecoder(FrameLimits(max_total_bytes=1 << 20))
    header = b'{"v":1,"kind":"x"}'
    # Only the 16-byte prefix is fed: the refusal cannot depend on payload bytes.
    with pytest.raises(FrameError) as info:
        decoder.feed(PREFIX.pack(MAGIC, len(header), 2**64 - 1))
    assert info.value.code == "frame_too_large"
    assert "limit 1048576" in str(info.value)
    with pytest.raises(FrameError) as info:
        decoder.feed(header)
    assert info.value.code == "closed"


def test_a_header_over_the_limit_is_refused_before_buffering() -> None:
    decoder = FrameDecoder(FrameLimits(max_header_bytes=64))
    with pytest.raises(FrameError) as info:
        decoder.feed(PREFIX.pack(MAGIC, 2**32 - 1, 0))
    assert info.value.code == "header_too_large"


def at_boundary(decoder: FrameDecoder) -> bool:
    return decoder.at_boundary


def test_bytes_needed_walks_prefix_header_payload() -> None:
    descriptor = BufferDescriptor.for_array("o", 0, DType.FLOAT32, (3,))
    data = encode_frame("k", None, [(descriptor, bytes(12))])
    header_len = PREFIX.unpack(data[:PREFIX_SIZE])[1]
    decoder = FrameDecoder()
    assert at_boundary(decoder)
    assert decoder.bytes_needed() == PREFIX_SIZE
    assert decoder.feed(data[:PREFIX_SIZE]) == []
    assert decoder.bytes_needed() == header_len
    assert not at_boundary(decoder)
    assert decoder.feed(data[PREFIX_SIZE : PREFIX_SIZE + header_len]) == []
    assert decoder.bytes_needed() == 12
    [frame] = decoder.feed(data[PREFIX_SIZE + header_len :])
    assert frame.payloads == (bytes(12),)
    assert at_boundary(decoder)
    assert decoder.bytes_needed() == PREFIX_SIZE


def test_a_failed_decoder_stays_closed() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError) as info:
        decoder.feed(b"XXXX" + bytes(12))
    assert info.value.code == "bad_magic"
    with pytest.raises(FrameError) as info:
        decoder.feed(encode_frame("ok"))
    assert info.value.code == "closed"
    assert "bad_magic" in str(info.value)
    decoder.close()


def test_a_closed_decoder_refuses_more_bytes() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(encode_frame("a")) != []
    decoder.close()
    decoder.close()
    with pytest.raises(FrameError) as info:
        decoder.feed(encode_frame("b"))
    assert info.value.code == "closed"


def test_close_inside_a_frame_is_truncated_then_closed() -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame("a")[:20])
    with pytest.raises(FrameError) as info:
        decoder.close()
    assert info.value.code == "truncated"
    with pytest.raises(FrameError) as info:
        decoder.feed(b"")
    assert info.value.code == "closed"


def test_unknown_features_depend_on_the_receiver() -> None:
    data = encode_frame("x", required=["cancel"])
    assert FrameDecoder().feed(data)[0].required == ("cancel",)
    with pytest.raises(FrameError) as info:
        FrameDecoder(known_features=frozenset()).feed(data)
    assert info.value.code == "unknown_required_feature"
    assert "cancel" in str(info.value)


def test_decode_frame_exactly_one() -> None:
    one = encode_frame("x", {"a": 1})
    assert decode_frame(one).body == {"a": 1}
    with pytest.raises(FrameError) as info:
        decode_frame(one + b"!")
    assert info.value.code == "trailing_bytes"
    assert "1 bytes follow" in str(info.value)
    with pytest.raises(FrameError) as info:
        decode_frame(one + one)
    assert info.value.code == "trailing_bytes"


def test_decode_frame_reports_trailing_bytes_it_never_parses() -> None:
    one = encode_frame("x")
    # The trailing bytes would be a bad magic or an oversized frame if parsed.
    for tail in (bytes(16), PREFIX.pack(MAGIC, 10, 2**64 - 1)):
        with pytest.raises(FrameError) as info:
            decode_frame(one + tail)
        assert info.value.code == "trailing_bytes"


@pytest.mark.parametrize("data", [b"", b"OEF1", encode_frame("x")[:-1]])
def test_decode_frame_truncated(data: bytes) -> None:
    with pytest.raises(FrameError) as info:
        decode_frame(data)
    assert info.value.code == "truncated"


def test_decode_frame_applies_limits() -> None:
    with pytest.raises(FrameError) as info:
        decode_frame(encode_frame("x", {"pad": "y" * 100}), FrameLimits(max_header_bytes=32))
    assert info.value.code == "header_too_large"


def test_infinite_numbers_in_the_header_are_refused() -> None:
    raw = b'{"v":1,"kind":"x","body":{"a":-1e400}}'
    with pytest.raises(FrameError) as info:
        decode_frame(PREFIX.pack(MAGIC, len(raw), 0) + raw)
    assert info.value.code == "bad_header_json"
    assert "-1e400" in str(info.value)
    raw = b'{"v":1,"kind":"x","body":{"a":1e308,"b":-0.0}}'
    assert decode_frame(PREFIX.pack(MAGIC, len(raw), 0) + raw).body == {"a": 1e308, "b": -0.0}


def test_encode_frame_parts_gathers_without_copying() -> None:
    descriptor = BufferDescriptor.for_array("o", 0, DType.UINT8, (4,))
    data = bytearray(b"abcd")
    parts = encode_frame_parts("k", None, [(descriptor, data)])
    assert len(parts) == 3
    assert isinstance(parts[2], memoryview)
    assert parts[2].obj is data
    assert b"".join(parts) == encode_frame("k", None, [(descriptor, data)])


def test_encoder_adds_shm_feature_for_shared_memory() -> None:
    shm = BufferDescriptor.for_array("o", 0, DType.FLOAT32, (2,), location="oe-1")
    frame = decode_frame(encode_frame("k", None, [(shm, None)], required=["cancel"]))
    assert frame.required == ("cancel", "shm-buffers")
    assert frame.payloads == (None,)


def test_encoder_refuses_inconsistent_buffers() -> None:
    inline = BufferDescriptor.for_array("o", 0, DType.UINT8, (2,))
    shm = BufferDescriptor.for_array("o", 0, DType.UINT8, (2,), location="oe-1")
    with pytest.raises(ValueError, match="has no bytes"):
        encode_frame("k", None, [(inline, None)])
    with pytest.raises(ValueError, match="buffer has 3 bytes but its descriptor says 2"):
        encode_frame("k", None, [(inline, b"abc")])
    with pytest.raises(ValueError, match="carries no inline bytes"):
        encode_frame("k", None, [(shm, b"ab")])
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode_frame("k", {"x": float("nan")})


@pytest.mark.parametrize(
    "limits",
    [
        {"max_header_bytes": 1},
        {"max_buffers": -1},
        {"max_total_bytes": 17},
    ],
)
def test_frame_limits_refuse_values_too_small(limits: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="frame limits too small"):
        FrameLimits(**limits)


def test_frame_error_names_its_code() -> None:
    error = FrameError("truncated", "stream ended")
    assert error.code == "truncated"
    assert str(error) == "truncated: stream ended"
    assert isinstance(error, ValueError)
