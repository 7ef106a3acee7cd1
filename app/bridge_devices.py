"""The device half of the studio's bridge: the machine's topology and the device selection.

:class:`DeviceSelectionMixin` is part of :class:`app.bridge.RuntimeBridge` and keeps its
rules: topologies are found and selections saved in control jobs, and what they produce
reaches the GUI thread through the bridge's ``post`` and signals.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from app.models import ErrorInfo
from app.presenters import error_info, toggled_selection, topology_view
from runtime.devices import (
    DeviceSelection,
    discover_topology,
    load_selection,
    load_topology,
    save_selection,
    selection_path,
)
from runtime.errors import AdmissionRefused, OmniError, UsageError

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from app.models import LedgerView, RunState
    from runtime.devices import Topology
    from runtime.ledger import ResourceLedger


class DeviceSelectionMixin:
    """Allow and exclude devices, and choose this machine or a topology file."""

    if TYPE_CHECKING:
        # Provided by RuntimeBridge.
        _topology: Topology | None
        _selection: DeviceSelection
        _selection_override: DeviceSelection | None
        ledger: ResourceLedger
        _ctl_topology: Topology | None
        _ctl_selection: DeviceSelection
        _state: RunState
        error: Any
        topology_changed: Any
        ledger_changed: Any

        def _submit(self, job: Callable[[], None]) -> None: ...
        def _post(self, callback: Callable[[], None]) -> None: ...
        def _unload_if_idle(self) -> None: ...
        def _replan(self) -> None: ...
        def _studio_line(self, text: str, level: str = "INFO") -> None: ...
        def ledger_snapshot(self) -> LedgerView: ...

    def set_device_allowed(self, physical_id: str, allowed: bool) -> None:
        """Allow or exclude one device; saved to the selection file the CLI reads."""
        topology = self._topology
        if topology is None:
            return
        try:
            selection = toggled_selection(self._selection, topology, physical_id, allowed)
        except UsageError as exc:
            self.error.emit(error_info(exc))
            return
        self._apply_selection(selection)

    def allow_all_devices(self) -> None:
        self._apply_selection(DeviceSelection())

    def set_topology_source(self, topology_file: Path | None) -> None:
        """Use this machine (None) or a topology file for plans and runs."""
        if self._state.busy:
            return
        self._unload_if_idle()
        self._submit(partial(self._topology_job, topology_file))
        self._replan()

    # -- GUI thread --------------------------------------------------------------------

    def _apply_selection(self, selection: DeviceSelection) -> None:
        self._selection = selection
        if self._topology is not None:
            self.topology_changed.emit(topology_view(self._topology, selection, selection_path()))
        self._submit(partial(self._selection_job, selection))
        self._unload_if_idle()
        self._replan()

    def _topology_ready(self, topology: Topology, selection: DeviceSelection) -> None:
        self._topology = topology
        self._selection = selection
        self.topology_changed.emit(topology_view(topology, selection, selection_path()))
        self.ledger_changed.emit(self.ledger_snapshot())

    # -- control thread ----------------------------------------------------------------

    def _topology_job(self, topology_file: Path | None) -> None:
        try:
            topology = (
                discover_topology() if topology_file is None else load_topology(topology_file)
            )
            selection = (
                self._selection_override
                if self._selection_override is not None
                else load_selection()
            )
        except OmniError as exc:
            self._post(partial(self.error.emit, error_info(exc)))
            if self._ctl_topology is not None:
                return
            topology = discover_topology()
            selection = DeviceSelection()
        self._ctl_topology = topology
        self._ctl_selection = selection
        try:
            # The ledger holds this machine's memory (nothing is loaded when it changes).
            self.ledger.replace_capacities(
                {
                    name: info.capacity
                    for name, info in topology.constraints.items()
                    if info.capacity
                }
            )
        except AdmissionRefused as exc:  # what stays quarantined exceeds the new machine
            self._post(partial(self.error.emit, error_info(exc)))
        self._post(partial(self._topology_ready, topology, selection))

    def _selection_job(self, selection: DeviceSelection) -> None:
        self._ctl_selection = selection
        if self._selection_override is None:
            try:
                file = save_selection(selection)
            except OSError as exc:
                message = f"cannot save the device selection to {selection_path()}: {exc}"
                self._post(
                    partial(self.error.emit, ErrorInfo("Device selection not saved", message))
                )
                return
            self._post(partial(self._studio_line, f"device selection saved to {file}"))
