"""The language-model worker protocol: exact round trips and every refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.contracts.buffers import BufferDescriptor, DType
from runtime.contracts.codec import decode_frame, encode_frame
from runtime.contracts.llm_messages import (
    CONTROLLER_TO_LLM_WORKER,
    LLM_MESSAGE_TYPES,
    LLM_WORKER_TO_CONTROLLER,
    AbortMessage,
    DeltaMessage,
    EngineArgs,
    GenerateMessage,
    LlmErrorMessage,
    LlmLoadMessage,
    LlmReadyMessage,
    LlmStatsMessage,
    SamplingSpec,
    StatsMessage,
    decode_llm_message,
)
from runtime.contracts.messages import (
    ByeMessage,
    HelloMessage,
    Message,
    MessageError,
    ShutdownMessage,
)
from runtime.contracts.versions import KNOWN_FEATURES, PROTOCOL_VERSION

ARGS = EngineArgs(
    dtype="float32", max_model_len=512, max_num_seqs=4, kv_cache_memory_bytes=64 << 20, seed=7
)


def sample_messages() -> list[Message]:
    return [
        LlmLoadMessage(model_dir="/models/tiny", engine_args=ARGS),
        GenerateMessage(
            "req-1",
            0,
            "Once upon a time",
            None,
            SamplingSpec(max_tokens=16, temperature=0.0, stop=("\n",), seed=3),
        ),
        GenerateMessage("req-2", 3, None, (1, 2, 3), SamplingSpec(ignore_eos=True)),
        AbortMessage("req-1", 0),
        StatsMessage(),
        ShutdownMessage(),
        HelloMessage(
            protocol_version=PROTOCOL_VERSION,
            required_features=("text-stream",),
            offered_features=tuple(sorted(KNOWN_FEATURES)),
            worker="vllm",
            pid=4242,
            create_time=1700000000.25,
            generation=1,
        ),
        LlmReadyMessage(
            model="/models/tiny",
            vllm_version="0.32.0",
            device="cpu",
            max_num_seqs=4,
            max_model_len=512,
            rss_bytes=2 << 30,
            pss_bytes=3 << 29,
            processes=4,
            load_s=14.5,
            engine_args=ARGS,
        ),
        DeltaMessage("req-1", 0, " river", (17, 400), False, None),
        DeltaMessage("req-1", 0, "", (), True, "abort"),
        LlmStatsMessage(rss_bytes=1 << 30, pss_bytes=1 << 29, processes=4, in_flight=2),
        LlmErrorMessage("req-1", 0, "request_failed", "bad prompt", False),
        LlmErrorMessage(None, None, "engine_died", "gone", True),
        ByeMessage(),
    ]


@pytest.mark.parametrize("message", sample_messages(), ids=lambda m: m.KIND)
def test_every_message_survives_a_frame_round_trip(message: Message) -> None:
    frame = decode_frame(encode_frame(message.KIND, message.to_body()))
    decoded = decode_llm_message(frame)
    assert decoded == message
    # The body is plain JSON: nested values are objects, tuples are lists.
    json.dumps(message.to_body())


def test_every_kind_is_in_exactly_one_direction() -> None:
    kinds = set(LLM_MESSAGE_TYPES)
    assert CONTROLLER_TO_LLM_WORKER | LLM_WORKER_TO_CONTROLLER == kinds
    assert not CONTROLLER_TO_LLM_WORKER & LLM_WORKER_TO_CONTROLLER
    assert {m.KIND for m in sample_messages()} == kinds


def test_nested_values_travel_as_objects() -> None:
    body = GenerateMessage("r", 0, None, (5,), SamplingSpec(stop=("a",))).to_body()
    assert body["prompt_token_ids"] == [5]
    assert body["sampling"]["stop"] == ["a"]
    assert body["sampling"]["max_tokens"] == 64
    load = LlmLoadMessage("/m", ARGS).to_body()
    assert load["engine_args"]["kv_cache_memory_bytes"] == 64 << 20


def _decode(kind: str, body: Any, buffers: int = 0) -> Message:
    descriptors = [BufferDescriptor.for_array("x", 0, DType.UINT8, (1,)) for _ in range(buffers)]
    return decode_llm_message(
        decode_frame(encode_frame(kind, body, [(d, b"\x00") for d in descriptors]))
    )


def test_unknown_and_wrong_direction_kinds_are_refused() -> None:
    with pytest.raises(MessageError, match="unknown message kind 'call'") as caught:
        _decode("call", {})
    assert caught.value.code == "unknown_kind"
    frame = decode_frame(
        encode_frame("delta", DeltaMessage("r", 0, "x", (), False, None).to_body())
    )
    with pytest.raises(MessageError) as wrong:
        decode_llm_message(frame, CONTROLLER_TO_LLM_WORKER)
    assert wrong.value.code == "unexpected_kind"


def test_buffers_are_refused() -> None:
    with pytest.raises(MessageError) as caught:
        _decode("stats", {}, buffers=1)
    assert caught.value.code == "buffer_count"


@pytest.mark.parametrize(
    ("kind", "body", "code", "fragment"),
    [
        ("abort", {"request_id": "r"}, "missing_field", "epoch"),
        ("abort", {"request_id": "r", "epoch": 0, "x": 1}, "unknown_field", "'x'"),
        ("abort", {"request_id": "", "epoch": 0}, "bad_field", "abort.request_id"),
        ("abort", {"request_id": "r", "epoch": -1}, "bad_field", "abort.epoch"),
        (
            "llm_load",
            {"model_dir": "/m", "engine_args": {"dtype": "auto"}},
            "missing_field",
            "engine_args",
        ),
        (
            "llm_load",
            {"model_dir": "/m", "engine_args": {**ARGS.to_wire(), "quantization": "awq"}},
            "unknown_field",
            "quantization",
        ),
        (
            "llm_load",
            {"model_dir": "/m", "engine_args": {**ARGS.to_wire(), "dtype": "int4"}},
            "bad_field",
            "engine_args.dtype",
        ),
        (
            "llm_load",
            {"model_dir": "/m", "engine_args": {**ARGS.to_wire(), "gpu_memory_utilization": 0.5}},
            "bad_field",
            "kv_cache_memory_bytes is set",
        ),
        (
            "llm_load",
            {"model_dir": "/m", "engine_args": {**ARGS.to_wire(), "max_num_seqs": 0}},
            "bad_field",
            "max_num_seqs",
        ),
        (
            "generate",
            {
                "request_id": "r",
                "epoch": 0,
                "prompt": "x",
                "prompt_token_ids": [1],
                "sampling": SamplingSpec().to_wire(),
            },
            "bad_field",
            "exactly one of prompt",
        ),
        (
            "generate",
            {
                "request_id": "r",
                "epoch": 0,
                "prompt": None,
                "prompt_token_ids": [],
                "sampling": SamplingSpec().to_wire(),
            },
            "bad_field",
            "prompt_token_ids",
        ),
        (
            "generate",
            {
                "request_id": "r",
                "epoch": 0,
                "prompt": "x",
                "prompt_token_ids": None,
                "sampling": {**SamplingSpec().to_wire(), "top_p": 0.0},
            },
            "bad_field",
            "sampling.top_p",
        ),
        (
            "generate",
            {
                "request_id": "r",
                "epoch": 0,
                "prompt": "x",
                "prompt_token_ids": None,
                "sampling": {**SamplingSpec().to_wire(), "max_tokens": 0},
            },
            "bad_field",
            "sampling.max_tokens",
        ),
        (
            "delta",
            {
                "request_id": "r",
                "epoch": 0,
                "text": "",
                "token_ids": [1],
                "finished": True,
                "finish_reason": "timeout",
            },
            "bad_field",
            "finish_reason",
        ),
        (
            "delta",
            {
                "request_id": "r",
                "epoch": 0,
                "text": "",
                "token_ids": [1],
                "finished": False,
                "finish_reason": "stop",
            },
            "bad_field",
            "null until the request is finished",
        ),
        (
            "delta",
            {
                "request_id": "r",
                "epoch": 0,
                "text": "",
                "token_ids": [True],
                "finished": False,
                "finish_reason": None,
            },
            "bad_field",
            "delta.token_ids",
        ),
        (
            "llm_error",
            {"request_id": "r", "epoch": None, "code": "x", "message": "", "fatal": False},
            "bad_field",
            "null exactly when request_id is null",
        ),
        (
            "llm_error",
            {"request_id": None, "epoch": None, "code": "x", "message": "", "fatal": 1},
            "bad_field",
            "llm_error.fatal",
        ),
        (
            "llm_stats",
            {"rss_bytes": 1, "pss_bytes": 1, "processes": 0, "in_flight": 0},
            "bad_field",
            "processes",
        ),
    ],
)
def test_malformed_bodies_are_refused_with_the_field_named(
    kind: str, body: dict[str, Any], code: str, fragment: str
) -> None:
    with pytest.raises(MessageError) as caught:
        _decode(kind, body)
    assert caught.value.code == code
    assert fragment in str(caught.value)


def test_sampling_spec_limits() -> None:
    with pytest.raises(MessageError, match="min_tokens"):
        SamplingSpec(max_tokens=4, min_tokens=5)
    with pytest.raises(MessageError, match=r"sampling\.seed"):
        SamplingSpec(seed=2**60)
    with pytest.raises(MessageError, match=r"sampling\.stop"):
        SamplingSpec(stop=("",))
    assert SamplingSpec(temperature=0).temperature == 0.0


def test_engine_args_gpu_utilization_is_a_fraction() -> None:
    assert EngineArgs(gpu_memory_utilization=1).gpu_memory_utilization == 1.0
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(MessageError, match="gpu_memory_utilization"):
            EngineArgs(gpu_memory_utilization=bad)


@given(
    text=st.text(max_size=50),
    tokens=st.lists(st.integers(min_value=0, max_value=2**53 - 1), max_size=20),
    epoch=st.integers(min_value=0, max_value=2**31),
)
def test_deltas_round_trip_any_text_and_tokens(text: str, tokens: list[int], epoch: int) -> None:
    message = DeltaMessage("req", epoch, text, tuple(tokens), False, None)
    frame = decode_frame(encode_frame(message.KIND, message.to_body()))
    assert decode_llm_message(frame, LLM_WORKER_TO_CONTROLLER) == message


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"avx512f", "avx512_bf16"}, "bfloat16"),
        ({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, "float32"),
        ({"avx2", "fma"}, "float32"),
        (set(), "float32"),
    ],
    ids=["bf16-without-amx", "amx", "no-avx512-bf16", "unknown"],
)
def test_fastest_is_bfloat16_only_on_cpus_that_compute_it_right(
    flags: set[str], expected: str
) -> None:
    from runtime.contracts.llm_messages import fastest_cpu_dtype

    assert fastest_cpu_dtype(frozenset(flags)) == expected


def test_cpu_flags_come_from_the_first_cpu_and_nothing_when_unreadable(tmp_path: Path) -> None:
    from runtime.contracts.llm_messages import DTYPES, FASTEST, EngineArgs, cpu_flags

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nflags\t\t: fpu avx512_bf16 sse2\n\nprocessor\t: 1\nflags\t\t: amx_bf16\n"
    )
    assert cpu_flags(str(cpuinfo)) == frozenset({"fpu", "avx512_bf16", "sse2"})
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()
    assert FASTEST in DTYPES
    assert EngineArgs(dtype=FASTEST).dtype == FASTEST
