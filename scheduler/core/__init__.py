"""The pure scheduling core: ``decisions = run_cycle(snapshot, now)``, or ``Scheduler().run_cycle``
for a caller that runs one cycle after another (the same decisions, kept up to date incrementally).

Nothing here does I/O or imports an I/O framework, so the same code runs in the
placement service, in tests and in the simulator.
"""

from scheduler.core.cycle import run_cycle
from scheduler.core.incremental import Scheduler
from scheduler.core.predict import Key, RuntimePredictor
from scheduler.core.reasons import Pending, PendingReason, reason_text
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
    Resize,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    TenantView,
)

__all__ = [
    "Bind",
    "Decisions",
    "Fragmentation",
    "Key",
    "Member",
    "NodeView",
    "Pending",
    "PendingJob",
    "PendingReason",
    "Preempt",
    "Quota",
    "Reservation",
    "Resize",
    "RunningJob",
    "RuntimePredictor",
    "Scheduler",
    "SchedulerConfig",
    "Snapshot",
    "TenantView",
    "reason_text",
    "run_cycle",
]
