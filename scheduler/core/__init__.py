"""The pure scheduling core: ``decisions = run_cycle(snapshot, now)``.

Nothing here does I/O or imports an I/O framework, so the same code runs in the
placement service, in tests and in the simulator.
"""

from scheduler.core.cycle import run_cycle
from scheduler.core.types import (
    Bind,
    Decisions,
    Fragmentation,
    Member,
    NodeView,
    PendingJob,
    Preempt,
    Quota,
    Reservation,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    TenantView,
)

__all__ = [
    "Bind",
    "Decisions",
    "Fragmentation",
    "Member",
    "NodeView",
    "PendingJob",
    "Preempt",
    "Quota",
    "Reservation",
    "RunningJob",
    "SchedulerConfig",
    "Snapshot",
    "TenantView",
    "run_cycle",
]
