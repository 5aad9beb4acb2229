"""Every ordering the cycle uses, as named key functions with their tie-breaks in order.

Smaller keys go first. No ordering depends on dict, set or input-tuple order, so the
same snapshot (in any tuple order) gives the same decisions.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from functools import partial

from scheduler.core.quota import QuotaBook
from scheduler.core.types import PendingJob, Reservation, RunningJob, SchedulerConfig


def waited_s(job: PendingJob, now: float) -> float:
    """How long the job has waited: from its first submission, across attempts."""
    since = job.submitted_at if job.submitted_at is not None else job.queued_at
    return max(0.0, now - since)


def aged_priority(job: PendingJob, now: float, config: SchedulerConfig, waited: float | None = None) -> float:
    """Priority class plus ``aging_per_hour`` for every hour waited (``waited``: :func:`waited_s`, when known)."""
    return job.priority + config.aging_per_hour * (waited_s(job, now) if waited is None else waited) / 3600.0


def short_job_boost(job: PendingJob, config: SchedulerConfig) -> float:
    """Priority points for a small, short job: ``short_job_boost`` for one expected GPU-hour or less, falling on a
    log scale to 0 at ``short_job_ref_gpu_h`` expected GPU-hours (expected run time: learned, else the limit)."""
    if config.short_job_boost <= 0.0:
        return 0.0
    gpu_h = job.gpu_count * job.expected_s / 3600.0
    if gpu_h <= 1.0:
        return config.short_job_boost
    ref = max(config.short_job_ref_gpu_h, 1.0 + 1e-9)
    return config.short_job_boost * max(0.0, 1.0 - math.log(gpu_h) / math.log(ref))


def within_tenant_key(job: PendingJob, now: float, config: SchedulerConfig) -> tuple[float, float, float, str]:
    """A tenant's own queue: 1. higher aged priority plus the short-job boost, 2. waited longer, 3. queued earlier, 4. job id."""
    waited = waited_s(job, now)
    return (-(aged_priority(job, now, config, waited) + short_job_boost(job, config)), -waited, job.queued_at, job.id)


def standing_key(reservation: Reservation) -> tuple[float, str]:
    """Holders of standing reservations, before everyone: 1. earlier start, 2. job id."""
    return (reservation.start_at, reservation.job_id)


def reservation_head_key(job: PendingJob, now: float, config: SchedulerConfig) -> tuple[float, float, str]:
    """Who gets a GPU type's EASY reservation among its blocked jobs: 1. higher aged priority, 2. waited longer, 3. job id.

    Age, not fair share, decides here: this is the anti-starvation rule, so the job that
    has waited longest (weighted by priority class) is the one protected.
    """
    return (-aged_priority(job, now, config), -waited_s(job, now), job.id)


def victim_cost_key(job: RunningJob, now: float) -> tuple[float, int, float, str]:
    """Cheapest victim first: 1. fewest GPU-hours lost since the last checkpoint, 2. lower priority,
    3. started most recently, 4. job id."""
    since = job.started_at if job.last_checkpoint_at is None else max(job.started_at, job.last_checkpoint_at)
    lost = job.gpu_count * max(0.0, now - since) / 3600.0
    return (round(lost, 9), job.priority, -job.started_at, job.id)


def dominant_share(book: QuotaBook, tenant: str, capacity: dict[str, int], half_life_s: float) -> float:
    """Weighted DRF share: max over GPU types of effective use / the type's GPUs, divided by weight.

    Effective use of a type = GPUs held now + decayed past GPU-seconds * ln 2 / half-life.
    The factor turns a decayed integral back into GPUs: a tenant that has held g GPUs for
    ever has ``g * half_life / ln 2`` decayed GPU-seconds, which counts as g more GPUs. So
    at steady state present and past weigh the same, and a heavy day fades with the half-life.
    """
    state = book.tenant(tenant)
    per_s = math.log(2) / half_life_s if half_life_s > 0 else 0.0
    share = 0.0
    for gpu_type in sorted(set(state.used) | set(state.decayed)):
        total = capacity.get(gpu_type, 0)
        if total > 0:
            share = max(share, (state.used.get(gpu_type, 0) + state.decayed.get(gpu_type, 0.0) * per_s) / total)
    return share / state.weight


def tenant_key(share: float, tenant: str) -> tuple[float, str]:
    """Across tenants: 1. lowest weighted dominant share, 2. tenant name."""
    return (round(share, 12), tenant)


class FairQueue:
    """Jobs in weighted-DRF order, recomputed as the cycle binds (DRF's progressive filling).

    ``pop()`` gives the next job of the tenant with the lowest dominant share; after the
    caller binds or skips it, the tenant goes back with its share as it is then.
    """

    def __init__(self, jobs: list[PendingJob], book: QuotaBook, capacity: dict[str, int], now: float, config: SchedulerConfig) -> None:
        self._book, self._capacity, self._half_life = book, capacity, config.usage_half_life_s
        #: tenant -> (usage version it was computed at, share)
        self._shares: dict[str, tuple[int, float]] = {}
        by_tenant: dict[str, list[PendingJob]] = {}
        for job in jobs:
            by_tenant.setdefault(job.tenant, []).append(job)
        self._queues: dict[str, list[PendingJob]] = {}
        self._next: dict[str, int] = {}
        #: (key, tenant, the tenant's usage version the key was computed at)
        self._heap: list[tuple[tuple[float, str], str, int]] = []
        for tenant in sorted(by_tenant):
            self._queues[tenant] = sorted(by_tenant[tenant], key=partial(within_tenant_key, now=now, config=config))
            self._next[tenant] = 0
            self._heap.append(self._entry(tenant))
        heapq.heapify(self._heap)

    def _share(self, tenant: str) -> float:
        version = self._book.tenant(tenant).version
        cached = self._shares.get(tenant)
        if cached is None or cached[0] != version:
            cached = (version, dominant_share(self._book, tenant, self._capacity, self._half_life))
            self._shares[tenant] = cached
        return cached[1]

    def _entry(self, tenant: str) -> tuple[tuple[float, str], str, int]:
        return (tenant_key(self._share(tenant), tenant), tenant, self._book.tenant(tenant).version)

    def __iter__(self) -> Iterator[PendingJob]:
        heap, queues = self._heap, self._queues
        while heap:
            _, tenant, version = heapq.heappop(heap)
            queue, index = queues[tenant], self._next[tenant]
            state = self._book.tenant(tenant)
            # While the tenant's usage is as it was when its key was computed, the key stands, and it was
            # the smallest (keys are unique by tenant name): it would be popped again at once, so go on
            # without the heap. (Its usage may have changed since, before the queue was walked: then
            # it gets one job, as every popped tenant does, and goes back with its key as it is now.)
            while True:
                yield queue[index]
                index += 1
                if index == len(queue) or state.version != version:
                    break
            self._next[tenant] = index
            if index < len(queue):
                heapq.heappush(heap, self._entry(tenant))
