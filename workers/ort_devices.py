"""The device a graph session runs on: ONNX Runtime's execution-provider devices.

Where the worker's ONNX Runtime has the device API (``get_ep_devices`` and
``SessionOptions.add_provider_for_devices``, 1.22 and later), the session's target provider
is added for the ``OrtEpDevice`` that matches the device the controller admitted the stage
on (type, vendor id, device id), with the route's provider options; a plugin library the
route names is registered first (``register_execution_provider_library``). An ONNX Runtime
without that API gets the providers and the route's options the older way
(``InferenceSession(providers=..., provider_options=...)``).

ONNX Runtime is reached through :class:`DeviceApi`, one small seam: :data:`ORT_DEVICE_API`
is the real one; tests give other implementations for hardware or builds this machine
lacks (a GPU's device entry, an ONNX Runtime without the device API).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as _ort_state

from runtime.contracts.ep_device import (
    AppliedDevice,
    EpDeviceRequest,
    luid_id,
    normalize_pci_bus_id,
)
from workers.errors import WorkerError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "ORT_DEVICE_API",
    "ORT_EXTENSION_ERRORS",
    "DeviceApi",
    "EpDeviceEntry",
    "OrtDeviceApi",
    "SessionProviders",
    "configure_providers",
    "preload_cuda_libraries",
    "select_ep_device",
]


#: Every exception type the ONNX Runtime extension raises (they derive from Exception only).
ORT_EXTENSION_ERRORS: Final[tuple[type[Exception], ...]] = (
    *(
        value
        for value in vars(_ort_state).values()
        if isinstance(value, type) and issubclass(value, Exception)
    ),
    RuntimeError,
    ValueError,
    TypeError,
)

#: What registering a plugin library can raise (a missing or unloadable file, too).
_LIBRARY_ERRORS: Final[tuple[type[Exception], ...]] = (*ORT_EXTENSION_ERRORS, OSError)


@dataclass(frozen=True, slots=True)
class EpDeviceEntry:
    """One (execution provider, hardware device) pair ONNX Runtime lists.

    ``handle`` is ONNX Runtime's ``OrtEpDevice`` (None for a recorded entry).
    """

    ep_name: str
    type: str
    vendor: str
    vendor_id: int
    device_id: int
    handle: object = None
    #: From ONNX Runtime's device metadata, where it gives them.
    pci_bus_id: str | None = None
    luid: str | None = None

    def describe(self) -> str:
        where = "".join(
            f", {text}"
            for text in (None if self.pci_bus_id is None else f"PCI {self.pci_bus_id}", self.luid)
            if text is not None
        )
        return (
            f"{self.ep_name} on {self.vendor} {self.type} "
            f"(vendor {self.vendor_id:#06x}, device {self.device_id:#06x}{where})"
        )


class DeviceApi(Protocol):
    """What the worker asks ONNX Runtime about devices (the seam tests replace)."""

    def ep_devices(self) -> tuple[EpDeviceEntry, ...] | None:
        """The listed devices, or None when this ONNX Runtime has no device API."""

    def register_library(self, name: str, path: str) -> None:
        """Register a plugin execution-provider library under ``name``."""

    def add_for_devices(
        self,
        options: ort.SessionOptions,
        entries: Sequence[EpDeviceEntry],
        provider_options: Mapping[str, str],
    ) -> None:
        """Add the provider of ``entries`` (one provider) to the session options."""


class OrtDeviceApi:
    """The worker's own ONNX Runtime. A library is registered once per process."""

    def __init__(self) -> None:
        self._registered: dict[str, str] = {}
        self._lock = threading.Lock()

    @property
    def has_device_api(self) -> bool:
        return hasattr(ort, "get_ep_devices") and hasattr(
            ort.SessionOptions, "add_provider_for_devices"
        )

    def ep_devices(self) -> tuple[EpDeviceEntry, ...] | None:
        if not self.has_device_api:
            return None
        entries = []
        for found in ort.get_ep_devices():
            metadata = {str(key): str(value) for key, value in found.device.metadata.items()}
            entries.append(
                EpDeviceEntry(
                    ep_name=str(found.ep_name),
                    type=str(found.device.type.name).lower(),
                    vendor=str(found.device.vendor),
                    vendor_id=int(found.device.vendor_id),
                    device_id=int(found.device.device_id),
                    handle=found,
                    pci_bus_id=normalize_pci_bus_id(metadata.get("pci_bus_id", "")),
                    luid=luid_id(metadata.get("LUID", "")),
                )
            )
        return tuple(entries)

    def register_library(self, name: str, path: str) -> None:
        with self._lock:
            if self._registered.get(name) == path:
                return
            ort.register_execution_provider_library(name, path)
            self._registered[name] = path

    def add_for_devices(
        self,
        options: ort.SessionOptions,
        entries: Sequence[EpDeviceEntry],
        provider_options: Mapping[str, str],
    ) -> None:
        options.add_provider_for_devices(
            [entry.handle for entry in entries], dict(provider_options)
        )


