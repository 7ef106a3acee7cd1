"""The device part of the studio's bridge: the machine's topology and the device selection.

:class:`MachineChoice` belongs to :class:`app.bridge.RuntimeBridge`: topologies are found and
selections saved in the bridge's control jobs (``submit``), and what they produce reaches the
GUI thread only through the bridge's one hop (``post``). It keeps two copies of the choice:
the GUI thread's (what the Devices panel shows) and the control thread's (what loads use).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from app.models import ErrorInfo
from app.presenters import error_info, ledger_view, toggled_selection, topology_view
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

    from app.models import LedgerView, TopologyView
    from runtime.devices import Topology
    from runtime.ledger import ResourceLedger


class MachineChoice:
    """Allow and exclude devices, and choose this machine or a topology file.

    ``submit`` runs a job on the control thread, ``post`` a callback on the GUI thread;
    ``show_topology``, ``show_ledger`` and ``show_error`` hand values to the widgets (GUI
    thread), ``line`` writes a studio log line (GUI thread) and ``changed`` tells the bridge
    that plans and loaded stages no longer match the machine (GUI thread). ``selection``
    fixes the selection (tests, the self-test) instead of reading the saved one.
    """

    def __init__(
        self,
        *,
        ledger: ResourceLedger,
        submit: Callable[[Callable[[], None]], None],
        post: Callable[[Callable[[], None]], None],
        show_topology: Callable[[TopologyView], None],
        show_ledger: Callable[[LedgerView], None],
        show_error: Callable[[ErrorInfo], None],
        line: Callable[[str], None],
        changed: Callable[[], None],
        selection: DeviceSelection | None = None,
    ) -> None:
        self._ledger = ledger
        self._submit = submit
        self._post = post
        self._show_topology = show_topology
        self._show_ledger = show_ledger
        self._show_error = show_error
        self._line = line
        self._changed = changed
        self._override = selection
        # GUI-thread state.
        self.topology: Topology | None = None
        self.selection = selection if selection is not None else DeviceSelection()
        # Control-thread state.
        self._ctl_topology: Topology | None = None
        self._ctl_selection = self.selection

    def machine(self) -> tuple[Topology | None, DeviceSelection]:
        """The topology and selection loads use (control thread)."""
        return self._ctl_topology, self._ctl_selection

    # -- GUI thread --------------------------------------------------------------------

    def set_allowed(self, physical_id: str, allowed: bool) -> None:
        """Allow or exclude one device; saved to the selection file the CLI reads."""
        topology = self.topology
        if topology is None:
            return
        try:
            selection = toggled_selection(self.selection, topology, physical_id, allowed)
        except UsageError as exc:
            self._show_error(error_info(exc))
            return
        self.apply(selection)

    def apply(self, selection: DeviceSelection) -> None:
        self.selection = selection
        if self.topology is not None:
            self._show_topology(topology_view(self.topology, selection, selection_path()))
        self._submit(partial(self._selection_job, selection))
        self._changed()

    def use(self, topology_file: Path | None) -> None:
        """Find this machine (None) or read ``topology_file``; ``show_topology`` follows."""
        self._submit(partial(self._topology_job, topology_file))

    def _ready(self, topology: Topology, selection: DeviceSelection) -> None:
        self.topology = topology
        self.selection = selection
        self._show_topology(topology_view(topology, selection, selection_path()))
        self._show_ledger(ledger_view(self._ledger.snapshot()))

    # -- control thread ----------------------------------------------------------------

    def _error(self, info: ErrorInfo) -> None:
        self._post(partial(self._show_error, info))

    def _topology_job(self, topology_file: Path | None) -> None:
        try:
            topology = (
                discover_topology() if topology_file is None else load_topology(topology_file)
            )
            selection = self._override if self._override is not None else load_selection()
        except OmniError as exc:
            self._error(error_info(exc))
            if self._ctl_topology is not None:
                return
            topology = discover_topology()
            selection = DeviceSelection()
        self._ctl_topology = topology
        self._ctl_selection = selection
        try:
            # The ledger holds this machine's memory (nothing is loaded when it changes).
            self._ledger.replace_capacities(
                {
                    name: info.capacity
                    for name, info in topology.constraints.items()
                    if info.capacity
                }
            )
        except AdmissionRefused as exc:  # what stays quarantined exceeds the new machine
            self._error(error_info(exc))
        self._post(partial(self._ready, topology, selection))

    def _selection_job(self, selection: DeviceSelection) -> None:
        self._ctl_selection = selection
        if self._override is None:
            try:
                file = save_selection(selection)
            except OSError as exc:
                message = f"cannot save the device selection to {selection_path()}: {exc}"
                self._error(ErrorInfo("Device selection not saved", message))
                return
            self._post(partial(self._line, f"device selection saved to {file}"))
