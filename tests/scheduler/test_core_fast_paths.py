"""The cycle's hot paths, written out for speed, against their plain definitions.

Each hot path (quota admission, the fair queue's runs) is checked against a direct
transcription of the rule it implements, on random inputs.
"""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import PendingJob, Quota, SchedulerConfig, TenantView
from scheduler.core.order import FairQueue, tenant_key, type_share, within_tenant_key
from scheduler.core.quota import QuotaBook

TYPES = ("A", "B")
NAMES = ("t0", "t1", "t2", "t3")

quotas = st.builds(
    Quota,
    nominal=st.integers(0, 16),
    borrow_limit=st.none() | st.integers(0, 16),
    lend_limit=st.none() | st.integers(0, 16),
)


@st.composite
def books(draw: st.DrawFn) -> tuple[tuple[TenantView, ...], dict[tuple[str, str], int]]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
    views = tuple(
        TenantView(
            name=name,
            weight=draw(st.sampled_from((0.5, 1.0, 2.0))),
            cohort=draw(st.sampled_from((None, "c1", "c2"))),
            quotas=tuple((t, draw(quotas)) for t in TYPES if draw(st.booleans())),
            decayed_usage=tuple((t, draw(st.floats(0, 1e5))) for t in TYPES if draw(st.booleans())),
        )
        for name in names
    )
    usage = {(name, t): draw(st.integers(0, 24)) for name in NAMES for t in TYPES if draw(st.booleans())}
    return views, usage


def _borrowed(q: Quota, used: int) -> int:
    return max(0, used - q.nominal)


def _lendable(q: Quota, used: int) -> int:
    idle = max(0, q.nominal - used)
    return idle if q.lend_limit is None else min(q.lend_limit, idle)


def reference_admits(views: tuple[TenantView, ...], used: dict[tuple[str, str], int], name: str, gpu_type: str, gpus: int) -> bool:
    """Rules 1 and 2 of scheduler/core/quota.py, from scratch."""
    by_name = {v.name: v for v in views}
    view = by_name.get(name)
    cohort = view.cohort if view is not None else None

    def quota(tenant: str) -> Quota:
        v = by_name.get(tenant)
        found = dict(v.quotas).get(gpu_type) if v is not None else None
        if found is None:
            return Quota(nominal=0, borrow_limit=0, lend_limit=0) if v is None or v.cohort is None else Quota()
        return found

    after = {k: n for k, n in used.items()}
    after[(name, gpu_type)] = after.get((name, gpu_type), 0) + gpus
    mine = quota(name)
    if after[(name, gpu_type)] <= mine.nominal:
        return True
    if cohort is None:
        return False
    if mine.borrow_limit is not None and after[(name, gpu_type)] > mine.nominal + mine.borrow_limit:
        return False
    members = [v.name for v in views if v.cohort == cohort]
    borrowed = sum(_borrowed(quota(m), after.get((m, gpu_type), 0)) for m in members)
    lendable = sum(_lendable(quota(m), after.get((m, gpu_type), 0)) for m in members)
    return borrowed <= lendable


@settings(max_examples=1500, deadline=None)
@given(books(), st.sampled_from(NAMES), st.sampled_from(TYPES), st.integers(0, 20))
def test_admission_and_the_nominal_check_follow_the_quota_rules(world, name: str, gpu_type: str, gpus: int) -> None:
    views, usage = world
    known = {v.name for v in views}
    usage = {k: n for k, n in usage.items() if k[0] in known}
    book = QuotaBook(views, usage=usage)
    assert book.admits(name, gpu_type, gpus) == reference_admits(views, usage, name, gpu_type, gpus)
    view = {v.name: v for v in views}.get(name)
    nominal = dict(view.quotas).get(gpu_type, Quota()).nominal if view is not None else 0
    assert book.within_nominal(name, gpu_type, gpus) == (usage.get((name, gpu_type), 0) + gpus <= nominal)


@st.composite
def queues(draw: st.DrawFn) -> list[PendingJob]:
    jobs = []
    for i in range(draw(st.integers(0, 14))):
        queued = draw(st.floats(0, 5000))
        jobs.append(
            PendingJob(
                id=f"j{i:02d}",
                tenant=draw(st.sampled_from(NAMES)),
                attempt=1,
                gpu_type=draw(st.sampled_from(TYPES)),
                gpu_count=draw(st.integers(1, 8)),
                priority=draw(st.sampled_from((0, 100, 200))),
                queued_at=queued,
                submitted_at=draw(st.none() | st.floats(0, queued)),
            )
        )
    return jobs


@settings(max_examples=500, deadline=None)
@given(books(), queues(), st.lists(st.booleans(), max_size=14), st.lists(st.tuples(st.sampled_from(NAMES), st.integers(1, 16)), max_size=3))
def test_the_fair_queue_pops_as_a_heap_recomputed_after_every_job(
    world, jobs: list[PendingJob], binds: list[bool], before: list[tuple[str, int]]
) -> None:
    """Reference: one queue per (tenant, GPU type); after each job, the queue goes back on the heap with its
    tenant's share of that type as it is then.

    ``before``: binds made after the queue was built and before it is walked (the cycle binds
    holders of standing reservations first), so some keys on the heap are stale when popped.
    """
    views, usage = world
    config = SchedulerConfig()
    capacity = {"A": 16, "B": 8}
    now = 20000.0
    got: list[str] = []
    book = QuotaBook(views, usage=usage)
    queue = FairQueue(list(jobs), book, capacity, now, config)
    for name, gpus in before:
        book.add(name, "A", gpus)
    for n, job in enumerate(queue):
        got.append(job.id)
        if n < len(binds) and binds[n]:
            book.add(job.tenant, job.gpu_type, job.gpu_count)

    want: list[str] = []
    book = QuotaBook(views, usage=usage)
    by_queue: dict[tuple[str, str], list[PendingJob]] = {}
    for job in jobs:
        by_queue.setdefault((job.tenant, job.gpu_type), []).append(job)
    for q in by_queue:
        by_queue[q].sort(key=lambda j: within_tenant_key(j, now, config))

    def key(q: tuple[str, str]) -> tuple[float, str, str]:
        return tenant_key(type_share(book, q[0], q[1], capacity, config.usage_half_life_s), *q)

    heap = [(key(q), q) for q in by_queue]
    heapq.heapify(heap)
    for name, gpus in before:
        book.add(name, "A", gpus)
    while heap:
        _, q = heapq.heappop(heap)
        job = by_queue[q].pop(0)
        n = len(want)
        want.append(job.id)
        if n < len(binds) and binds[n]:
            book.add(job.tenant, job.gpu_type, job.gpu_count)
        if by_queue[q]:
            heapq.heappush(heap, (key(q), q))
    assert got == want
