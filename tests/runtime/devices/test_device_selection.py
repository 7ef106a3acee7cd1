"""Device selection: the settings file, and routes refused on excluded or absent devices."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from devices_testdata import LAPTOP, LAPTOP_WSL, TOPOLOGIES

from runtime.contracts.devices import DeviceKind
from runtime.devices import (
    ROUTE_TARGETS,
    DeviceSelection,
    check_route_device,
    config_dir,
    load_selection,
    load_topology,
    save_selection,
    selection_path,
)
from runtime.errors import ConfigError, DeviceExcluded, UsageError

if TYPE_CHECKING:
    from pathlib import Path

RTX = "GPU-5090a1b2-c3d4-4e5f-8a6b-7c8d9e0f1a2b"
RADEON = "LUID-00000000-0000F2A1"
NPU = "PCI-1022-17F0"
CPU = "CPU-AMD-Ryzen-AI-9-HX-370-w-Radeon-890M"


def test_the_config_dir_follows_the_environment_override(config_dir: Path) -> None:
    assert selection_path() == config_dir / "devices.json"


def test_without_the_override_the_platform_folder_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMNI_EDGE_CONFIG_DIR", raising=False)
    assert config_dir().name == "omni-edge-studio"


def test_no_settings_file_allows_every_device(config_dir: Path) -> None:
    selection = load_selection()
    assert selection.allowed is None
    assert selection.allows(RTX)
    assert not config_dir.exists()


def test_selection_is_saved_and_read_back(config_dir: Path) -> None:
    written = save_selection(DeviceSelection(frozenset({CPU, RADEON})))
    assert written == config_dir / "devices.json"
    assert json.loads(written.read_text()) == {"version": 1, "allowed": sorted({CPU, RADEON})}
    selection = load_selection()
    assert selection.allowed == frozenset({CPU, RADEON})
    assert not selection.allows(RTX)
    save_selection(DeviceSelection())
    assert load_selection().allowed is None
    assert [path.name for path in config_dir.iterdir()] == ["devices.json"]


def test_allow_and_exclude_work_against_a_topology() -> None:
    topology = load_topology(LAPTOP)
    everything = DeviceSelection()
    without_rtx = everything.exclude(topology, RTX)
    assert without_rtx.allowed == frozenset({CPU, RADEON, NPU})
    assert without_rtx.allow(topology, RTX).allowed == frozenset({CPU, RADEON, NPU, RTX})
    assert everything.allow(topology, RTX) == everything
    with pytest.raises(UsageError, match=r"no device 'GPU-typo'.*devices: CPU-"):
        everything.exclude(topology, "GPU-typo")


@pytest.mark.parametrize(
    ("text", "key", "line", "message"),
    [
        ('{"version": 1,\n "allowed": [1]}', "allowed", None, "list of physical device ids"),
        ('{"version": 1, "allowed": "all"}', "allowed", None, "list of physical device ids"),
        ('{"version": 1, "allowed": null, "theme": "dark"}', "theme", None, "unknown key"),
        ('{"version": 9, "allowed": null}', "version", None, "unsupported version"),
        ('{"version": 1,\n "allowed": [,]}', None, 2, "not valid JSON"),
        ("[]", None, None, "expected an object"),
    ],
)
def test_bad_settings_files_are_config_errors(
    config_dir: Path, text: str, key: str | None, line: int | None, message: str
) -> None:
    config_dir.mkdir()
    (config_dir / "devices.json").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as caught:
        load_selection()
    assert caught.value.file == str(config_dir / "devices.json")
    assert caught.value.key == key
    assert caught.value.line == line


@pytest.mark.parametrize(
    ("ep", "provider", "expected"),
    [
        ("cpu", "CPUExecutionProvider", CPU),
        ("cuda", "CUDAExecutionProvider", RTX),
        ("tensorrt", "TensorrtExecutionProvider", RTX),
        ("dml", "DmlExecutionProvider", RADEON),
        ("vitisai", "VitisAIExecutionProvider", NPU),
    ],
)
def test_each_route_finds_the_device_its_provider_targets(
    ep: str, provider: str, expected: str
) -> None:
    topology = load_topology(LAPTOP_WSL)
    device = check_route_device(
        topology, DeviceSelection(), ep=ep, target_provider=provider, stage="stage-0"
    )
    assert device.physical_id == expected


def test_a_route_on_an_excluded_device_is_refused_with_how_to_allow_it() -> None:
    topology = load_topology(LAPTOP)
    selection = DeviceSelection().exclude(topology, RTX)
    with pytest.raises(DeviceExcluded) as caught:
        check_route_device(
            topology, selection, ep="cuda", target_provider="CUDAExecutionProvider", stage="stage-1"
        )
    assert str(caught.value) == (
        f"stage-1 targets NVIDIA GeForce RTX 5090 Laptop GPU ({RTX}) which is excluded by your "
        f"device selection; allow it with `omni-edge devices --allow {RTX}` or in the studio's "
        "Devices panel"
    )
    assert caught.value.exit_code == 3
    cpu = check_route_device(
        topology, selection, ep="cpu", target_provider="CPUExecutionProvider", stage="stage-0"
    )
    assert cpu.kind is DeviceKind.CPU


def test_directml_falls_to_the_other_allowed_gpu() -> None:
    topology = load_topology(LAPTOP)
    selection = DeviceSelection().exclude(topology, RADEON)
    device = check_route_device(
        topology, selection, ep="dml", target_provider="DmlExecutionProvider", stage="stage-2"
    )
    assert device.physical_id == RTX
    with pytest.raises(DeviceExcluded, match=r"AMD Radeon 890M Graphics \(LUID-"):
        check_route_device(
            topology,
            selection,
            ep="dml",
            target_provider="DmlExecutionProvider",
            stage="stage-2",
            physical_id=RADEON,
        )


def test_a_provider_no_device_offers_is_refused() -> None:
    topology = load_topology(TOPOLOGIES / "cpu-only.yaml")
    with pytest.raises(DeviceExcluded) as caught:
        check_route_device(
            topology,
            DeviceSelection(),
            ep="cuda",
            target_provider="CUDAExecutionProvider",
            stage="stage-1",
        )
    message = str(caught.value)
    assert message.startswith("stage-1 targets CUDAExecutionProvider, but no dgpu or igpu device")
    assert "cpu-only.yaml offers it" in message
    assert "Example 8-core x86-64 CPU (cpu: CPUExecutionProvider)" in message


def test_an_npu_provider_on_a_gpu_is_not_an_npu_route() -> None:
    topology = load_topology(TOPOLOGIES / "cpu-igpu.yaml")
    with pytest.raises(DeviceExcluded, match="no npu device"):
        check_route_device(
            topology,
            DeviceSelection(),
            ep="vitisai",
            target_provider="VitisAIExecutionProvider",
            stage="stage-0",
        )


def test_unknown_ep_and_mismatched_provider_are_config_errors() -> None:
    topology = load_topology(LAPTOP)
    with pytest.raises(ConfigError, match="unknown route ep 'warp'") as caught:
        check_route_device(
            topology, DeviceSelection(), ep="warp", target_provider="X", stage="stage-0"
        )
    assert caught.value.key == "ep"
    with pytest.raises(
        ConfigError, match="targets CUDAExecutionProvider, not DmlExecutionProvider"
    ):
        check_route_device(
            topology,
            DeviceSelection(),
            ep="cuda",
            target_provider="DmlExecutionProvider",
            stage="stage-0",
        )


def test_every_route_target_names_providers_and_kinds() -> None:
    for ep, target in ROUTE_TARGETS.items():
        assert target.providers, ep
        assert target.kinds, ep
        assert all(provider.endswith("ExecutionProvider") for provider in target.providers)
