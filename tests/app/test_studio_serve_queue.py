"""The Serve panel lists every endpoint the server answers (from the server's own list) and
each pipeline's queue, live: a request waiting for a busy pipeline shows, and goes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from runtime.serve.endpoints import ENDPOINTS
from tests.runtime.engine.support import StageSpec, loop_request_npz, write_pipeline
from tests.workers.support import make_loop_bundle

#: Loop steps of a call that lasts seconds on two cores.
LONG_STEPS = 2500


def test_the_serve_panel_lists_the_endpoints_and_shows_the_queue_live(
    make_window: Callable[..., Any], qtbot: Any, tmp_path: Path
) -> None:
    pipeline = write_pipeline(
        tmp_path / "loop.yaml", StageSpec(make_loop_bundle(tmp_path), max_io="4MiB"), name="loop"
    )
    window = make_window()
    window.bridge.serve_port = 0
    panel = window.serve_panel
    with qtbot.waitSignal(window.bridge.pipeline_opened, timeout=30_000):
        window.open_path(pipeline)
    window.show_panel("serve")
    panel.switch.setChecked(True)
    qtbot.waitUntil(lambda: window.bridge.serve_view.state == "serving", timeout=60_000)
    address = window.bridge.serve_view.address
    assert address is not None

    listed = panel.endpoints_label.text().splitlines()
    assert listed == [f"{endpoint.method} {endpoint.path}" for endpoint in ENDPOINTS]
    for path in ("/v1/embeddings", "/v1/realtime", "/metrics", "/v1/omni/pipelines"):
        assert any(line.endswith(f" {path}") for line in listed), path
    assert panel.queue_label.text() == "queued: loop 0 of 16"

    answers: list[int] = []

    def post(steps: int) -> None:
        with httpx.Client(base_url=address, timeout=120) as client:
            answers.append(
                client.post(
                    "/omni/run", params={"model": "loop"}, content=loop_request_npz(steps)
                ).status_code
            )

    def in_flight() -> int:
        with httpx.Client(base_url=address, timeout=30) as client:
            return int(client.get("/omni/pipelines").json()["data"][0]["in_flight"])

    first = threading.Thread(target=post, args=(LONG_STEPS,))
    first.start()
    qtbot.waitUntil(lambda: in_flight() == 1, timeout=30_000)
    second = threading.Thread(target=post, args=(1,))
    second.start()
    try:
        qtbot.waitUntil(lambda: panel.queue_label.text() == "queued: loop 1 of 16", timeout=30_000)
        qtbot.waitUntil(lambda: panel.queue_label.text() == "queued: loop 0 of 16", timeout=90_000)
    finally:
        first.join(120)
        second.join(120)
    assert answers == [200, 200]

    panel.switch.setChecked(False)
    qtbot.waitUntil(lambda: window.bridge.serve_view.state == "stopped", timeout=60_000)
    assert panel.endpoints_label.text() == ""
    assert panel.queue_label.text() == ""