#: The ONNX Runtime of this process.
ORT_DEVICE_API: Final = OrtDeviceApi()


@dataclass(frozen=True, slots=True)
class SessionProviders:
    """How a session gets its providers: ``providers`` and ``provider_options`` for
    ``InferenceSession`` (None when the session options already hold them), and what was
    applied, for the ``ready`` report."""

    providers: tuple[str, ...] | None
    provider_options: tuple[dict[str, str], ...] | None
    applied: AppliedDevice


def _may_be(entry: EpDeviceEntry, request: EpDeviceRequest) -> bool:
    """Whether ``entry`` can be the requested device: what both sides know agrees."""
    if entry.type != request.type:
        return False
    pairs = (
        (request.vendor_id, entry.vendor_id),
        (request.device_id, entry.device_id),
        (request.pci_bus_id, entry.pci_bus_id),
        (request.luid, entry.luid),
    )
    return all(wanted is None or found is None or wanted == found for wanted, found in pairs)


def select_ep_device(
    request: EpDeviceRequest | None, provider: str, entries: Sequence[EpDeviceEntry]
) -> EpDeviceEntry:
    """The entry of ``provider`` on the requested device: same type, and the same vendor and
    device ids, PCI address and LUID where both sides know them; among identical devices, the
    one at the requested address. Without a request, the provider's only device.

    Raises WorkerError ``device_absent`` naming every device ONNX Runtime listed, when no
    entry or more than one matches.
    """
    offering = [entry for entry in entries if entry.ep_name == provider]
    matching = offering
    if request is not None:
        matching = [entry for entry in offering if _may_be(entry, request)]
        if len(matching) > 1:
            # Identical devices: the address ONNX Runtime reports tells them apart.
            addressed = [
                entry
                for entry in matching
                if (request.pci_bus_id is not None and entry.pci_bus_id == request.pci_bus_id)
                or (request.luid is not None and entry.luid == request.luid)
            ]
            matching = addressed or matching
    if len(matching) == 1:
        return matching[0]
    wanted = "its device" if request is None else request.describe()
    found = "; ".join(entry.describe() for entry in entries) or "no device at all"
    if not matching:
        problem = f"no {provider} device matches {wanted}"
    else:
        problem = (
            f"{len(matching)} {provider} devices match {wanted}; a topology entry with the "
            "device's vendor_id, device_id and pci_bus_id tells them apart"
        )
    raise WorkerError(
        "device_absent",
        f"{problem}; this worker's ONNX Runtime ({ort.__version__}) lists: {found}",
        subject=provider,
    )


#: Providers whose CUDA and cuDNN libraries may come as wheels (``onnxruntime-gpu[cuda,cudnn]``).
_CUDA_PROVIDERS: Final = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})


