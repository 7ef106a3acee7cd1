"""What one request may ask of the server: body sizes, tokens and text lengths."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class ServeLimits:
    """Bounds checked before a request reaches a pipeline (413 or 400 naming the limit).

    ``max_json_bytes`` bounds the JSON body of the chat and speech endpoints,
    ``max_npz_bytes`` the ``.npz`` body of ``/v1/omni/run``, ``max_audio_bytes`` the multipart
    body of ``/v1/audio/transcriptions`` (OpenAI's own limit is 25 MB); ``max_tokens`` caps a chat
    request's ``max_tokens`` (a model's own ``max_model_len`` may cap it lower);
    ``max_prompt_chars`` bounds the text of all messages together and ``max_speech_chars``
    the ``input`` of a speech request (OpenAI's own limit is 4,096).
    """

    max_json_bytes: int = 1 * MiB
    max_npz_bytes: int = 64 * MiB
    max_audio_bytes: int = 25 * MiB
    max_tokens: int = 4096
    max_prompt_chars: int = 100_000
    max_speech_chars: int = 4096
    max_messages: int = 256
