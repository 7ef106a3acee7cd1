"""Conformance fixtures of the frame codec, and a runner for them.

``v1.json`` ships as package data; its ``format`` key documents the fixture schema so
another implementation can run the same fixtures. Here :func:`run_fixture` runs one
against :class:`~runtime.contracts.codec.FrameDecoder`.
"""

from __future__ import annotations

import json
from dataclasses import fields
from importlib import resources
from typing import TYPE_CHECKING, Any

from runtime.contracts.codec import FrameDecoder, FrameError, FrameLimits

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from runtime.contracts.codec import Frame

FIXTURES_FILE = "v1.json"


def load_document() -> dict[str, Any]:
    """The whole ``v1.json`` document: ``format``, ``version`` and ``fixtures``."""
    text = resources.files(__name__).joinpath(FIXTURES_FILE).read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    return document


def load_fixtures() -> list[dict[str, Any]]:
    """Every fixture of ``v1.json``, in file order."""
    fixtures: list[dict[str, Any]] = load_document()["fixtures"]
    return fixtures


def fixture_limits(fixture: Mapping[str, Any]) -> FrameLimits:
    """The fixture's limits; keys it leaves out keep :class:`FrameLimits` defaults."""
    given = dict(fixture.get("limits") or {})
    accepted = {f.name for f in fields(FrameLimits)}
    unknown = sorted(set(given) - accepted)
    if unknown:
        raise AssertionError(
            f"{fixture.get('name')}: unknown limit(s) {unknown}; accepted: {sorted(accepted)}"
        )
    return FrameLimits(**given)


def describe_frame(frame: Frame) -> dict[str, Any]:
    """A decoded frame in the fixtures' ``expect.frames`` form."""
    return {
        "kind": frame.kind,
        "body": dict(frame.body),
        "required": list(frame.required),
        "buffers": [d.to_wire() for d in frame.buffers],
        "payloads_hex": [None if p is None else p.hex() for p in frame.payloads],
    }


def _chunks(data: bytes, chunking: str | Sequence[int]) -> list[bytes]:
    if chunking == "whole":
        return [data]
    if chunking == "bytewise":
        return [data[i : i + 1] for i in range(len(data))]
    if isinstance(chunking, str) or not chunking or any(size <= 0 for size in chunking):
        raise ValueError(
            f"chunking {chunking!r}: expected 'whole', 'bytewise' or positive chunk sizes"
        )
    out: list[bytes] = []
    offset = 0
    index = 0
    while offset < len(data):
        size = chunking[index % len(chunking)]
        out.append(data[offset : offset + size])
        offset += size
        index += 1
    return out


def _canonical(value: object) -> str:
    # JSON text, not Python equality: 1, 1.0 and true must not compare equal.
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def run_fixture(fixture: Mapping[str, Any], *, chunking: str | Sequence[int] | None = None) -> None:
    """Decode the fixture's stream and check the result; raise AssertionError on mismatch.

    ``chunking`` overrides the fixture's own: ``"whole"``, ``"bytewise"``, or chunk sizes
    used in turn. The decoder is closed after the last chunk (the end of the stream).
    """
    name = fixture["name"]
    data = bytes.fromhex(fixture["hex"])
    mode = chunking if chunking is not None else fixture.get("chunking", "whole")
    decoder = FrameDecoder(fixture_limits(fixture))
    frames: list[Frame] = []
    error: FrameError | None = None
    try:
        for chunk in _chunks(data, mode):
            frames.extend(decoder.feed(chunk))
        decoder.close()
    except FrameError as exc:
        error = exc
    expect = fixture["expect"]
    if "error" in expect:
        if error is None:
            raise AssertionError(
                f"{name}: expected error {expect['error']!r}, "
                f"but the stream decoded into {len(frames)} frame(s)"
            )
        if error.code != expect["error"]:
            raise AssertionError(f"{name}: expected error {expect['error']!r}, got {error}")
        return
    expected = expect["frames"]
    if error is not None:
        raise AssertionError(f"{name}: expected {len(expected)} frame(s), got error {error}")
    if len(frames) != len(expected):
        raise AssertionError(f"{name}: expected {len(expected)} frame(s), got {len(frames)}")
    for index, (frame, want) in enumerate(zip(frames, expected, strict=True)):
        got = describe_frame(frame)
        for key in ("kind", "body", "required", "buffers", "payloads_hex"):
            if _canonical(got[key]) != _canonical(want[key]):
                raise AssertionError(
                    f"{name}: frame {index} {key}: expected {_canonical(want[key])}, "
                    f"got {_canonical(got[key])}"
                )


__all__ = [
    "FIXTURES_FILE",
    "describe_frame",
    "fixture_limits",
    "load_document",
    "load_fixtures",
    "run_fixture",
]
