"""Preemption planning (SPEC R5.2): the cheapest victims that let a blocked job start.

Who may be a victim of job P (same GPU type, on a schedulable node), never a job that is
not preemptible, has run less than :func:`protected_s` since it started (``min_runtime_before_preempt_s``,
longer after each restart), or is already being preempted; and only for one of these reasons,
tried in this order:

1. "priority": a job of P's own tenant with a lower priority class;
2. "reclaim": P stays within its tenant's nominal quota, and the victim's tenant is
   borrowing that GPU type (uses more than its nominal, still counting the victims
   already chosen): borrowed GPUs go back to their owner;
3. "max_wait": P has waited ``max_wait_s`` or longer, the victim belongs to another
   tenant, has itself run ``max_wait_s`` or longer since it started, and its priority is
   below P's aged priority; and its tenant is borrowing (or quotas are off), so nobody is
   pushed under its guarantee. This is time slicing: a preempted job requeues with its
   age and may take GPUs back, but only from a job that has run ``max_wait_s`` too, so two
   jobs can never ping-pong faster than that, and each makes progress in every slice.

The plan, like Kueue's: take candidates cheapest first (:func:`victim_cost_key`),
release each on the workspace and try to place P; once P fits, put back each chosen
victim, most expensive first, that P can do without. Everything is rolled back at the
end: the victims still hold their GPUs until they have checkpointed and stopped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain

from scheduler.core.order import aged_priority, victim_cost_key, waited_s
from scheduler.core.placement import Respect, fits_ignoring_holds, gang_reach, place
from scheduler.core.quota import QuotaBook
from scheduler.core.state import DomainKey, NodeState, Pool, Workspace
from scheduler.core.types import Member, PendingJob, RunningJob, SchedulerConfig


@dataclass(frozen=True)
class Plan:
    """Where P goes once the victims stop."""

    members: tuple[Member, ...]
    #: (victim, reason), cheapest first.
    victims: tuple[tuple[RunningJob, str], ...]


class Preemptor:
    """What the victim rules ask about one preemptor P, worked out once for all its candidates."""

    __slots__ = ("aged", "config", "job", "long_waited", "now", "own_tenant_only", "within_nominal")

    def __init__(self, job: PendingJob, book: QuotaBook, now: float, config: SchedulerConfig) -> None:
        self.job, self.now, self.config = job, now, config
        #: P stays within its tenant's nominal quota (reason 2 may apply).
        self.within_nominal = book.within_nominal(job.tenant, job.gpu_type, job.gpu_count)
        #: P has waited ``max_wait_s`` (reason 3 may apply).
        self.long_waited = waited_s(job, now) >= config.max_wait_s
        #: Neither: P may preempt only its own tenant's jobs of a lower priority class (reason 1).
        self.own_tenant_only = not self.within_nominal and not self.long_waited
        self.aged = aged_priority(job, now, config)

    def reason(self, victim: RunningJob) -> str | None:
        """Why ``victim`` may be preempted for P (borrowing aside: checked while planning), or None."""
        job = self.job
        if victim.tenant == job.tenant:
            return "priority" if victim.priority < job.priority else None
        if self.within_nominal:
            return "reclaim"
        if self.long_waited and self.now - victim.started_at >= self.config.max_wait_s and victim.priority < self.aged:
            return "max_wait"
        return None


def _needs_borrowing(job: PendingJob, victim: RunningJob, reason: str, book: QuotaBook) -> bool:
    return book.enabled and victim.tenant != job.tenant and reason in ("reclaim", "max_wait")


def protected_s(job: RunningJob, config: SchedulerConfig) -> float:
    """How long ``job`` runs after it last started before it may be preempted: ``min_runtime_before_preempt_s`` on
    its first attempt, times ``preempt_backoff`` for each restart since, at most ``max(min_runtime_before_preempt_s,
    max_wait_s)``. A job taken back again and again thus runs longer each time and finishes, instead of paying
    restarts for short stints (a small tenant's gang, borrowing whenever it runs, would be every reclaim's victim)."""
    least = config.min_runtime_before_preempt_s
    cap = max(least, config.max_wait_s)
    protected = least
    for _ in range(job.attempt - 1):  # a loop, not a power: no overflow, and it stops at the cap
        if protected >= cap or config.preempt_backoff <= 1.0:
            break
        protected *= config.preempt_backoff
    return min(protected, cap)


def preemptible_now(victims: Iterable[RunningJob], now: float, config: SchedulerConfig) -> list[RunningJob]:
    """Of the jobs that may ever be victims (preemptible, on a schedulable node: ``Workspace.victims``),
    those that have run long enough to be victims this cycle (:func:`protected_s`; computed once per GPU type),
    in no set order."""
    return [job for job in victims if now - job.started_at >= protected_s(job, config)]


def candidates(
    preemptor: Preemptor,
    book: QuotaBook,
    pool: list[RunningJob],
    stopping: set[str],
    by_tenant: dict[str, list[RunningJob]] | None = None,
) -> Iterator[tuple[RunningJob, str]]:
    """Eligible victims for the preemptor's job from ``pool`` (see :func:`preemptible_now`), in the pool's order.

    ``by_tenant`` (the same pool grouped by tenant) narrows the walk to the jobs that can pass:
    a job that may only preempt for priority looks at its own tenant's jobs alone; with quotas
    on, another tenant's job is a victim only while that tenant borrows the type.
    """
    job = preemptor.job
    if by_tenant is not None:
        if preemptor.own_tenant_only:
            pool = by_tenant.get(job.tenant, [])
        elif book.enabled:
            pool = list(
                chain.from_iterable(
                    victims for tenant, victims in by_tenant.items() if tenant == job.tenant or book.borrowing(tenant, job.gpu_type)
                )
            )
    for victim in pool:
        if victim.id in stopping:
            continue
        reason = preemptor.reason(victim)
        if reason is None:
            continue
        if _needs_borrowing(job, victim, reason, book) and not book.borrowing(victim.tenant, job.gpu_type):
            continue
        yield victim, reason


def _victim_gpus(ws: Workspace, victim: RunningJob) -> list[tuple[NodeState, tuple[int, ...]]]:
    out = []
    for member in victim.members:
        node = ws.by_id.get(member.node_id)
        if node is not None:
            gpus = tuple(g for g in member.gpu_indices if g not in node.free and g < node.size)
            if gpus:
                out.append((node, gpus))
    return out


def _fits_if_all_released(ws: Workspace, pool: Pool, job: PendingJob, eligible: list[tuple[RunningJob, str]]) -> bool:
    """Could ``job`` fit, ignoring reservations, if every eligible victim stopped? A necessary condition
    of a plan (the walk releases a subset of them), cheap next to the walk, and false for most blocked gangs."""
    released: dict[str, set[int]] = {}
    for victim, _ in eligible:
        for node, gpus in _victim_gpus(ws, victim):
            released.setdefault(node.id, set()).update(gpus)
    if job.gpu_count <= pool.max_size:
        if fits_ignoring_holds(ws, pool, job):
            return True
        return any(len(ws.by_id[n].free) + len(gpus - ws.by_id[n].free) >= job.gpu_count for n, gpus in released.items())
    if pool.big <= 0:
        return False
    need = math.ceil(job.gpu_count / pool.big)
    reach = gang_reach(ws.upper, job)
    if reach is None:
        return False
    top, spanning = reach
    extra: list[dict[DomainKey, int]] = [{} for _ in range(top + 1)]
    extra_total = 0
    for node_id, freed in released.items():
        node = ws.by_id[node_id]
        if node.size != pool.big or len(node.free) == node.size or len(node.free | freed) != node.size:
            continue
        extra_total += 1
        for level in range(top + 1):
            key = node.domains[level]
            extra[level][key] = extra[level].get(key, 0) + 1
    if spanning and pool.whole_total + extra_total >= need:
        return True
    return any(pool.whole[level].get(key, 0) + count >= need for level in range(top + 1) for key, count in extra[level].items()) or any(
        count >= need for level in range(top + 1) for count in pool.whole[level].values()
    )


def plan_preemption(
    ws: Workspace,
    pool: Pool,
    book: QuotaBook,
    job: PendingJob,
    eligible: Iterable[tuple[RunningJob, str]],
    respect: Respect,
    now: float,
) -> Plan | None:
    """The cheapest victim set that lets ``job`` be placed, or None. Leaves the workspace as it found it.

    Victims are tried cheapest first (:func:`victim_cost_key` at ``now``), but only once the job is
    known to fit if all of them stopped: most blocked gangs are not, and they cost no sort and no walk.
    """
    eligible = list(eligible)
    if not _fits_if_all_released(ws, pool, job, eligible):
        return None
    eligible.sort(key=lambda pair: victim_cost_key(pair[0], now))
    start = ws.mark()
    chosen: list[tuple[RunningJob, str, list[tuple[NodeState, tuple[int, ...]]]]] = []
    given: dict[str, int] = {}
    fits = False
    for victim, reason in eligible:
        if _needs_borrowing(job, victim, reason, book) and not book.borrowing(victim.tenant, job.gpu_type, given.get(victim.tenant, 0)):
            continue
        released = _victim_gpus(ws, victim)
        for node, gpus in released:
            ws.give(node, gpus)
        given[victim.tenant] = given.get(victim.tenant, 0) + victim.entitled_gpus
        chosen.append((victim, reason, released))
        if fits_ignoring_holds(ws, pool, job) and place(ws, pool, job, respect) is not None:
            fits = True
            break
    if not fits:
        ws.rollback(start)
        return None
    # Minimise: the last victim made it fit; any earlier one P can do without goes back.
    for index in range(len(chosen) - 2, -1, -1):
        before = ws.mark()
        for node, gpus in chosen[index][2]:
            ws.take(node, gpus)
        if not fits_ignoring_holds(ws, pool, job) or place(ws, pool, job, respect) is None:
            ws.rollback(before)
        else:
            del chosen[index]
    members = place(ws, pool, job, respect)
    ws.rollback(start)
    assert members is not None
    return Plan(members=members, victims=tuple((victim, reason) for victim, reason, _ in chosen))
