"""Topology files: the bundled machines, the accounting rule they follow, and every bad input."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest
from devices_testdata import BUNDLED_FILES, LAPTOP, LAPTOP_WSL, TOPOLOGIES

from runtime.contracts.devices import (
    MACHINE_RAM,
    WSL_QUOTA,
    DeviceKind,
    ExecutionDomain,
    Integration,
    vram_constraint,
)
from runtime.devices import load_topology, parse_size, save_topology
from runtime.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

GiB = 1024**3


def test_every_composition_and_its_wsl_variant_is_bundled() -> None:
    bundled = {path.name for path in TOPOLOGIES.glob("*.yaml")}
    assert bundled == {path.name for path in BUNDLED_FILES}


@pytest.mark.parametrize("path", BUNDLED_FILES, ids=lambda path: path.stem)
def test_bundled_constraints_follow_the_accounting_rule(path: Path) -> None:
    topology = load_topology(path)
    is_wsl = path.stem.endswith("-wsl")
    assert topology.wsl is is_wsl
    assert topology.source == str(path)
    expected_users: dict[str, set[str]] = {}
    for device in topology.devices:
        domains = topology.domains[device.physical_id]
        assert domains[0] is device.execution_domain
        if device.kind is DeviceKind.DGPU:
            assert device.integration is Integration.DISCRETE
            own = vram_constraint(device.physical_id)
            assert device.memory_constraints == (own,)
            for domain in domains:
                assert topology.charges(device.physical_id, domain) == (own,)
        else:
            assert device.integration is Integration.INTEGRATED
            for domain in domains:
                charged = topology.charges(device.physical_id, domain)
                wanted = (
                    (MACHINE_RAM, WSL_QUOTA) if domain is ExecutionDomain.WSL else (MACHINE_RAM,)
                )
                assert charged == wanted
        for domain in domains:
            for name in topology.charges(device.physical_id, domain):
                expected_users.setdefault(name, set()).add(device.physical_id)
    assert set(topology.constraints) == set(expected_users)
    for name, info in topology.constraints.items():
        assert set(info.devices) == expected_users[name]
        assert info.capacity is not None
        assert info.capacity > 0
    assert (WSL_QUOTA in topology.constraints) is is_wsl
    assert sum(device.kind is DeviceKind.CPU for device in topology.devices) == 1


@pytest.mark.parametrize(
    "path", [path for path in BUNDLED_FILES if path.stem.endswith("-wsl")], ids=lambda p: p.stem
)
def test_wsl_allocation_charges_host_ram_and_the_quota(path: Path) -> None:
    topology = load_topology(path)
    cpu = next(device for device in topology.devices if device.kind is DeviceKind.CPU)
    assert cpu.execution_domain is ExecutionDomain.WSL
    assert topology.charges(cpu.physical_id) == (MACHINE_RAM, WSL_QUOTA)
    assert cpu.physical_id in topology.constraints[WSL_QUOTA].devices
    assert cpu.physical_id in topology.constraints[MACHINE_RAM].devices


def test_a_windows_allocation_on_the_same_cpu_charges_only_host_ram() -> None:
    topology = load_topology(LAPTOP_WSL)
    cpu = topology.devices[0]
    assert topology.domains[cpu.physical_id] == (ExecutionDomain.WSL, ExecutionDomain.WINDOWS)
    assert topology.charges(cpu.physical_id, ExecutionDomain.WINDOWS) == (MACHINE_RAM,)


def test_integrated_gpu_and_npu_share_host_ram() -> None:
    topology = load_topology(TOPOLOGIES / "cpu-igpu-npu.yaml")
    kinds = {device.kind: device for device in topology.devices}
    ram_users = set(topology.constraints[MACHINE_RAM].devices)
    for kind in (DeviceKind.CPU, DeviceKind.IGPU, DeviceKind.NPU):
        assert kinds[kind].memory_constraints == (MACHINE_RAM,)
        assert kinds[kind].physical_id in ram_users
    assert len(topology.constraints) == 1


def test_discrete_vram_is_separate_from_host_ram() -> None:
    topology = load_topology(TOPOLOGIES / "cpu-igpu-npu-dgpu.yaml")
    dgpu = next(device for device in topology.devices if device.kind is DeviceKind.DGPU)
    own = vram_constraint(dgpu.physical_id)
    assert dgpu.physical_id not in topology.constraints[MACHINE_RAM].devices
    assert topology.constraints[own].devices == (dgpu.physical_id,)
    assert topology.constraints[own].capacity == 16 * GiB
    assert topology.constraints[MACHINE_RAM].capacity == 32 * GiB


def test_the_reference_laptop_is_described() -> None:
    topology = load_topology(LAPTOP)
    names = {device.kind: device.name for device in topology.devices}
    assert "Ryzen AI 9 HX 370" in names[DeviceKind.CPU]
    assert "890M" in names[DeviceKind.IGPU]
    assert names[DeviceKind.NPU] == "AMD NPU"
    assert names[DeviceKind.DGPU] == "NVIDIA GeForce RTX 5090 Laptop GPU"
    dgpu = next(device for device in topology.devices if device.kind is DeviceKind.DGPU)
    assert topology.constraints[vram_constraint(dgpu.physical_id)].capacity == 24 * GiB
    shared = [device for device in topology.devices if device.kind is not DeviceKind.DGPU]
    assert {device.package for device in shared} == {"hx370"}
    assert dgpu.package is None
    assert "VitisAIExecutionProvider" in next(
        device.providers for device in topology.devices if device.kind is DeviceKind.NPU
    )


def test_the_laptop_gpu_keeps_one_id_across_windows_and_wsl() -> None:
    native = load_topology(LAPTOP)
    wsl = load_topology(LAPTOP_WSL)
    ids = {device.physical_id for device in native.devices}
    assert ids == {device.physical_id for device in wsl.devices}
    dgpu = next(device for device in wsl.devices if device.kind is DeviceKind.DGPU)
    assert wsl.domains[dgpu.physical_id] == (ExecutionDomain.WSL, ExecutionDomain.WINDOWS)


@pytest.mark.parametrize("path", BUNDLED_FILES, ids=lambda path: path.stem)
def test_saved_topology_reads_back_the_same(path: Path, tmp_path: Path) -> None:
    original = load_topology(path)
    copy = load_topology(save_topology(original, tmp_path / "copy.yaml"))
    assert copy.devices == original.devices
    assert dict(copy.domains) == dict(original.domains)
    assert dict(copy.constraints) == dict(original.constraints)
    assert copy.name == original.name
    assert [entry.name for entry in tmp_path.iterdir()] == ["copy.yaml"]


def test_the_documented_example_loads(tmp_path: Path) -> None:
    readme = (TOPOLOGIES / "README.md").read_text(encoding="utf-8")
    example = re.search(r"```yaml\n(.*?)```", readme, re.DOTALL)
    assert example is not None
    path = tmp_path / "example.yaml"
    path.write_text(example.group(1), encoding="utf-8")
    topology = load_topology(path)
    assert topology.wsl
    assert topology.constraints[WSL_QUOTA].capacity == 16 * GiB
    assert topology.constraints[MACHINE_RAM].observed_free == 20 * GiB


def test_table_and_json_show_devices_and_constraints() -> None:
    topology = load_topology(LAPTOP_WSL)
    table = topology.to_table()
    for device in topology.devices:
        row = next(line for line in table.splitlines() if device.physical_id in line.split())
        assert device.kind.value in row.split()
        for provider in device.providers:
            assert provider in row
    assert re.search(r"^wsl:quota\s+16\.0 GiB\s+not observed\s+CPU-", table, re.MULTILINE)
    document = topology.to_dict()
    assert document["wsl"] is True
    assert document["constraints"][WSL_QUOTA]["capacity"] == 16 * GiB
    assert [device["kind"] for device in document["devices"]] == ["cpu", "igpu", "npu", "dgpu"]
    assert '"machine:ram"' in topology.to_json()


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (1024, 1024),
        ("1024", 1024),
        ("32GiB", 32 * GiB),
        ("512 MiB", 512 * 1024**2),
        ("1.5GiB", 3 * GiB // 2),
        ("2GB", 2_000_000_000),
        ("4kB", 4000),
        ("0", 0),
    ],
)
def test_sizes_in_bytes_or_units(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["32 gibibytes", "1.0000000001KiB", "-1", -5, True, 1.5, "GiB"])
def test_bad_sizes_are_refused_with_what_is_accepted(text: object) -> None:
    with pytest.raises(ValueError, match=r"size|negative|byte count"):
        parse_size(text)


GOOD_DEVICE = """\
version: 1
devices:
  - id: CPU-X
    kind: cpu
    name: X
    domains: [posix]
