"""The simple baselines: FIFO, strict priority and shortest-job-first with oracle durations.

None of them preempts or reserves. Each GPU type is its own pool (its own queue head).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from scheduler.core.types import Bind, Decisions, PendingJob, Snapshot
from simulator.policies.placement import FreeIndex, runtime_guess, submitted

_BY_SUBMIT = attrgetter("submitted_at", "id")


def fifo_order(pending: Sequence[PendingJob]) -> list[PendingJob]:
    """Tie-breaks in order: 1. first submitted, 2. job id."""
    try:
        return sorted(pending, key=_BY_SUBMIT)
    except TypeError:  # some job has no submitted_at: fall back to when it was queued
        return sorted(pending, key=lambda j: (submitted(j), j.id))


class Fifo:
    """First come, first served per GPU type: a head that does not fit blocks everyone behind it."""

    def __init__(self) -> None:
        self.index = FreeIndex()

    def __call__(self, snapshot: Snapshot, now: float) -> Decisions:
        del now
        index = self.index
        index.sync(snapshot)
        blocked: set[str] = set()
        binds: list[Bind] = []
        for job in fifo_order(snapshot.pending):
            if job.gpu_type in blocked:
                continue
            members = index.place(job)
            if members is None:
                blocked.add(job.gpu_type)
                if len(blocked) == len(index.buckets):
                    break
                continue
            binds.append(Bind(job_id=job.id, attempt=job.attempt, members=members))
        return Decisions(binds=tuple(binds))


class StrictPriority:
    """Higher priority first; once a job is blocked, nothing of lower priority starts on its GPU type.

    Tie-breaks: 1. higher priority, 2. first submitted, 3. job id. Jobs of the blocked
    job's own priority may still start where they fit.
    """

    def __init__(self) -> None:
        self.index = FreeIndex()

    def __call__(self, snapshot: Snapshot, now: float) -> Decisions:
        del now
        index = self.index
        index.sync(snapshot)
        floor: dict[str, int] = {}
        binds: list[Bind] = []
        # Stable sorts: by priority (high first) over the FIFO order.
        for job in sorted(fifo_order(snapshot.pending), key=attrgetter("priority"), reverse=True):
            if job.priority < floor.get(job.gpu_type, -(1 << 30)):
                continue
            members = index.place(job)
            if members is None:
                floor[job.gpu_type] = job.priority
                continue
            binds.append(Bind(job_id=job.id, attempt=job.attempt, members=members))
        return Decisions(binds=tuple(binds))


class Sjf:
    """Shortest job first, greedy: every job that fits starts, shortest first (give it oracle durations).

    Tie-breaks: 1. shortest expected run time, 2. first submitted, 3. job id.
    """

    def __init__(self) -> None:
        self.index = FreeIndex()

    def __call__(self, snapshot: Snapshot, now: float) -> Decisions:
        del now
        index = self.index
        index.sync(snapshot)
        binds: list[Bind] = []
        for job in sorted(fifo_order(snapshot.pending), key=runtime_guess):
            members = index.place(job)
            if members is not None:
                binds.append(Bind(job_id=job.id, attempt=job.attempt, members=members))
        return Decisions(binds=tuple(binds))
