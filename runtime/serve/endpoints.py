"""Every endpoint the server answers, in one place: the 404 answer and the studio's Serve
panel list them from here (a test holds the application's routes to it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint: its method, path and what it serves."""

    method: str
    path: str
    what: str

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


ENDPOINTS: Final = (
    Endpoint("GET", "/v1/models", "every pipeline as a model"),
    Endpoint("GET", "/v1/models/{model}", "one model"),
    Endpoint("POST", "/v1/chat/completions", "chat with a language-model pipeline"),
    Endpoint("POST", "/v1/embeddings", "embeddings of texts"),
    Endpoint("POST", "/v1/audio/speech", "speech from text"),
    Endpoint("POST", "/v1/audio/transcriptions", "text from speech"),
    Endpoint("GET", "/v1/realtime", "a realtime session over a WebSocket"),
    Endpoint("POST", "/v1/omni/run", "a graph pipeline: .npz in, .npz out"),
    Endpoint("GET", "/v1/omni/pipelines", "each pipeline's state, in flight and queued"),
    Endpoint("GET", "/metrics", "Prometheus metrics"),
)
#: The paths, in the order above, each once.
PATHS: Final = tuple(dict.fromkeys(endpoint.path for endpoint in ENDPOINTS))
