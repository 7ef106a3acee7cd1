"""The Serve panel's switch: the open pipeline served on localhost from a background thread,
its address shown, the requests it answered counted; switched off, nothing is left."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.models import RunState


def test_without_the_server_in_the_build_the_switch_stays_off_and_says_why(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path, monkeypatch: Any
) -> None:
    import app.bridge

    # What the desktop build does: runtime.serve is left out of it.
    monkeypatch.setattr(
        app.bridge, "serve_unavailable_reason", lambda: "this build has no HTTP server"
    )
    window = make_window()
    with qtbot.waitSignal(window.bridge.pipeline_opened, timeout=30_000):
        window.open_path(demo_root / "pipelines" / "add.yaml")
    assert not window.serve_panel.switch.isEnabled()
    assert window.serve_panel.address_label.text() == "this build has no HTTP server"
    assert not window.bridge.start_serving()
    assert window.bridge.serve_view.state == "failed"


def test_the_serve_switch_serves_the_open_pipeline_and_counts_requests(
    make_window: Callable[..., Any], qtbot: Any, demo_root: Path
) -> None:
    window = make_window()
    window.bridge.serve_port = 0
    panel = window.serve_panel
    assert not panel.switch.isEnabled()
    with qtbot.waitSignal(window.bridge.pipeline_opened, timeout=30_000):
        window.open_path(demo_root / "pipelines" / "add.yaml")
    window.show_panel("serve")
    assert panel.switch.isEnabled()

    panel.switch.setChecked(True)
    qtbot.waitUntil(lambda: window.bridge.serve_view.state == "serving", timeout=60_000)
    address = window.bridge.serve_view.address
    assert address is not None
    assert address.startswith("http://127.0.0.1:")
    assert address in panel.address_label.text()
    assert "demo_add" in panel.address_label.text()

    with httpx.Client(base_url=address, timeout=30) as client:
        models = client.get("/models").json()
        inputs = io.BytesIO()
        np.savez(inputs, a=np.ones((1, 1024), np.float32), b=np.ones((1, 1024), np.float32))
        ran = client.post("/omni/run", params={"model": "demo_add"}, content=inputs.getvalue())
    assert [(m["id"], m["kind"]) for m in models["data"]] == [("demo_add", "graph")]
    assert ran.status_code == 200, ran.text
    with np.load(io.BytesIO(ran.content), allow_pickle=False) as outputs:
        assert float(outputs["sum"].min()) == 2.0
    qtbot.waitUntil(lambda: panel.count_label.text() == "2 requests served", timeout=10_000)
    lines = [panel.requests.item(row).text() for row in range(panel.requests.count())]
    assert lines[0].startswith("200  GET /v1/models")
    assert lines[1].startswith("200  POST /v1/omni/run  demo_add")
    # The studio's own run is not held up by the server (opening it loaded its stages).
    assert window.bridge.state in (RunState.READY, RunState.LOADED)

    panel.switch.setChecked(False)
    qtbot.waitUntil(lambda: window.bridge.serve_view.state == "stopped", timeout=60_000)
    assert panel.address_label.text() == "not serving"
    with httpx.Client(timeout=5) as client:
        try:
            client.get(f"{address}/models")
        except httpx.ConnectError:
            pass
        else:
            raise AssertionError("the server still answers after the switch was turned off")