def preload_cuda_libraries(providers: Sequence[str]) -> None:
    """Load the CUDA and cuDNN libraries installed as wheels before a CUDA session is made
    (ONNX Runtime finds them only when preloaded, or when torch was imported first)."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None and _CUDA_PROVIDERS.intersection(providers):
        preload()


def configure_providers(
    options: ort.SessionOptions,
    providers: Sequence[str],
    target_provider: str,
    *,
    device: EpDeviceRequest | None = None,
    provider_options: Mapping[str, str] | None = None,
    ep_library: str | None = None,
    api: DeviceApi = ORT_DEVICE_API,
) -> SessionProviders:
    """Put the route's providers on ``options``: the target on the requested device with the
    route's options, then the other allowed providers (the CPU last, as its fallback).

    Where ONNX Runtime lists no device for one of the providers (no device API, or a provider
    built in without device entries), every provider is given to the session by name, the
    target with the route's options: :attr:`SessionProviders.providers` is then set, and the
    caller checks that the providers are available. A requested device of a target that
    does have device entries must still be among them.

    Raises WorkerError: ``provider_absent`` when the library cannot be registered,
    ``device_absent`` when the requested device is not listed (or a registered plugin
    library's provider lists no device at all).
    """
    route_options = dict(provider_options or {})
    preload_cuda_libraries(providers)
    entries = api.ep_devices()
    if ep_library is not None:
        if entries is None:
            raise WorkerError(
                "provider_absent",
                f"ONNX Runtime {ort.__version__} cannot register the plugin library "
                f"{ep_library!r} (register_execution_provider_library needs 1.22 or later)",
                subject=target_provider,
            )
        if not os.path.isfile(ep_library):
            raise WorkerError(
                "provider_absent",
                f"the route's ep_library {ep_library!r} is not a file in the worker's domain",
                subject=ep_library,
            )
        try:
            api.register_library(target_provider, ep_library)
        except _LIBRARY_ERRORS as exc:
            raise WorkerError(
                "provider_absent",
                f"ONNX Runtime could not register the plugin library {ep_library!r} as "
                f"{target_provider}: {exc}",
                subject=ep_library,
            ) from None
        entries = api.ep_devices()
    listed = {entry.ep_name for entry in entries or ()}
    if ep_library is not None and entries is not None and target_provider not in listed:
        # A plugin provider is reached only through its devices: none, no session.
        found = "; ".join(entry.describe() for entry in entries) or "no device at all"
        raise WorkerError(
            "device_absent",
            f"the plugin library {ep_library!r} registered, but ONNX Runtime "
            f"({ort.__version__}) lists no {target_provider} device on this machine; it "
            f"lists: {found}",
            subject=target_provider,
        )
    chosen = None
    if entries is not None and target_provider in listed:
        # The requested device must exist, whichever way the session then gets it.
        chosen = select_ep_device(device, target_provider, entries)
    if chosen is None or entries is None or not listed.issuperset(providers):
        # No device API, or a provider it lists no device for (one built in without device
        # entries): the session gets every provider by name, the target with the route's
        # options, on ONNX Runtime's default device of each.
        per_provider = tuple(
            route_options if provider == target_provider else {} for provider in providers
        )
        applied = AppliedDevice(
            method="provider_options",
            ep_name=target_provider,
            provider_options=route_options,
            ep_library=ep_library,
        )
        return SessionProviders(tuple(providers), per_provider, applied)
    api.add_for_devices(options, [chosen], route_options)
    for provider in providers:
        if provider != target_provider:
            api.add_for_devices(
                options, [entry for entry in entries if entry.ep_name == provider], {}
            )
    applied = AppliedDevice(
        method="ep_device",
        ep_name=chosen.ep_name,
        type=chosen.type,
        vendor=chosen.vendor,
        vendor_id=chosen.vendor_id,
        device_id=chosen.device_id,
        provider_options=route_options,
        ep_library=ep_library,
    )
    return SessionProviders(None, None, applied)
