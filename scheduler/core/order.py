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


def in_fast_lane(job: PendingJob, config: SchedulerConfig) -> bool:
    """Is the job expected to use at most ``fast_lane_gpu_h`` GPU-hours (GPUs x expected run time)?"""
    return config.fast_lane_gpu_h > 0.0 and job.gpu_count * job.expected_s <= config.fast_lane_gpu_h * 3600.0


def within_tenant_key(job: PendingJob, now: float, config: SchedulerConfig) -> tuple[float, float, float, str]:
    """A tenant's own queue: 1. higher aged priority plus the short-job boost, 2. waited longer, 3. queued earlier, 4. job id."""
    waited = waited_s(job, now)
    return (-(aged_priority(job, now, config, waited) + short_job_boost(job, config)), -waited, job.queued_at, job.id)


def standing_key(reservation: Reservation) -> tuple[float, str]:
    """Holders of standing reservations, before everyone: 1. earlier start, 2. job id."""
    return (reservation.start_at, reservation.job_id)


def reservation_head_key(job: PendingJob, share: float, now: float, config: SchedulerConfig) -> tuple[int, float, float, float, str]:
    """Who gets a GPU type's EASY reservation among its blocked jobs: 0. jobs that have waited
    ``reservation_by_age_after_s`` or longer, longest waiter first; then 1. the tenant with the lowest weighted share of
    the type (``share``: :func:`type_share`, as the fair queue orders), 2. higher aged priority, 3. waited longer, 4. job id.

    Fair share, then age: the reservation goes to the tenant furthest below its share, and within a tenant to its
    longest waiter. A holder keeps the reservation until it starts, and each holder that starts raises its tenant's
    share, so the turns go round the tenants with blocked jobs in fair order; a tenant's past use fades with the
    half-life. Past ``max_wait_s`` a job may also preempt to start (:mod:`scheduler.core.preempt`, reason 3).

    Fair share alone leaves a burst's backlog to drain tenant by tenant, and the last jobs of the busiest tenants wait
    the longest; past ``reservation_by_age_after_s`` (0: never) the oldest blocked job is protected first, whoever's.
    """
    waited = waited_s(job, now)
    if 0.0 < config.reservation_by_age_after_s <= waited:
        return (0, -waited, 0.0, 0.0, job.id)
    return (1, round(share, 12), -aged_priority(job, now, config, waited), -waited, job.id)


def victim_cost_key(job: RunningJob, now: float) -> tuple[float, int, float, str]:
    """Cheapest victim first: 1. fewest GPU-hours lost since the last checkpoint, 2. lower priority,
    3. started most recently, 4. job id."""
    since = job.started_at if job.last_checkpoint_at is None else max(job.started_at, job.last_checkpoint_at)
    lost = job.gpu_count * max(0.0, now - since) / 3600.0
    return (round(lost, 9), job.priority, -job.started_at, job.id)


def dominant_share(book: QuotaBook, tenant: str, capacity: dict[str, int], half_life_s: float) -> float:
    """Weighted DRF share: max over GPU types of effective use / the type's GPUs, divided by weight (reported as a
    summary; the queue is ordered per type, :func:`type_share`).

    Effective use of a type = GPUs held now + decayed past GPU-seconds * ln 2 / half-life.
    The factor turns a decayed integral back into GPUs: a tenant that has held g GPUs for
    ever has ``g * half_life / ln 2`` decayed GPU-seconds, which counts as g more GPUs. So
    at steady state present and past weigh the same, and a heavy day fades with the half-life.
    """
    state = book.tenant(tenant)
    return max((type_share(book, tenant, t, capacity, half_life_s) for t in set(state.used) | set(state.decayed)), default=0.0)


def type_share(book: QuotaBook, tenant: str, gpu_type: str, capacity: dict[str, int], half_life_s: float) -> float:
    """A tenant's weighted share of one GPU type: its effective use of the type (as in :func:`dominant_share`)
    over the type's GPUs, divided by its weight. What the queue is ordered by: each type is its own pool."""
    state = book.tenant(tenant)
    total = capacity.get(gpu_type, 0)
    if total <= 0:
        return 0.0
    per_s = math.log(2) / half_life_s if half_life_s > 0 else 0.0
    return (state.used.get(gpu_type, 0) + state.decayed.get(gpu_type, 0.0) * per_s) / total / state.weight


def tenant_key(share: float, tenant: str, gpu_type: str) -> tuple[float, str, str]:
    """Across tenants, per GPU type: 1. lowest weighted share of the type, 2. tenant name, 3. GPU type."""
    return (round(share, 12), tenant, gpu_type)


class FairQueue:
    """Jobs in weighted fair-share order per GPU type, recomputed as the cycle binds (progressive filling).

    Each (tenant, GPU type) has its queue; the next job comes from the queue whose tenant has the
    lowest weighted share of that type (:func:`type_share`). After the caller binds or skips it,
    that queue goes back with the share as it is then. Jobs of different types never compete for
    the same GPUs, so a tenant's heavy use of one type does not push back its jobs for another
    (per-type quotas, R4.1, already say what each type owes it); within one type this is weighted
    DRF (R4.2), with past usage fading with the half-life.
    """

    def __init__(self, jobs: list[PendingJob], book: QuotaBook, capacity: dict[str, int], now: float, config: SchedulerConfig) -> None:
        self._book, self._capacity, self._half_life = book, capacity, config.usage_half_life_s
        #: (tenant, GPU type) -> (the tenant's usage version it was computed at, share)
        self._shares: dict[tuple[str, str], tuple[int, float]] = {}
        by_queue: dict[tuple[str, str], list[PendingJob]] = {}
        for job in jobs:
            by_queue.setdefault((job.tenant, job.gpu_type), []).append(job)
        self._queues: dict[tuple[str, str], list[PendingJob]] = {}
        self._next: dict[tuple[str, str], int] = {}
        #: (key, queue, the tenant's usage version the key was computed at)
        self._heap: list[tuple[tuple[float, str, str], tuple[str, str], int]] = []
        for queue in sorted(by_queue):
            self._queues[queue] = sorted(by_queue[queue], key=partial(within_tenant_key, now=now, config=config))
            self._next[queue] = 0
            self._heap.append(self._entry(queue))
        heapq.heapify(self._heap)

    def _share(self, queue: tuple[str, str]) -> float:
        tenant, gpu_type = queue
        version = self._book.tenant(tenant).version
        cached = self._shares.get(queue)
        if cached is None or cached[0] != version:
            cached = (version, type_share(self._book, tenant, gpu_type, self._capacity, self._half_life))
            self._shares[queue] = cached
        return cached[1]

    def _entry(self, queue: tuple[str, str]) -> tuple[tuple[float, str, str], tuple[str, str], int]:
        return (tenant_key(self._share(queue), *queue), queue, self._book.tenant(queue[0]).version)

    def __iter__(self) -> Iterator[PendingJob]:
        heap, queues = self._heap, self._queues
        while heap:
            _, key, version = heapq.heappop(heap)
            queue, index = queues[key], self._next[key]
            state = self._book.tenant(key[0])
            # While the tenant's usage is as it was when its key was computed, the key stands, and it was
            # the smallest (keys are unique by queue): it would be popped again at once, so go on
            # without the heap. (Its usage may have changed since, before the queue was walked: then
            # it gets one job, as every popped queue does, and goes back with its key as it is now.)
            while True:
                yield queue[index]
                index += 1
                if index == len(queue) or state.version != version:
                    break
            self._next[key] = index
            if index < len(queue):
                heapq.heappush(heap, self._entry(key))
