"""The conformance fixtures: up to date, complete, and passed by this codec."""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from runtime.contracts import (
    ERROR_CODES,
    KNOWN_FEATURES,
    BufferDescriptor,
    DType,
    FrameDecoder,
    FrameLimits,
    encode_frame,
)
from runtime.contracts.conformance import (
    build_v1,
    describe_frame,
    fixture_limits,
    load_document,
    load_fixtures,
    run_fixture,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = load_fixtures()
VALID = [f for f in FIXTURES if "frames" in f["expect"]]
ERRORS = [f for f in FIXTURES if "error" in f["expect"]]
#: Valid fixtures whose bytes are deliberately not what the encoder writes.
NON_CANONICAL = {"ok/header_whitespace_key_order_escapes", "ok/explicit_empty_fields"}


def by_name(name: str) -> dict[str, Any]:
    return next(f for f in FIXTURES if f["name"] == name)


def test_v1_json_is_what_build_v1_generates() -> None:
    shipped = resources.files("runtime.contracts.conformance").joinpath("v1.json")
    assert shipped.read_text(encoding="utf-8") == build_v1.render()


def test_build_v1_module_check_passes_on_the_shipped_file() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "runtime.contracts.conformance.build_v1", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_build_v1_writes_and_checks(tmp_path: Path) -> None:
    out = tmp_path / "v1.json"
    assert build_v1.main(["--check", "--out", str(out)]) == 1
    assert build_v1.main(["--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == build_v1.render()
    assert out.read_text(encoding="utf-8").endswith("}\n")
    assert build_v1.main(["--check", "--out", str(out)]) == 0
    out.write_text(out.read_text(encoding="utf-8").replace('"ok/minimal"', '"ok/renamed"'))
    assert build_v1.main(["--check", "--out", str(out)]) == 1


def test_build_is_deterministic() -> None:
    assert build_v1.render() == build_v1.render()


def test_document_shape() -> None:
    document = load_document()
    assert list(document) == ["format", "version", "fixtures"]
    assert document["version"] == 1
    assert len(FIXTURES) >= 40
    names = [f["name"] for f in FIXTURES]
    assert len(names) == len(set(names))
    allowed = {"name", "description", "limits", "chunking", "hex", "expect"}
    for fixture in FIXTURES:
        assert set(fixture) <= allowed, fixture["name"]
        assert {"name", "description", "hex", "expect"} <= set(fixture), fixture["name"]
        assert fixture["description"], fixture["name"]
        assert fixture.get("chunking", "whole") in {"whole", "bytewise"}
        assert len(fixture["expect"]) == 1
        bytes.fromhex(fixture["hex"])


def test_format_matches_the_contracts() -> None:
    fmt = load_document()["format"]
    assert set(fmt["error_codes"]) == ERROR_CODES
    assert fmt["default_limits"] == dataclasses.asdict(FrameLimits())
    assert fmt["dtypes"] == {d.value: d.itemsize for d in DType}
    assert fmt["known_features"] == sorted(KNOWN_FEATURES)
    assert set(fmt["fixture"]) == {"name", "description", "limits", "chunking", "hex", "expect"}


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f["name"] for f in FIXTURES])
def test_fixture_passes(fixture: dict[str, Any]) -> None:
    run_fixture(fixture)


@pytest.mark.parametrize("chunking", ["whole", "bytewise", [5, 1, 3], [17]])
def test_every_fixture_passes_under_any_chunking(chunking: str | list[int]) -> None:
    for fixture in FIXTURES:
        run_fixture(fixture, chunking=chunking)


def test_error_codes_are_covered() -> None:
    used = {f["expect"]["error"] for f in ERRORS}
    assert used <= ERROR_CODES
    assert used == ERROR_CODES - {"closed", "trailing_bytes"}


def test_required_cases_are_present() -> None:
    names = {f["name"] for f in FIXTURES}
    expected = {
        "ok/minimal",
        "ok/body_only",
        "ok/scalar_shape",
        "ok/zero_size_dims",
        "ok/multiple_buffers",
        "ok/shm_descriptor",
        "ok/multiple_frames",
        "ok/split_bytewise",
        *(f"ok/dtype/{d.value}" for d in DType),
        "error/truncated/in_prefix",
        "error/truncated/in_header",
        "error/truncated/in_payload",
        "error/frame_too_large/u64_max_payload",
        "error/bad_header_json/invalid_utf8",
        "error/bad_header_json/nan",
        "error/bad_header_json/duplicate_key",
        "error/bad_header_json/deep_nesting",
        "error/bad_header/array",
        "error/bad_header/missing_kind",
        "error/bad_header/unknown_key",
        "error/bad_descriptor/missing_generation",
        "error/bad_descriptor/unknown_field",
        "error/bad_descriptor/empty_owner",
        "error/bad_descriptor/shm_without_feature",
        "error/bad_dtype/complex64",
        "error/bad_dtype/float8",
        "error/bad_dtype/number",
        "error/negative_length/nbytes",
        "error/negative_length/dim",
        "error/length_overflow/nbytes_2_63",
        "error/length_overflow/dims_product",
        "error/payload_mismatch/more",
        "error/payload_mismatch/fewer",
    }
    assert expected <= names
    shm = by_name("ok/shm_descriptor")["expect"]["frames"][0]
    assert shm["required"] == ["shm-buffers"]
    assert None in shm["payloads_hex"]
    assert len(by_name("ok/multiple_frames")["expect"]["frames"]) == 3


def test_huge_payload_fixture_announces_u64_max() -> None:
    data = bytes.fromhex(by_name("error/frame_too_large/u64_max_payload")["hex"])
    assert int.from_bytes(data[8:16], "little") == 2**64 - 1


@pytest.mark.parametrize(
    "fixture",
    [f for f in VALID if f["name"] not in NON_CANONICAL],
    ids=lambda f: f["name"],
)
def test_encoder_reproduces_canonical_fixtures(fixture: dict[str, Any]) -> None:
    decoder = FrameDecoder(fixture_limits(fixture))
    data = bytes.fromhex(fixture["hex"])
    frames = decoder.feed(data)
    # A binary stream re-encodes with binary headers where a frame has one (call, result, ack).
    binary_header = data.startswith(b"OEB1")
    stream = b"".join(
        encode_frame(
            frame.kind,
            frame.body,
            list(zip(frame.buffers, frame.payloads, strict=True)),
            frame.required,
            binary_header=binary_header,
        )
        for frame in frames
    )
    assert stream.hex() == fixture["hex"]


def test_non_canonical_fixtures_really_are() -> None:
    for name in NON_CANONICAL:
        fixture = by_name(name)
        [frame] = FrameDecoder().feed(bytes.fromhex(fixture["hex"]))
        assert encode_frame(frame.kind, frame.body, (), frame.required).hex() != fixture["hex"]


def test_describe_frame_uses_wire_descriptors() -> None:
    descriptor = BufferDescriptor.for_array("o", 1, DType.UINT8, (2,))
    [frame] = FrameDecoder().feed(encode_frame("k", {"a": 1}, [(descriptor, b"\x01\x02")]))
    assert describe_frame(frame) == {
        "kind": "k",
        "body": {"a": 1},
        "required": [],
        "buffers": [descriptor.to_wire()],
        "payloads_hex": ["0102"],
    }


def test_run_fixture_reports_a_wrong_error_code() -> None:
    fixture = copy.deepcopy(by_name("error/bad_magic/zeros"))
    fixture["expect"]["error"] = "truncated"
    with pytest.raises(AssertionError, match=r"error/bad_magic/zeros: expected error 'truncated'"):
        run_fixture(fixture)


def test_run_fixture_reports_an_error_that_did_not_happen() -> None:
    fixture = copy.deepcopy(by_name("ok/minimal"))
    fixture["expect"] = {"error": "bad_magic"}
    with pytest.raises(AssertionError, match=r"decoded into 1 frame"):
        run_fixture(fixture)


def test_run_fixture_reports_an_unexpected_error() -> None:
    fixture = copy.deepcopy(by_name("error/truncated/in_payload"))
    fixture["expect"] = {"frames": []}
    with pytest.raises(AssertionError, match=r"got error truncated"):
        run_fixture(fixture)


def test_run_fixture_reports_a_field_mismatch() -> None:
    fixture = copy.deepcopy(by_name("ok/body_only"))
    fixture["expect"]["frames"][0]["body"]["count"] = 3.0
    with pytest.raises(AssertionError, match=r"frame 0 body"):
        run_fixture(fixture)
    fixture = copy.deepcopy(by_name("ok/dtype/float32"))
    fixture["expect"]["frames"][0]["payloads_hex"] = ["00"]
    with pytest.raises(AssertionError, match=r"frame 0 payloads_hex"):
        run_fixture(fixture)


def test_run_fixture_reports_a_frame_count_mismatch() -> None:
    fixture = copy.deepcopy(by_name("ok/multiple_frames"))
    fixture["expect"]["frames"].pop()
    with pytest.raises(AssertionError, match=r"expected 2 frame\(s\), got 3"):
        run_fixture(fixture)


def test_fixture_limits_defaults_and_unknown_keys() -> None:
    assert fixture_limits({"name": "x"}) == FrameLimits()
    assert fixture_limits({"name": "x", "limits": {"max_buffers": 3}}) == FrameLimits(max_buffers=3)
    with pytest.raises(AssertionError, match=r"unknown limit\(s\) \['max_frames'\]"):
        fixture_limits({"name": "x", "limits": {"max_frames": 3}})


@pytest.mark.parametrize("chunking", ["lines", [], [0], [2, -1]])
def test_run_fixture_refuses_bad_chunking(chunking: str | list[int]) -> None:
    with pytest.raises(ValueError, match="chunking"):
        run_fixture(by_name("ok/minimal"), chunking=chunking)


def test_conformance_json_ships_as_package_data() -> None:
    resource = resources.files("runtime.contracts.conformance").joinpath("v1.json")
    assert resource.is_file()
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["runtime.contracts"]
    assert any(fnmatch.fnmatch("conformance/v1.json", p) for p in patterns)