memory:
  machine:ram: 8GiB
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "machine.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_hardware_ids_load_and_save(tmp_path: Path) -> None:
    text = GOOD_DEVICE.replace(
        "    domains: [posix]\n", "    domains: [posix]\n    vendor_id: 0x1022\n    device_id: 0\n"
    )
    topology = load_topology(write(tmp_path, text))
    (cpu,) = topology.devices
    assert (cpu.vendor_id, cpu.device_id) == (0x1022, 0)
    saved = save_topology(topology, tmp_path / "saved.yaml")
    assert load_topology(saved).devices == topology.devices


def test_minimal_file_loads(tmp_path: Path) -> None:
    topology = load_topology(write(tmp_path, GOOD_DEVICE))
    assert topology.constraints[MACHINE_RAM].capacity == 8 * GiB
    assert topology.constraints[MACHINE_RAM].observed_free is None


@pytest.mark.parametrize(
    ("text", "line", "key", "message"),
    [
        (GOOD_DEVICE + "colour: blue\n", 9, "colour", "unknown key"),
        (
            GOOD_DEVICE.replace("    domains: [posix]\n", "    domains: [posix]\n    speed: 3\n"),
            7,
            "devices[0].speed",
            "unknown key",
        ),
        (
            GOOD_DEVICE.replace("kind: cpu", "kind: tpu"),
            4,
            "devices[0].kind",
            "unknown device kind",
        ),
        (GOOD_DEVICE.replace("[posix]", "[macos]"), 6, "devices[0].domains", "execution domain"),
        (GOOD_DEVICE.replace("[posix]", "[]"), 6, "devices[0].domains", "at least one"),
        (GOOD_DEVICE.replace("[posix]", "[wsl, wsl]"), 6, "devices[0].domains", "listed twice"),
        (GOOD_DEVICE.replace("id: CPU-X", "id: 'CPU X'"), 3, "devices[0].id", "bad physical id"),
        (GOOD_DEVICE.replace("version: 1", "version: 2"), 1, "version", "unsupported"),
        (
            GOOD_DEVICE.replace("id: CPU-X", "id: 0000:01:00.0"),
            3,
            "devices[0].id",
            "YAML reads '0000:01:00.0' as float; put it in quotes",
        ),
        (GOOD_DEVICE.replace("name: X", "name: ''"), 5, "devices[0].name", "non-empty"),
        (
            GOOD_DEVICE.replace(
                "    domains: [posix]\n", "    domains: [posix]\n    vendor_id: AMD\n"
            ),
            7,
            "devices[0].vendor_id",
            "vendor_id 'AMD' is not a hardware id; accepted: an integer in [0, 0xFFFFFFFF]",
        ),
        (
            GOOD_DEVICE.replace(
                "    domains: [posix]\n", "    domains: [posix]\n    device_id: -2\n"
            ),
            7,
            "devices[0].device_id",
            "device_id -2 is not a hardware id",
        ),
        (GOOD_DEVICE.replace("    name: X\n", ""), 3, "devices[0]", "missing required key 'name'"),
        (GOOD_DEVICE.replace("8GiB", "8 gigs"), 8, "memory.machine:ram", "cannot read size"),
        (GOOD_DEVICE.replace("8GiB", "0"), 8, "memory.machine:ram", "larger than zero"),
        (
            GOOD_DEVICE.replace("8GiB", "{capacity: 8GiB, observed_free: 9GiB}"),
            8,
            "memory.machine:ram.observed_free",
            "exceeds the capacity",
        ),
        (
            GOOD_DEVICE.replace("8GiB", "{size: 8GiB}"),
            8,
            "memory.machine:ram.size",
            "unknown key",
        ),
        (GOOD_DEVICE + "  wsl:quota: 4GiB\n", 9, "memory.wsl:quota", "no device lists 'wsl'"),
        (
            GOOD_DEVICE + "  machine:vram:GPU-typo: 4GiB\n",
            9,
            "memory.machine:vram:GPU-typo",
            "no dgpu device has id 'GPU-typo'",
        ),
        (GOOD_DEVICE + "  Machine RAM: 4GiB\n", 9, "memory.Machine RAM", "bad constraint name"),
        (GOOD_DEVICE.replace("[posix]", "[wsl]"), 7, "memory", "draws on wsl:quota"),
        (
            GOOD_DEVICE.replace("memory:", "memory:\n  machine:ram: 1GiB"),
            9,
            "memory.machine:ram",
            "duplicate key (first given on line 8)",
        ),
        (
            GOOD_DEVICE.replace(
                "devices:\n", "devices:\n  - {id: CPU-Y, kind: cpu, name: Y, domains: [posix]}\n"
            ),
            3,
            "devices",
            "exactly one cpu device",
        ),
        (
            GOOD_DEVICE.replace(
                "devices:\n", "devices:\n  - {id: CPU-X, kind: igpu, name: Y, domains: [posix]}\n"
            ),
            4,
            "devices[1]",
            "listed twice (first on line 3)",
        ),
        ("version: 1\ndevices: []\nmemory: {}\n", 2, "devices", "at least one"),
        ("version: 1\ndevices: [\n", 3, None, "not valid YAML"),
        ("- 1\n- 2\n", 1, None, "expected a mapping"),
    ],
)
def test_bad_files_name_file_line_and_key(
    tmp_path: Path, text: str, line: int, key: str | None, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_topology(path)
    error = caught.value
    assert message in error.detail
    assert error.file == str(path)
    assert error.line == line
    assert error.key == key
    assert str(path) in str(error)


def test_dgpu_without_vram_capacity_is_refused(tmp_path: Path) -> None:
    text = GOOD_DEVICE.replace(
        "memory:",
        "  - {id: GPU-1, kind: dgpu, name: G, domains: [posix]}\nmemory:",
    )
    with pytest.raises(ConfigError, match=r"GPU-1 \(line 7\) draws on machine:vram:GPU-1"):
        load_topology(write(tmp_path, text))


def test_missing_and_empty_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found") as caught:
        load_topology(tmp_path / "absent.yaml")
    assert caught.value.file == str(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="empty"):
        load_topology(write(tmp_path, "# nothing\n"))


def test_a_device_s_pci_address_reaches_its_worker_request(tmp_path: Path) -> None:
    from runtime.devices import ep_device_request

    text = GOOD_DEVICE.replace(
        "    domains: [posix]\n", "    domains: [posix]\n    pci_bus_id: '00000000:C4:00.0'\n"
    )
    (cpu,) = load_topology(write(tmp_path, text)).devices
    assert cpu.pci_bus_id == "0000:c4:00.0"
    assert ep_device_request(cpu).pci_bus_id == "0000:c4:00.0"
    bad = GOOD_DEVICE.replace(
        "    domains: [posix]\n", "    domains: [posix]\n    pci_bus_id: slot-3\n"
    )
    with pytest.raises(ConfigError, match="pci_bus_id 'slot-3' is not a PCI address"):
        load_topology(write(tmp_path, bad))
