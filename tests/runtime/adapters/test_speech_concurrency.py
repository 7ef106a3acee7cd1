"""A voice's pipeline running several requests at once (``concurrent_requests``): one
request's acoustic call runs while another's decoder call runs, each stage one call at a
time, and every request speaks exactly what it speaks alone."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from runtime.adapters.tts import (
    MAX_CONCURRENT_REQUESTS,
    SpeechAdapter,
    SpeechOptions,
    SpeechOptionsError,
)
from runtime.api import Omni
from runtime.backends.threads import plan_threads, usable_cores
from runtime.devices import DeviceSelection, discover_topology
from runtime.errors import RequestCancelled, ResourceUnavailable
from tests.helpers.engine import engine_of
from tests.helpers.voice import speak_config

if TYPE_CHECKING:
    from runtime.api import RequestHandle
    from runtime.config import PipelineConfig
    from tests.helpers.voice import Exported

#: Two utterances: the first request's decoder is still busy when the second's acoustic call
#: runs.
FIRST = "The river runs past the mountain. It is cold and clear in the morning."
SECOND = "A second voice asks for the way home."


def _config(exported: Exported, requests: int) -> PipelineConfig:
    return speak_config(exported, scales="deterministic", concurrent_requests=requests)


def _omni(config: PipelineConfig) -> Omni:
    return Omni(config, topology=discover_topology(), selection=DeviceSelection())


class _Spoken:
    """One request's audio and final metrics, read to the end on a thread of its own."""

    def __init__(self, handle: RequestHandle) -> None:
        self.handle = handle
        self.chunks: list[np.ndarray] = []
        self.metrics: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self) -> None:
        try:
            for output in self.handle:
                self.chunks.append(np.array(output.outputs["pcm"], copy=True))
                if output.finished:
                    self.metrics = dict(output.metrics)
        except BaseException as exc:  # handed to the test's thread
            self.error = exc

    def result(self) -> np.ndarray:
        self.thread.join(60)
        assert not self.thread.is_alive(), "the request did not end"
        if self.error is not None:
            raise self.error
        return np.concatenate(self.chunks)


def _one_at_a_time(omni: Omni, text: str) -> np.ndarray:
    return np.concatenate(
        [np.array(output.outputs["pcm"], copy=True) for output in omni.generate(text)]
    )


def _active(step: dict[str, Any]) -> tuple[float, float]:
    """When a call had the stage: from the end of its wait for its turn to its result."""
    return step["started_at"] + step["queue_s"], step["started_at"] + step["wall_s"]


def test_two_requests_overlap_their_stages_and_speak_as_they_do_alone(
    exported: Exported,
) -> None:
    with _omni(_config(exported, 2)) as omni:
        assert omni.session.concurrency == 2
        first = _Spoken(omni.session.submit(FIRST))
        second = _Spoken(omni.session.submit(SECOND))
        together = first.result(), second.result()
        alone = _one_at_a_time(omni, FIRST), _one_at_a_time(omni, SECOND)
        threads = [stage.to_json()["threads"] for stage in omni.execution_plan.stages]
    for both, single in zip(together, alone, strict=True):
        assert np.array_equal(both, single), "a request spoke differently beside another"
    decoding = [_active(s) for s in first.metrics["steps"] if s["stage"] == "decoder"]
    acoustic = [_active(s) for s in second.metrics["steps"] if s["stage"] == "acoustic"]
    assert any(
        a_start < d_end and d_start < a_end
        for a_start, a_end in acoustic
        for d_start, d_end in decoding
    ), f"the second request's acoustic calls {acoustic} ran beside none of {decoding}"
    assert [t["applied_intra_op_threads"] for t in threads] == [1, usable_cores()]
    assert not any(t["applied_allow_spinning"] for t in threads)
    assert all(t["overlaps"] for t in threads)


def test_beyond_its_requests_at_once_a_voice_refuses_naming_the_option(
    exported: Exported,
) -> None:
    with _omni(_config(exported, 2)) as omni:
        running = [_Spoken(omni.session.submit(FIRST)) for _ in range(2)]
        with pytest.raises(ResourceUnavailable, match=r"runs 2 requests at a time \(concurrent"):
            omni.session.submit(SECOND)
        for spoken in running:
            spoken.result()


def test_a_request_cancelled_while_it_waits_its_turn_retires_nothing(
    exported: Exported,
) -> None:
    with _omni(_config(exported, 2)) as omni:
        workers = [client.record().to_json()["worker"] for client in engine_of(omni).clients]
        first = _Spoken(omni.session.submit(FIRST))
        second = _Spoken(omni.session.submit(SECOND))
        # The second request's first call waits for the first's acoustic call, or has not
        # begun: either way no call of its is running, so no worker is retired.
        assert omni.session.cancel(second.handle.request_id)
        with pytest.raises(RequestCancelled):
            second.result()
        spoken = first.result()
        assert np.array_equal(spoken, _one_at_a_time(omni, FIRST))
        assert [client.record().to_json()["worker"] for client in engine_of(omni).clients] == (
            workers
        )


def test_the_plan_gives_the_acoustic_stage_one_thread_when_requests_overlap(
    exported: Exported,
) -> None:
    config = _config(exported, 2)
    assert config.adapter is not None
    adapter = SpeechAdapter(config, config.adapter.options)
    assert adapter.concurrent_requests == 2
    acoustic, decoder = (stage.name for stage in config.stages)
    for cores in (2, 8):
        plans = plan_threads(config, cores, requests=2, single_thread=[acoustic])
        assert plans[acoustic].intra_op_threads == 1
        assert plans[decoder].intra_op_threads == cores
        assert not any(plan.allow_spinning for plan in plans.values())
        assert all(plan.overlaps and plan.spin_wait_us == 0 for plan in plans.values())
    # One request at a time: the plan is what it always was, every core each, in turn.
    alone = plan_threads(config, 2, requests=1, single_thread=[acoustic])
    assert [plan.intra_op_threads for plan in alone.values()] == [2, 2]
    assert all(plan.allow_spinning and not plan.overlaps for plan in alone.values())


@pytest.mark.parametrize("requests", [0, MAX_CONCURRENT_REQUESTS + 1, "2", True, 1.5])
def test_a_bad_request_count_names_the_option_and_what_is_accepted(requests: object) -> None:
    with pytest.raises(SpeechOptionsError) as caught:
        SpeechOptions.parse({"voice": "joe", "concurrent_requests": requests})
    assert caught.value.key == "adapter.options.concurrent_requests"
    assert f"an integer from 1 to {MAX_CONCURRENT_REQUESTS}" in str(caught.value)


def test_a_voice_runs_one_request_at_a_time_unless_it_says_otherwise() -> None:
    assert SpeechOptions.parse({"voice": "joe"}).concurrent_requests == 1
    assert SpeechOptions.parse({"voice": "joe", "concurrent_requests": 3}).concurrent_requests == 3
