"""Request and event identities, and opaque state handles."""

from __future__ import annotations

import dataclasses
import re

import pytest

from runtime.contracts import EventId, RequestKey, StateHandle, new_request_id


def test_request_ids_are_random_and_url_safe() -> None:
    ids = {new_request_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"req-[0-9a-f]{16}", i) for i in ids)


def test_fencing_makes_older_epochs_stale() -> None:
    key = RequestKey("req-1")
    assert key.epoch == 0
    fenced = key.fenced()
    assert fenced == RequestKey("req-1", 1)
    assert key.is_stale(fenced)
    assert not fenced.is_stale(key)
    assert not fenced.is_stale(fenced)
    assert fenced.fenced().epoch == 2
    assert key.epoch == 0


def test_other_requests_are_never_stale() -> None:
    assert not RequestKey("req-1", 0).is_stale(RequestKey("req-2", 5))


def test_keys_order_by_id_then_epoch() -> None:
    keys = [RequestKey("b", 0), RequestKey("a", 2), RequestKey("a", 1)]
    assert sorted(keys) == [RequestKey("a", 1), RequestKey("a", 2), RequestKey("b", 0)]


def test_keys_are_frozen_hashable_values() -> None:
    key = RequestKey("req-1", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.epoch = 4  # type: ignore[misc]
    assert {key: 1}[RequestKey("req-1", 3)] == 1
    assert key.to_wire() == {"request_id": "req-1", "epoch": 3}


def test_key_validation() -> None:
    with pytest.raises(ValueError, match="request_id must be a non-empty string"):
        RequestKey("")
    with pytest.raises(ValueError, match="epoch -1 must be >= 0"):
        RequestKey("req-1", -1)


def test_event_ids() -> None:
    event = EventId(RequestKey("req-1", 2), 7)
    assert event.key.epoch == 2
    assert event.sequence == 7
    with pytest.raises(ValueError, match="sequence -1 must be >= 0"):
        EventId(RequestKey("req-1"), -1)


def test_state_handles_are_opaque_and_conservative() -> None:
    first = StateHandle("llm")
    second = StateHandle("llm")
    assert re.fullmatch(r"[0-9a-f]{32}", first.token)
    assert first.token != second.token
    assert not first.replayable
    assert not first.migratable
    assert first.to_wire() == {
        "owner": "llm",
        "token": first.token,
        "replayable": False,
        "migratable": False,
    }
    explicit = StateHandle("asr", token="t1", replayable=True)
    assert explicit.to_wire()["replayable"] is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        explicit.migratable = True  # type: ignore[misc]


def test_state_handle_validation() -> None:
    with pytest.raises(ValueError, match="needs an owner"):
        StateHandle("")
    with pytest.raises(ValueError, match="needs a token"):
        StateHandle("llm", token="")
