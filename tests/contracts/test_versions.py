"""Protocol version and feature negotiation."""

from __future__ import annotations

import pytest

from runtime.contracts import (
    KNOWN_FEATURES,
    PROTOCOL_VERSION,
    FeatureError,
    Negotiated,
    check_required,
    negotiate,
)


def test_the_wire_names_are_stable() -> None:
    assert PROTOCOL_VERSION == 1
    assert (
        frozenset(
            {
                "inline-buffers",
                "shm-buffers",
                "shm-arena",
                "binary-header",
                "cancel",
                "placement-report",
                "text-stream",
            }
        )
        == KNOWN_FEATURES
    )


def test_negotiate_agrees_on_required_and_shared_offered_features() -> None:
    agreed = negotiate(1, ["shm-buffers"], ["cancel", "x-future", "text-stream"])
    assert agreed == Negotiated(1, frozenset({"shm-buffers", "cancel", "text-stream"}))


def test_unknown_offered_features_are_ignored() -> None:
    assert negotiate(1, [], ["x-future"]).features == frozenset()


def test_unknown_required_features_are_refused_by_name() -> None:
    with pytest.raises(FeatureError) as info:
        negotiate(1, ["zeta", "cancel", "alpha"], [])
    assert info.value.unknown == ("alpha", "zeta")
    message = str(info.value)
    assert "alpha, zeta" in message
    assert "this side implements: binary-header, cancel, inline-buffers" in message


@pytest.mark.parametrize("version", [0, 2, True, 1.0, "1"])
def test_other_versions_are_refused(version: object) -> None:
    with pytest.raises(FeatureError) as info:
        negotiate(version, [], [])  # type: ignore[arg-type]
    assert "this side speaks 1" in str(info.value)
    assert info.value.unknown == ()


def test_check_required_against_a_custom_set() -> None:
    check_required(["a"], frozenset({"a", "b"}))
    check_required([])
    with pytest.raises(FeatureError) as info:
        check_required(["b", "c"], frozenset({"a", "b"}))
    assert info.value.unknown == ("c",)


def test_negotiate_with_a_custom_known_set() -> None:
    agreed = negotiate(1, ["a"], ["b", "cancel"], known=frozenset({"a", "b"}))
    assert agreed.features == frozenset({"a", "b"})
    with pytest.raises(FeatureError):
        negotiate(1, ["cancel"], [], known=frozenset({"a"}))
