"""The DXGI seam: recorded adapter records become descriptors; malformed records are refused."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import pytest
from devices_testdata import SAMPLES

from runtime.contracts.devices import MACHINE_RAM, DeviceKind, ExecutionDomain, Integration
from runtime.devices import dxgi
from runtime.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

GiB = 1024**3


def descriptors(name: str) -> dict[str, Any]:
    adapters = dxgi.hardware_adapters(dxgi.load_adapter_records(SAMPLES / name))
    return {adapter.description: dxgi.adapter_descriptor(adapter) for adapter in adapters}


def test_laptop_sample_gives_an_integrated_and_a_discrete_gpu() -> None:
    devices = descriptors("dxgi_hx370_rtx5090_laptop.json")
    assert set(devices) == {"NVIDIA GeForce RTX 5090 Laptop GPU", "AMD Radeon(TM) 890M Graphics"}
    radeon = devices["AMD Radeon(TM) 890M Graphics"]
    assert radeon.kind is DeviceKind.IGPU
    assert radeon.integration is Integration.INTEGRATED
    assert radeon.memory_constraints == (MACHINE_RAM,)
    assert radeon.physical_id == "LUID-00000000-0000F2A1"
    rtx = devices["NVIDIA GeForce RTX 5090 Laptop GPU"]
    assert rtx.kind is DeviceKind.DGPU
    assert rtx.memory_constraints == ("machine:vram:LUID-00000000-0000F2B6",)
    assert rtx.execution_domain is ExecutionDomain.WINDOWS


def test_dedicated_memory_above_4_gb_is_exact() -> None:
    adapters = dxgi.load_adapter_records(SAMPLES / "dxgi_hx370_rtx5090_laptop.json")
    rtx = next(adapter for adapter in adapters if adapter.vendor_id == dxgi.VENDOR_NVIDIA)
    assert rtx.dedicated_video_memory == 25201475584
    assert rtx.dedicated_video_memory > 4 * GiB


def test_software_adapters_are_skipped() -> None:
    adapters = dxgi.load_adapter_records(SAMPLES / "dxgi_intel_iris_xe_laptop.json")
    assert len(adapters) == 2
    assert [adapter.description for adapter in dxgi.hardware_adapters(adapters)] == [
        "Intel(R) Iris(R) Xe Graphics"
    ]
    basic = next(adapter for adapter in adapters if adapter.is_software)
    with pytest.raises(ValueError, match="software adapter"):
        dxgi.adapter_descriptor(basic)


def test_intel_iris_xe_is_integrated() -> None:
    devices = descriptors("dxgi_intel_iris_xe_laptop.json")
    assert devices["Intel(R) Iris(R) Xe Graphics"].kind is DeviceKind.IGPU


def test_desktop_amd_card_is_discrete_and_intel_uhd_integrated() -> None:
    devices = descriptors("dxgi_desktop_radeon_uhd.json")
    radeon = devices["AMD Radeon RX 7900 XTX"]
    assert radeon.kind is DeviceKind.DGPU
    assert radeon.physical_id == "LUID-00000001-F0000000"
    assert devices["Intel(R) UHD Graphics 770"].kind is DeviceKind.IGPU


def test_a_recorded_integrated_answer_overrides_the_memory_heuristic() -> None:
    record = json.loads((SAMPLES / "dxgi_desktop_radeon_uhd.json").read_text())["adapters"][0]
    record["Integrated"] = True
    (adapter,) = dxgi.parse_adapter_records([record], source="inline")
    assert adapter.kind is DeviceKind.IGPU
    assert dxgi.parse_adapter_records([adapter.to_record()], source="again") == (adapter,)


def test_a_known_identity_replaces_the_luid() -> None:
    (adapter, _, _) = dxgi.load_adapter_records(SAMPLES / "dxgi_hx370_rtx5090_laptop.json")
    device = dxgi.adapter_descriptor(
        adapter, physical_id="GPU-1234", providers=["DmlExecutionProvider"]
    )
    assert device.physical_id == "GPU-1234"
    assert device.memory_constraints == ("machine:vram:GPU-1234",)
    assert device.providers == ("DmlExecutionProvider",)


def test_records_round_trip_through_to_record() -> None:
    adapters = dxgi.load_adapter_records(SAMPLES / "dxgi_hx370_rtx5090_laptop.json")
    again = dxgi.parse_adapter_records([adapter.to_record() for adapter in adapters], source="x")
    assert again == adapters


def _record() -> dict[str, Any]:
    document = json.loads((SAMPLES / "dxgi_intel_iris_xe_laptop.json").read_text())
    record: dict[str, Any] = document["adapters"][0]
    return record


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        ({"AdapterRAM": 4294967295}, "adapters[0].AdapterRAM", "unknown field"),
        ({"VendorId": -1}, "adapters[0].VendorId", "non-negative integer"),
        ({"Flags": True}, "adapters[0].Flags", "non-negative integer"),
        ({"DedicatedVideoMemory": "128 MB"}, "adapters[0].DedicatedVideoMemory", "integer"),
        ({"AdapterLuid": 5}, "adapters[0].AdapterLuid", "HighPart and LowPart"),
        (
            {"AdapterLuid": {"HighPart": 0, "LowPart": -3}},
            "adapters[0].AdapterLuid.LowPart",
            "non-negative",
        ),
        ({"Description": 7}, "adapters[0].Description", "string"),
        ({"Integrated": "yes"}, "adapters[0].Integrated", "true or false"),
    ],
)
def test_malformed_records_name_the_field(change: dict[str, Any], key: str, message: str) -> None:
    record = _record() | change
    with pytest.raises(ConfigError, match=message) as caught:
        dxgi.parse_adapter_records([record], source="sample.json")
    assert caught.value.key == key
    assert caught.value.file == "sample.json"


def test_missing_fields_and_bad_files_are_refused(tmp_path: Path) -> None:
    record = _record()
    del record["SharedSystemMemory"]
    with pytest.raises(ConfigError, match="missing field") as caught:
        dxgi.parse_adapter_records([record], source="s")
    assert caught.value.key == "adapters[0].SharedSystemMemory"
    with pytest.raises(ConfigError, match="JSON object"):
        dxgi.parse_adapter_records([[1, 2]], source="s")
    path = tmp_path / "adapters.json"
    path.write_text('{"adapters": [\n  {,]}', encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid JSON") as caught:
        dxgi.load_adapter_records(path)
    assert caught.value.line == 2
    path.write_text('{"adapters": {}}', encoding="utf-8")
    with pytest.raises(ConfigError, match="list of adapter records"):
        dxgi.load_adapter_records(path)
    path.write_text('{"adapters": [], "gpus": []}', encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown key") as caught:
        dxgi.load_adapter_records(path)
    assert caught.value.key == "gpus"
    with pytest.raises(ConfigError, match="file not found"):
        dxgi.load_adapter_records(tmp_path / "absent.json")


@pytest.mark.skipif(sys.platform == "win32", reason="checks the non-Windows answer")
def test_outside_windows_dxgi_lists_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert dxgi.enumerate_adapters() == ()
    dxgi.main()
    assert json.loads(capsys.readouterr().out)["adapters"] == []


@pytest.mark.skipif(sys.platform != "win32", reason="DXGI exists only on Windows")
def test_on_windows_dxgi_lists_hardware_adapters() -> None:
    adapters = dxgi.enumerate_adapters()
    assert all(adapter.description for adapter in adapters)
    assert all(adapter.physical_id.startswith("LUID-") for adapter in adapters)
