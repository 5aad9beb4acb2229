"""Slurm-style multifactor priority with EASY backfill (one reservation per GPU-type pool)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.types import Bind, Decisions, Member, PendingJob, Reservation, Snapshot
from simulator.policies.placement import FreeIndex, runtime_guess, shadow, submitted


@dataclass(frozen=True)
class Weights:
    """Slurm's PriorityWeight* knobs; each factor lies in [0, 1]."""

    age: float = 1000.0
    fairshare: float = 2000.0
    job_size: float = 500.0
    qos: float = 1000.0
    #: PriorityMaxAge: waiting this long gives the full age factor.
    max_age_s: float = 7 * 24 * 3600.0


class MultifactorEasy:
    """``priority = w_age·age + w_fs·2^(-U/S) + w_size·size + w_qos·class`` then EASY backfill.

    U is the tenant's decayed usage over everyone's, S its weight over everyone's (Slurm's
    classic fair-share factor); size favours big gangs (Slurm's default); class is the job's
    priority over 300. Per GPU type, the first job that does not fit gets a reservation at the
    shadow time (expected ends of running jobs, i.e. their limits); a later job starts only
    if it fits now and either avoids the reserved nodes or is expected to end by the shadow
    time, so it cannot delay the reservation.
    """

    def __init__(self, weights: Weights | None = None) -> None:
        self.w = weights or Weights()
        self.index = FreeIndex()

    def __call__(self, snapshot: Snapshot, now: float) -> Decisions:
        w = self.w
        usage = {t.name: sum(u for _, u in t.decayed_usage) for t in snapshot.tenants}
        total_usage = sum(usage.values()) or 1.0
        weight = {t.name: t.weight for t in snapshot.tenants}
        total_weight = sum(weight.values()) or 1.0
        biggest = max((n.gpu_count for n in snapshot.nodes), default=1) * 8

        fairshare: dict[str, float] = {}
        for name in {j.tenant for j in snapshot.pending}:
            s = weight.get(name, 1.0) / total_weight
            fairshare[name] = 2.0 ** (-(usage.get(name, 0.0) / total_usage) / s)

        def priority(job: PendingJob) -> float:
            age = min(max(now - submitted(job), 0.0) / w.max_age_s, 1.0)
            size = min(job.gpu_count / biggest, 1.0)
            return w.age * age + w.fairshare * fairshare[job.tenant] + w.job_size * size + w.qos * job.priority / 300.0

        # Tie-breaks: 1. multifactor priority, 2. first submitted, 3. job id.
        order = sorted(snapshot.pending, key=lambda j: (-priority(j), submitted(j), j.id))
        index = self.index
        index.sync(snapshot)
        reserved: dict[str, tuple[float, tuple[str, ...]]] = {}
        started: list[tuple[tuple[Member, ...], float]] = []
        binds: list[Bind] = []
        reservations: list[Reservation] = []
        for job in order:
            res = reserved.get(job.gpu_type)
            if res is None:
                members = index.place(job)
                if members is None:
                    found = shadow(job, index, snapshot.running, started, now)
                    if found is not None:
                        reserved[job.gpu_type] = found
                        reservations.append(Reservation(job_id=job.id, node_ids=found[1], start_at=found[0]))
                    continue
            else:
                if index.find(job) is None:
                    continue
                at, nodes = res
                members = index.place(job, avoid=nodes)
                if members is None and now + runtime_guess(job) <= at:
                    members = index.place(job)
                if members is None:
                    continue
            started.append((members, now + runtime_guess(job)))
            binds.append(Bind(job_id=job.id, attempt=job.attempt, members=members))
        return Decisions(binds=tuple(binds), reservations=tuple(reservations))
