"""The server's request validation without a server: each refusal names the field, the
value and what is accepted; the chat templates; the safe-address rules."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.chat import FALLBACK, ChatTemplate
from runtime.errors import ResourceUnavailable, StageRetired, UsageError
from runtime.serve import ServeLimits, ServeOptions, is_loopback, resolve_api_key
from runtime.serve.app import wav_header
from runtime.serve.errors import ApiError, from_runtime_error
from runtime.serve.requests import (
    ChatMessage,
    decode_json,
    dump_npz,
    load_npz,
    parse_chat_request,
    parse_speech_request,
)

LIMITS = ServeLimits(max_tokens=256, max_prompt_chars=50, max_speech_chars=20, max_messages=3)
USER = [{"role": "user", "content": "Hello"}]


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": USER, **fields}


def _refused(call: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args)
    assert caught.value.status == 400
    return caught.value


def test_a_chat_request_parses_into_its_sampling_options() -> None:
    request = parse_chat_request(
        _chat(
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=12,
            temperature=0,
            top_p=0.5,
            stop="\n",
            seed=7,
            user="someone",
        ),
        LIMITS,
    )
    assert request.stream
    assert request.include_usage
    assert request.messages == (ChatMessage("user", "Hello"),)
    assert request.sampling == {
        "max_tokens": 12,
        "temperature": 0.0,
        "top_p": 0.5,
        "seed": 7,
        "stop": ("\n",),
    }
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    request = parse_chat_request(_chat(messages=[{"role": "user", "content": parts}]), LIMITS)
    assert request.messages[0].content == "Hello"


@pytest.mark.parametrize(
    ("fields", "param", "expected"),
    [
        ({"model": None}, "model", "'model' is None; accepted: the name of a served pipeline"),
        ({"model": 3}, "model", "'model' is 3"),
        ({"messages": None}, "messages", "'messages' is missing; accepted: a non-empty list"),
        ({"messages": []}, "messages", "'messages' is empty"),
        ({"messages": "hi"}, "messages", "'messages' is str"),
        ({"messages": USER * 4}, "messages", "'messages' has 4 entries; accepted: at most 3"),
        ({"messages": ["hi"]}, "messages[0]", "messages[0] is str; accepted: an object"),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            "messages[0].role",
            "messages[0].role is 'tool'; accepted: system, developer, user, assistant",
        ),
        (
            {"messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
            "messages[0].content is int; accepted: a string or a list of text parts",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
            "is not a text part",
        ),
        (
            {"messages": [{"role": "user", "content": "x" * 51}]},
            "messages",
            "the messages hold 51 characters; accepted: at most 50",
        ),
        ({"messages": [{"role": "user", "content": "  "}]}, "messages", "every message is empty"),
        ({"stream": "yes"}, "stream", "'stream' is 'yes'; accepted: true or false"),
        ({"stream_options": {"other": 1}}, "stream_options", "accepted: {'include_usage'"),
        ({"max_tokens": 0}, "max_tokens", "'max_tokens' is 0; accepted: an integer in [1, 256]"),
        (
            {"max_tokens": 257},
            "max_tokens",
            "'max_tokens' is 257; accepted: an integer in [1, 256]",
        ),
        ({"max_tokens": 2.5}, "max_tokens", "'max_tokens' is 2.5"),
        ({"max_completion_tokens": 999}, "max_completion_tokens", "in [1, 256]"),
        ({"temperature": 3}, "temperature", "'temperature' is 3; accepted: a number in [0, 2]"),
        ({"temperature": True}, "temperature", "'temperature' is True"),
        ({"top_p": 0}, "top_p", "'top_p' is 0; accepted: a number in (0, 1]"),
        ({"seed": -1}, "seed", "'seed' is -1; accepted: an integer in [0,"),
        ({"stop": ["a"] * 5}, "stop", "accepted: a non-empty string or a list of 1 to 4"),
        ({"stop": [""]}, "stop", "'stop' is ['']"),
        ({"n": 2}, "n", "'n' is 2; accepted: an integer in [1, 1]"),
        ({"logprobs": True}, "logprobs", "unknown field 'logprobs'; accepted: model, messages"),
    ],
)
def test_each_chat_field_is_checked(fields: dict[str, Any], param: str, expected: str) -> None:
    document = _chat(**fields)
    if document.get("messages") is None:
        del document["messages"]
    error = _refused(parse_chat_request, document, LIMITS)
    assert error.param == param
    assert expected in error.message
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_a_speech_request_parses_and_each_field_is_checked() -> None:
    voices = {"speak": ("joe",)}
    request = parse_speech_request(
        {"model": "speak", "input": "Hello there.", "voice": "joe", "response_format": "pcm"},
        LIMITS,
        voices,
    )
    assert (request.voice, request.response_format) == ("joe", "pcm")
    default = parse_speech_request({"model": "speak", "input": "Hi."}, LIMITS, voices)
    assert (default.voice, default.response_format) == ("joe", "wav")
    cases = [
        ({"input": ""}, "input", "'input' is empty; accepted: text to speak"),
        ({"input": None}, "input", "'input' is None"),
        ({"input": "x" * 21}, "input", "'input' has 21 characters; accepted: at most 20"),
        ({"voice": "alloy"}, "voice", "'voice' is 'alloy'; accepted: joe"),
        ({"response_format": "mp3"}, "response_format", "accepted: wav, pcm"),
        ({"speed": 2}, "speed", "'speed' is 2; accepted: 1.0"),
        ({"volume": 1}, "volume", "unknown field 'volume'"),
    ]
    for fields, param, expected in cases:
        document = {"model": "speak", "input": "Hi.", "voice": "joe", **fields}
        error = _refused(parse_speech_request, document, LIMITS, voices)
        assert error.param == param, fields
        assert expected in error.message, fields


def test_bodies_that_are_not_json_objects_or_npz_archives_are_refused() -> None:
    assert decode_json(b'{"a": 1}') == {"a": 1}
    assert _refused(decode_json, b"{nope").code == "invalid_json"
    assert "accepted: a JSON object" in _refused(decode_json, b"[1]").message
    assert _refused(decode_json, b"\xff").code == "invalid_json"
    arrays = {"x": np.arange(3, dtype=np.float32)}
    np.testing.assert_array_equal(load_npz(dump_npz(arrays))["x"], arrays["x"])
    assert _refused(load_npz, b"garbage").code == "invalid_npz"
    single = io.BytesIO()
    np.save(single, np.zeros(2))
    assert "a single .npy array" in _refused(load_npz, single.getvalue()).message
    pickled = io.BytesIO()
    np.savez(pickled, x=np.array([{"a": 1}], dtype=object))
    assert "without object arrays" in _refused(load_npz, pickled.getvalue()).message
    empty = io.BytesIO()
    np.savez(empty)
    assert "holds no arrays" in _refused(load_npz, empty.getvalue()).message


def _zip_entry_with(body: bytes, *, flags: int = 0, method: int | None = None) -> bytes:
    """``body`` (a one-entry .npz) with the entry's flag bits or compression method changed
    in its local and central headers, as a damaged or foreign archive would have them."""
    data = bytearray(body)
    for signature, flag_at, method_at in ((b"PK\x03\x04", 6, 8), (b"PK\x01\x02", 8, 10)):
        start = data.index(signature)
        data[start + flag_at : start + flag_at + 2] = (
            int.from_bytes(data[start + flag_at : start + flag_at + 2], "little") | flags
        ).to_bytes(2, "little")
        if method is not None:
            data[start + method_at : start + method_at + 2] = method.to_bytes(2, "little")
    return bytes(data)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"flags": 0x1}, "encrypted"),  # zipfile: RuntimeError, a password is required
        ({"flags": 0x40}, "strong encryption"),  # NotImplementedError
        ({"flags": 0x20}, "compressed patched data"),  # NotImplementedError
        ({"method": 99}, "compression method"),  # NotImplementedError
    ],
)
def test_an_archive_zipfile_cannot_read_is_a_typed_refusal(
    change: dict[str, int], said: str
) -> None:
    """Found by the request fuzzer: entries zipfile refuses (encrypted, an unsupported
    compression method or flag) once escaped as a 500."""
    body = _zip_entry_with(dump_npz({"x": np.arange(3, dtype=np.float32)}), **change)
    refused = _refused(load_npz, body)
    assert refused.code == "invalid_npz"
    assert said in refused.message
    assert "accepted: numpy.savez output" in refused.message


def test_runtime_errors_map_to_statuses_with_their_message() -> None:
    busy = from_runtime_error(ResourceUnavailable("pipeline x is busy"))
    assert (busy.status, busy.headers, busy.code) == (429, {"Retry-After": "1"}, "pipeline_busy")
    assert busy.body()["error"]["message"] == "pipeline x is busy"
    assert from_runtime_error(UsageError("bad")).status == 400
    restarting = from_runtime_error(StageRetired("stage-0 is unusable"))
    assert (restarting.status, restarting.headers["Retry-After"]) == (503, "5")


def test_a_loopback_host_needs_no_key_and_any_other_host_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host)
        assert resolve_api_key(host, None) is None
    for host in ("0.0.0.0", "192.168.1.4", "::", "example.org"):
        assert not is_loopback(host)
        with pytest.raises(UsageError, match="--api-key-env VAR"):
            resolve_api_key(host, None)
    monkeypatch.delenv("OMNI_TEST_KEY", raising=False)
    with pytest.raises(UsageError, match="OMNI_TEST_KEY: the variable is not set"):
        resolve_api_key("0.0.0.0", "OMNI_TEST_KEY")
    monkeypatch.setenv("OMNI_TEST_KEY", " ")
    with pytest.raises(UsageError, match="OMNI_TEST_KEY: the variable is empty"):
        resolve_api_key("0.0.0.0", "OMNI_TEST_KEY")
    monkeypatch.setenv("OMNI_TEST_KEY", "secret")
    assert resolve_api_key("0.0.0.0", "OMNI_TEST_KEY") == "secret"
    with pytest.raises(UsageError, match="accepted: an API key with it"):
        ServeOptions(host="0.0.0.0")
    with pytest.raises(UsageError, match="accepted: 0 to 65535"):
        ServeOptions(port=70000)


def test_the_chat_template_of_a_model_directory_and_the_fallback(tmp_path: Path) -> None:
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    fallback = ChatTemplate.from_model_dir(tmp_path)
    assert fallback.source == FALLBACK
    assert fallback.render(messages) == "system: Be brief.\nuser: Hi\nassistant:"
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "add_bos_token": True,
                "chat_template": "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>"
                "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>"
                "{% endif %}",
            }
        ),
        encoding="utf-8",
    )
    template = ChatTemplate.from_model_dir(tmp_path)
    # The engine adds the BOS token itself when it tokenizes the prompt.
    assert template.render(messages) == "<|system|>Be brief.\n<|user|>Hi\n<|assistant|>"
    (tmp_path / "chat_template.jinja").write_text(
        "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}ok",
        encoding="utf-8",
    )
    with pytest.raises(UsageError, match="the model's chat template refused the messages"):
        ChatTemplate.from_model_dir(tmp_path).render(messages)


def test_a_streamed_wav_header_declares_an_unknown_size() -> None:
    header = wav_header(22050)
    assert len(header) == 44
    assert header[:4] == b"RIFF"
    assert header[8:16] == b"WAVEfmt "
    assert header[40:44] == b"\xff\xff\xff\xff"
    sized = wav_header(16000, data_bytes=100)
    assert sized[4:8] == (136).to_bytes(4, "little")
