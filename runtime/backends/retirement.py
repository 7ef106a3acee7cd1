"""Settling a retired stage's reservation: release it, or quarantine it until its tree is gone.

Every stage client (graph and vLLM workers, and a graph stage in this process) ends the same
way: bounded retirement, then the ledger. A tree confirmed gone releases its reservation at
once. A tree with survivors that were killed but had not exited by the deadline (a large
address space still being torn down, a thread in uninterruptible I/O) keeps its reservation
quarantined while a watcher waits for those survivors, by identity; once they are gone the
leftovers are removed and the quarantine is resolved. An unverified tree has nothing to
watch and stays quarantined. A cancelled in-process call that runs on past its deadline keeps the stage's
reservation quarantined until the call ends (:func:`resolve_quarantine`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from runtime.errors import UsageError
from runtime.host import watch_until_gone

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Sequence

    from runtime.host import ProcessIdentity
    from runtime.ledger import ResourceLedger, StageReservation

__all__ = ["LATE_EXIT_WATCH_S", "resolve_quarantine", "settle_reservation"]

log = logging.getLogger("omni.backends.retirement")

#: How long killed survivors are watched before their quarantine is left for good.
LATE_EXIT_WATCH_S: Final = 300.0


def settle_reservation(
    ledger: ResourceLedger,
    reservation: StageReservation | None,
    why: str | None,
    *,
    stage: str,
    survivors: Sequence[ProcessIdentity] = (),
    cleanup: Callable[[], None] | None = None,
    watch_s: float = LATE_EXIT_WATCH_S,
) -> threading.Thread | None:
    """Release ``reservation`` (``why`` None) or quarantine it for ``why``.

    With ``survivors``, a watcher thread (returned) resolves the quarantine once they are
    all gone, after running ``cleanup`` (removing what they might still have used).
    """
    if reservation is None:
        return None
    if why is None:
        ledger.release(reservation.id)
        return None
    ledger.quarantine(reservation.id, why)
    if not survivors:
        return None
    reservation_id = reservation.id

    def gone(elapsed_s: float) -> None:
        if cleanup is not None:
            cleanup()
        if not resolve_quarantine(ledger, reservation_id, stage=stage):
            return
        log.info(
            "%s: the worker's last processes exited %.1f s after retirement; reservation %s "
            "released",
            stage,
            elapsed_s,
            reservation_id,
        )

    return watch_until_gone(stage, survivors, watch_s, gone)


def resolve_quarantine(ledger: ResourceLedger, reservation_id: str, *, stage: str) -> bool:
    """Release a quarantined reservation once what held it is gone (False: settled meanwhile)."""
    try:
        ledger.resolve_quarantine(reservation_id)
    except UsageError as exc:
        # Resolved by its owner meanwhile; nothing is charged twice.
        log.info("%s: quarantine already settled: %s", stage, exc)
        return False
    return True
