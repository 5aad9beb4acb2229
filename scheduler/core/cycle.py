"""One scheduling cycle: ``decisions = run_cycle(snapshot, now)``.

The phases (each a named function below; docs/scheduler.md states the policy):

1. ``build_cycle``: the working copy of free GPUs with its indexes and the quota book
   (:class:`scheduler.core.incremental.Scheduler` keeps the working copy from cycle to cycle and
   only brings it up to date).
2. ``restore_nominations``: a standing nomination whose victims still run keeps its
   GPUs; one whose victims have stopped binds onto them.
3. ``order_queue``: holders of standing reservations first, then the fast lane (short jobs), then
   the rest; each in weighted fair share per GPU type across tenants, priority with aging (and the
   short-job boost) and age within a tenant.
4. ``admit``, per job in that order: can the shape ever fit; quota; placement (honouring
   reservations: EASY backfill); if blocked, a preemption plan when entitled; else the
   first blocked job of its GPU type takes that type's reservation for this cycle.
5. ``settle_reservations``: per GPU type, a standing holder still blocked keeps the reservation
   fed back next cycle; else the blocked job of the tenant with the lowest share of the type (its
   longest waiter, by aged priority) takes it (anti-starvation); then
   ``grow``: elastic jobs take GPUs long idle where no job of their type waits
   (:mod:`scheduler.core.elastic`; shrinking comes in phase 4, before any preemption plan).
6. ``fragmentation``: stranded GPUs and the largest gang placeable, per GPU type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain

from scheduler.core.elastic import grow, plan_shrink
from scheduler.core.order import FairQueue, in_fast_lane, reservation_head_key, standing_key, type_share
from scheduler.core.placement import Respect, fits_ignoring_holds, level_index, never_fits, place
from scheduler.core.preempt import Plan, Preemptor, candidates, plan_preemption, preemptible_now
from scheduler.core.quota import QuotaBook
from scheduler.core.reasons import Pending, PendingReason, pending_reason
from scheduler.core.reserve import plan_reservation
from scheduler.core.state import Pool, Workspace
from scheduler.core.types import (
    Bind,
    Decisions,
    Fragmentation,
    Member,
    PendingJob,
    Preempt,
    Reservation,
    Resize,
    RunningJob,
    SchedulerConfig,
    Snapshot,
)


@dataclass
class Cycle:
    """Everything one cycle knows and has decided so far."""

    now: float
    config: SchedulerConfig
    ws: Workspace
    book: QuotaBook
    pending: dict[str, PendingJob]
    running: dict[str, RunningJob]
    #: DRF denominators: GPUs per type.
    capacity: dict[str, int]
    standing: dict[str, Reservation]
    binds: list[Bind] = field(default_factory=list)
    reasons: dict[str, PendingReason] = field(default_factory=dict)
    preemptions: list[Preempt] = field(default_factory=list)
    nominations: list[Reservation] = field(default_factory=list)
    #: GPU type -> (holder, its reservation): one EASY reservation per type.
    easy: dict[str, tuple[PendingJob, Reservation]] = field(default_factory=dict)
    #: GPU type -> jobs that are entitled (quota) but do not fit and have no preemption plan.
    blocked: dict[str, list[PendingJob]] = field(default_factory=dict)
    #: Jobs being preempted: never picked again.
    stopping: set[str] = field(default_factory=set)
    #: Nodes that carry a nomination: not offered to reservations.
    nominated: set[int] = field(default_factory=set)
    #: Jobs decided before phase 4 (nominations).
    done: set[str] = field(default_factory=set)
    plans_made: int = 0
    #: GPU type -> running jobs that may be victims this cycle, in no set order (built on first need).
    victim_pool: dict[str, list[RunningJob]] = field(default_factory=dict)
    #: The same, per GPU type and tenant.
    victims_by_tenant: dict[str, dict[str, list[RunningJob]]] = field(default_factory=dict)
    #: Shape -> smallest GPU count that did not fit even ignoring reservations. Free GPUs
    #: only shrink during phase 4, so every later job of that shape and at least that size fails too.
    no_fit_from: dict[tuple[str, int, bool], int] = field(default_factory=dict)
    #: Per job shape (GPU type, count, topology level, required): what admission derives from the shape alone.
    shapes: dict[tuple[str, int, str, bool], ShapeInfo] = field(default_factory=dict)
    #: (GPU type, tenant) -> the lowest priority among its jobs that may be victims this cycle (built on first need).
    own_lowest: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (tenant, GPU type, the tenant's usage version, the job's GPU count) -> its "over quota" reason.
    quota_reasons: dict[tuple[str, str, int, int], PendingReason] = field(default_factory=dict)
    #: Elastic jobs' resizes decided so far, and the jobs they concern (at most one resize per job per cycle).
    resizes: list[Resize] = field(default_factory=list)
    resizing: set[str] = field(default_factory=set)
    #: GPU type -> running elastic jobs (built on first need).
    elastic: dict[str, list[RunningJob]] | None = None
    #: Shrink plans tried this cycle (bounded like preemption plans).
    shrink_plans: int = 0


def run_cycle(snapshot: Snapshot, now: float) -> Decisions:
    """Decide which queued jobs start now, on which GPUs, what to preempt, and why the rest wait.

    Args:
        snapshot: the fleet, the queue, running jobs, tenants, config and standing reservations.
        now: the cycle's clock (injected; the core never reads a clock).

    Returns:
        Bindings in commit order, preemptions, reservations (feed them back as
        ``Snapshot.reservations``), a pending reason for every job left waiting, and fragmentation.
    """
    # 1. Working copy, indexes, quota book.
    return decide(build_cycle(snapshot, now), snapshot)


def decide(cycle: Cycle, snapshot: Snapshot) -> Decisions:
    """Phases 2-6 on a built cycle."""
    # 2. Standing nominations.
    restore_nominations(cycle, snapshot.reservations)
    # 3. Order.
    queue = order_queue(cycle)
    # 4. Admit in order; jobs that would borrow from the cohort wait for a second pass, after every
    #    job that fits its own tenant's guarantee, so that nobody borrows what its owner claims
    #    in the same cycle (as Kueue orders non-borrowing workloads first). A standing reservation's
    #    holder is not deferred: its nodes are held before anyone else is placed, or a borrowing
    #    gang's drained nodes would go to the first owner's job each time they came free.
    borrowers = []
    for job in queue:
        if (
            job.id not in cycle.standing
            and cycle.book.tenant(job.tenant).cohort is not None
            and not cycle.book.within_nominal(job.tenant, job.gpu_type, job.gpu_count)
        ):
            borrowers.append(job)
            continue
        admit(cycle, job)
    for job in borrowers:
        admit(cycle, job)
    # 5. Reservation heads; elastic jobs grow onto what nobody waits for.
    settle_reservations(cycle)
    grow(cycle)
    # 6. Output.
    reservations = [res for _, (_, res) in sorted(cycle.easy.items())] + cycle.nominations
    return Decisions(
        binds=tuple(cycle.binds),
        pending_reasons={job_id: why.text for job_id, why in cycle.reasons.items()},
        pending_codes={job_id: why.code for job_id, why in cycle.reasons.items()},
        preemptions=tuple(cycle.preemptions),
        reservations=tuple(reservations),
        fragmentation=fragmentation(cycle.ws),
        # A job that a standing nomination preempts is not also resized (the preemption frees its GPUs anyway).
        resizes=tuple(r for r in cycle.resizes if r.job_id not in cycle.stopping),
    )


def queue_order(snapshot: Snapshot, now: float) -> list[str]:
    """Pending job ids in the order the cycle would grant them if each got its GPUs in turn.

    Each job is charged to its tenant as it is listed, so the fair share interleaves tenants
    as the cycle's progressive filling does (for queue listings and position estimates).
    """
    cycle = build_cycle(snapshot, now)
    order = []
    for job in order_queue(cycle):
        order.append(job.id)
        cycle.book.add(job.tenant, job.gpu_type, job.gpu_count)
    return order


# ---------------------------------------------------------------- 1. build


def build_cycle(snapshot: Snapshot, now: float) -> Cycle:
    """Phase 1: index the fleet, count usage against quotas."""
    ws = Workspace(snapshot, now)
    return cycle_on(snapshot, now, ws, QuotaBook(snapshot.tenants, snapshot.running))


def cycle_on(snapshot: Snapshot, now: float, ws: Workspace, book: QuotaBook) -> Cycle:
    """Phase 1 on a workspace and a quota book already at ``snapshot`` (built here, or kept by a ``Scheduler``)."""
    pending: dict[str, PendingJob] = {}
    for waiting in sorted(snapshot.pending, key=lambda j: (j.id, j.attempt)):
        pending[waiting.id] = waiting
    standing: dict[str, Reservation] = {}
    for res in sorted(snapshot.reservations, key=standing_key):
        if res.job_id in pending and res.job_id not in standing:
            standing[res.job_id] = res
    return Cycle(
        now=now,
        config=snapshot.config,
        ws=ws,
        book=book,
        pending=pending,
        running=ws.running,
        capacity={t: p.capacity for t, p in ws.pools.items()},
        standing=standing,
    )


# ---------------------------------------------------------------- 2. nominations


def restore_nominations(cycle: Cycle, standing: tuple[Reservation, ...]) -> None:
    """Phase 2: keep nominated GPUs for their preemptor while the victims stop; bind once they have.

    A nomination is void (and its job goes through phase 4 again) when a planned GPU is
    neither free nor held by one of its victims, or its GPU type has no schedulable node.
    """
    del standing  # cycle.standing holds the ones that still matter, in standing_key order
    ws = cycle.ws
    for res in cycle.standing.values():
        job = cycle.pending[res.job_id]
        pool = ws.pools.get(job.gpu_type)
        if not (res.victims or res.shrinks) or not res.members or pool is None:
            continue
        still = [cycle.running[v] for v in res.victims if v in cycle.running]
        shrinking = [
            (s, cycle.running[s.job_id])
            for s in res.shrinks
            if s.job_id in cycle.running and cycle.running[s.job_id].attempt == s.attempt and cycle.running[s.job_id].members != s.members
        ]
        victim_gpus = {(m.node_id, g) for v in still for m in v.members for g in m.gpu_indices}
        victim_gpus |= {(m.node_id, g) for _, d in shrinking for m in d.members for g in m.gpu_indices}
        planned = [(m.node_id, g) for m in res.members for g in m.gpu_indices]
        nodes_ok = all(node_id in ws.by_id and ws.by_id[node_id].gpu_type == job.gpu_type for node_id, _ in planned)
        if not nodes_ok or sum(len(m.gpu_indices) for m in res.members) != job.gpu_count:
            continue
        if not all(g in ws.by_id[n].free or (n, g) in victim_gpus for n, g in planned):
            continue
        if all(g in ws.by_id[n].free for n, g in planned):
            if cycle.book.admits(job.tenant, job.gpu_type, job.gpu_count):
                bind(cycle, pool, job, res.members, None)
                cycle.done.add(job.id)
            continue
        reason = res.reason or "reclaim"
        shrinks = tuple(s for s, _ in shrinking)
        nominate(cycle, job, res.members, res.node_ids, res.start_at, [(v, reason) for v in still], reason, shrinks)
        cycle.done.add(job.id)


# ---------------------------------------------------------------- 3. order


def order_queue(cycle: Cycle) -> Iterator[PendingJob]:
    """Phase 3: 1. holders of standing reservations (earliest start first), 2. the fast lane (jobs expected to use
    at most ``fast_lane_gpu_h`` GPU-hours), 3. the rest; 2 and 3 each in weighted fair-share order per GPU type
    (:class:`scheduler.core.order.FairQueue`).

    The fair part is lazy: a tenant's share is recomputed after each of its binds, and the rest's queue is
    built only once the lane has been walked, so it starts from the shares the lane's binds left. The lane is
    bounded (``fast_lane_max_share``): a lane job that would take its type's lane past the bound joins the rest.
    """
    first = [cycle.pending[job_id] for job_id in cycle.standing if job_id not in cycle.done]
    taken = cycle.done | {job.id for job in first}
    lane: list[PendingJob] = []
    rest: list[PendingJob] = []
    for job_id, job in cycle.pending.items():
        if job_id not in taken:
            (lane if in_fast_lane(job, cycle.config) else rest).append(job)
    rest_queue = _later(lambda: FairQueue(rest, cycle.book, cycle.capacity, cycle.now, cycle.config))
    return chain(first, _bounded_lane(cycle, lane, rest), rest_queue)


def _bounded_lane(cycle: Cycle, lane: list[PendingJob], rest: list[PendingJob]) -> Iterator[PendingJob]:
    """The lane in fair order, bounded per GPU type: the running lane jobs and the lane jobs listed so far this
    cycle (whether they bind now, in the borrowers' pass or not at all) hold at most ``fast_lane_max_share`` of
    the type's GPUs; a job past the bound is moved to ``rest`` (not yet built) and queues with it."""
    if not lane:
        return
    config = cycle.config
    held = dict(cycle.ws.lane_held_for(config.fast_lane_gpu_h * 3600.0))
    for job in FairQueue(lane, cycle.book, cycle.capacity, cycle.now, config):
        used = held.get(job.gpu_type, 0) + job.gpu_count
        if used > config.fast_lane_max_share * cycle.capacity.get(job.gpu_type, 0):
            rest.append(job)
            continue
        held[job.gpu_type] = used
        yield job


def _later(make: Callable[[], Iterable[PendingJob]]) -> Iterator[PendingJob]:
    """Iterate what ``make`` builds, built only when the first item is asked for."""
    yield from make()


# ---------------------------------------------------------------- 4. admit


def admit(cycle: Cycle, job: PendingJob) -> None:
    """Phase 4 for one job: bind it, plan a preemption for it, reserve for it, or say why it waits."""
    ws = cycle.ws
    shape = (job.gpu_type, job.gpu_count, job.topology_level, job.topology_required)
    info = cycle.shapes.get(shape)
    if info is None:
        info = cycle.shapes[shape] = _shape_info(ws, job)
    # The reasons are tried in Pending's rank order: the first that applies is the job's.
    shape_reason, pool, cache_key = info
    if pool is None:
        cycle.reasons[job.id] = shape_reason  # it can never fit
        return
    if not cycle.config.backfill and job.gpu_type in cycle.easy:
        cycle.reasons[job.id] = pending_reason(Pending.BACKFILL_OFF, holder=cycle.easy[job.gpu_type][0].id)
        return
    end = cycle.now + job.expected_s
    entitled = cycle.book.admits(job.tenant, job.gpu_type, job.gpu_count)
    hopeless = job.gpu_count >= cycle.no_fit_from.get(cache_key, _NEVER_FAILED)
    if entitled and not hopeless:
        members = place(ws, pool, job, end)
        if members is not None:
            bind(cycle, pool, job, members, end)
            return
    fits = False if hopeless or (entitled and not pool.holds) else fits_ignoring_holds(ws, pool, job)
    if not fits and not hopeless:
        cycle.no_fit_from[cache_key] = job.gpu_count
    if not entitled:
        cycle.reasons[job.id] = shape_reason if not fits else _over_quota(cycle, job)
        return
    if fits:
        ignoring = place(ws, pool, job, None)
        assert ignoring is not None
        cycle.reasons[job.id] = pending_reason(Pending.RESERVED, holder=_blocking_holder(pool, ws, ignoring, job))
        return
    if cycle.shrink_plans < cycle.config.max_preemption_plans:
        shrink = plan_shrink(cycle, pool, job, end)
        if shrink is not None:
            cycle.shrink_plans += 1
            members, shrinks = shrink
            nominate(cycle, job, members, tuple(m.node_id for m in members), cycle.now, (), "shrink", shrinks)
            return
    plan = _try_preemption(cycle, pool, job, end)
    if plan is not None:
        commit_plan(cycle, job, plan)
        return
    cycle.blocked.setdefault(job.gpu_type, []).append(job)
    cycle.reasons[job.id] = shape_reason
    if job.gpu_type not in cycle.easy:
        reserve(cycle, pool, job)


#: Larger than any GPU count: no job of the key has failed to fit yet.
_NEVER_FAILED = 1 << 62

#: Per job shape, for one cycle: why it can never fit and no pool, or why it does not fit now and its pool;
#: and its no-fit key.
ShapeInfo = tuple[PendingReason, Pool | None, tuple[str, int, bool]]


def _shape_info(ws: Workspace, job: PendingJob) -> ShapeInfo:
    pool = ws.pools.get(job.gpu_type)
    never = never_fits(ws, pool, job)
    if never is not None:
        return never, None, (job.gpu_type, 0, False)
    assert pool is not None  # a GPU type without nodes can never fit
    return no_fit_reason(job, pool), pool, _fit_key(ws.upper, pool, job)


def _over_quota(cycle: Cycle, job: PendingJob) -> PendingReason:
    book = cycle.book
    tenant = book.tenant(job.tenant)
    key = (job.tenant, job.gpu_type, tenant.version, job.gpu_count)
    found = cycle.quota_reasons.get(key)
    if found is None:
        quota = book.quota(job.tenant, job.gpu_type)
        found = cycle.quota_reasons[key] = pending_reason(
            Pending.OVER_QUOTA,
            tenant=job.tenant,
            used=book.used(job.tenant, job.gpu_type),
            count=job.gpu_count,
            gpu_type=job.gpu_type,
            nominal=quota.nominal,
            cohort=tenant.cohort,
            borrow_limit=quota.borrow_limit,
        )
    return found


def _fit_key(upper: tuple[str, ...], pool: Pool, job: PendingJob) -> tuple[str, int, bool]:
    """Jobs with the same key fail alike: single-node jobs of a type; gangs of a type under the same cap."""
    if job.gpu_count <= pool.max_size:
        return (job.gpu_type, -2, False)
    if job.topology_level == "any" or not job.topology_required:
        return (job.gpu_type, len(upper), True)
    cap = level_index(upper, job.topology_level)
    return (job.gpu_type, -1 if cap is None else cap, False)


def no_fit_reason(job: PendingJob, pool: Pool, holds: tuple[str, ...] = (), start_at: float = 0.0, now: float = 0.0) -> PendingReason:
    """Why a job that an emptier fleet could hold does not fit now (and the reservation it holds, if any)."""
    if not pool.nodes:
        return pending_reason(Pending.NO_SCHEDULABLE_NODE, gpu_type=job.gpu_type)
    held = {"holds": holds, "start_at": start_at, "now": now}
    if job.gpu_count <= pool.max_size:
        return pending_reason(Pending.NO_FREE_NODE, gpu_type=job.gpu_type, count=job.gpu_count, **held)
    level = job.topology_level if job.topology_level != "any" and job.topology_required else None
    return pending_reason(Pending.NO_FREE_DOMAIN, gpu_type=job.gpu_type, count=job.gpu_count, level=level, **held)


def _blocking_holder(pool: Pool, ws: Workspace, members: tuple[Member, ...], job: PendingJob) -> str:
    for member in members:
        hold = pool.holds.get(ws.by_id[member.node_id].ord)
        if hold is not None and hold.job_id != job.id:
            return hold.job_id
    return min(h.job_id for h in pool.holds.values())


def bind(cycle: Cycle, pool: Pool, job: PendingJob, members: tuple[Member, ...], end: Respect) -> None:
    """Commit a placement on the working copy: GPUs taken, quota counted, reservation spare used."""
    ws = cycle.ws
    job_end = cycle.now + job.expected_s if end is None else end
    for member in members:
        node = ws.by_id[member.node_id]
        ws.take(node, member.gpu_indices)
        ws.add_end(node, job_end, len(member.gpu_indices))
        hold = pool.holds.get(node.ord)
        if hold is not None and hold.job_id != job.id and job_end > hold.start_at:
            hold.spare -= len(member.gpu_indices)
    ws.commit()
    cycle.book.add(job.tenant, job.gpu_type, job.gpu_count)
    cycle.binds.append(Bind(job_id=job.id, attempt=job.attempt, members=members))


def _try_preemption(cycle: Cycle, pool: Pool, job: PendingJob, end: float) -> Plan | None:
    if cycle.plans_made >= cycle.config.max_preemption_plans:
        return None
    if job.gpu_type not in cycle.victim_pool:
        pool_now = preemptible_now(cycle.ws.victims.get(job.gpu_type, {}).values(), cycle.now, cycle.config)
        by_tenant: dict[str, list[RunningJob]] = {}
        for victim in pool_now:
            by_tenant.setdefault(victim.tenant, []).append(victim)
        cycle.victim_pool[job.gpu_type] = pool_now
        cycle.victims_by_tenant[job.gpu_type] = by_tenant
        for tenant, victims in by_tenant.items():
            cycle.own_lowest[(job.gpu_type, tenant)] = min(v.priority for v in victims)
    preemptor = Preemptor(job, cycle.book, cycle.now, cycle.config)
    if preemptor.own_tenant_only:
        # It may preempt only its own tenant's lower-priority jobs: none at all means no plan (and no plan counted).
        lowest = cycle.own_lowest.get((job.gpu_type, job.tenant))
        if lowest is None or lowest >= job.priority:
            return None
    # A job already shrinking this cycle is no victim: one decision per job per cycle.
    busy = cycle.stopping | cycle.resizing if cycle.resizing else cycle.stopping
    eligible = candidates(preemptor, cycle.book, cycle.victim_pool[job.gpu_type], busy, cycle.victims_by_tenant[job.gpu_type])
    first = next(eligible, None)
    if first is None:
        return None
    cycle.plans_made += 1
    eligible = chain([first], eligible)
    return plan_preemption(cycle.ws, pool, cycle.book, job, eligible, end, cycle.now)


def commit_plan(cycle: Cycle, job: PendingJob, plan: Plan) -> None:
    """Nominate ``job`` for a new plan; its reservation's reason is "priority" when any victim's is."""
    reason = "priority" if any(why == "priority" for _, why in plan.victims) else plan.victims[0][1]
    nominate(cycle, job, plan.members, tuple(m.node_id for m in plan.members), cycle.now, plan.victims, reason)


def nominate(
    cycle: Cycle,
    job: PendingJob,
    members: tuple[Member, ...],
    node_ids: tuple[str, ...],
    start_at: float,
    victims: Sequence[tuple[RunningJob, str]],
    reason: str,
    shrinks: tuple[Resize, ...] = (),
) -> None:
    """Preempt the victims (and shrink the elastic donors) for ``job``, hold its planned GPUs that are free now, reserve its nodes."""
    ws = cycle.ws
    for member in members:
        node = ws.by_id[member.node_id]
        free_now = tuple(g for g in member.gpu_indices if g in node.free)
        if free_now:
            ws.take(node, free_now)
        cycle.nominated.add(node.ord)
    ws.commit()
    for victim, why in victims:
        cycle.stopping.add(victim.id)
        cycle.preemptions.append(Preempt(job_id=victim.id, attempt=victim.attempt, for_job=job.id, reason=why))
    for shrink in shrinks:
        cycle.resizing.add(shrink.job_id)
        cycle.resizes.append(shrink)
    victim_ids = tuple(v.id for v, _ in victims)
    cycle.nominations.append(
        Reservation(
            job_id=job.id, node_ids=node_ids, start_at=start_at, victims=victim_ids, members=members, reason=reason, shrinks=shrinks
        )
    )
    if victim_ids or not shrinks:
        cycle.reasons[job.id] = pending_reason(Pending.PREEMPTING, victims=victim_ids)
    else:
        cycle.reasons[job.id] = pending_reason(Pending.SHRINKING, donors=tuple(s.job_id for s in shrinks))


def reserve(cycle: Cycle, pool: Pool, job: PendingJob) -> bool:
    """Give ``job`` its GPU type's reservation for the rest of the cycle. False when nothing ever frees."""
    standing = cycle.standing.get(job.id)
    keep = standing.node_ids if standing is not None and not (standing.victims or standing.shrinks) else ()
    planned = plan_reservation(cycle.ws, pool, job, cycle.nominated, keep)
    if planned is None:
        return False
    nodes, start_at, holds = planned
    for node, hold in zip(nodes, holds, strict=True):
        pool.holds[node.ord] = hold
    res = Reservation(job_id=job.id, node_ids=tuple(sorted(n.id for n in nodes)), start_at=start_at)
    cycle.easy[job.gpu_type] = (job, res)
    cycle.reasons[job.id] = no_fit_reason(job, pool, holds=res.node_ids, start_at=start_at, now=cycle.now)
    return True


# ---------------------------------------------------------------- 5. settle


def settle_reservations(cycle: Cycle) -> None:
    """Phase 5: per GPU type, the reservation fed back next cycle goes to the blocked job with the best
    :func:`reservation_head_key`, unless it already belongs to a standing holder that is still blocked.

    Phase 4 gave it to the first blocked job in queue order (protecting this cycle), which may be a
    fast-lane job or a job within its tenant's guarantee; across cycles it goes to the blocked job of
    the tenant furthest below its share of the type, its longest waiter first, and stays with it
    until it starts, so no stream of jobs ahead in the queue can keep a big gang from being protected.
    """
    for gpu_type in sorted(cycle.blocked):
        blocked = cycle.blocked[gpu_type]
        current = cycle.easy.get(gpu_type)
        if current is not None and current[0].id in cycle.standing:
            continue
        shares = {
            tenant: type_share(cycle.book, tenant, gpu_type, cycle.capacity, cycle.config.usage_half_life_s)
            for tenant in {j.tenant for j in blocked}
        }
        head = min(blocked, key=lambda j: reservation_head_key(j, shares[j.tenant], cycle.now, cycle.config))
        if current is not None and current[0].id == head.id:
            continue
        pool = cycle.ws.pools[gpu_type]
        if current is not None:
            for ordinal in [o for o, h in pool.holds.items() if h.job_id == current[0].id]:
                del pool.holds[ordinal]
            del cycle.easy[gpu_type]
            cycle.reasons[current[0].id] = no_fit_reason(current[0], pool)
        if not reserve(cycle, pool, head) and current is not None:
            reserve(cycle, pool, current[0])


# ---------------------------------------------------------------- 6. fragmentation


def fragmentation(ws: Workspace) -> Fragmentation:
    """Per GPU type, after this cycle's binds: free GPUs on partly used nodes, and the largest gang placeable now."""
    stranded, largest = [], []
    for gpu_type, pool in sorted(ws.pools.items()):
        stranded.append((gpu_type, pool.stranded))
        single = max((f for f in range(len(pool.buckets)) if pool.buckets[f]), default=0)
        largest.append((gpu_type, max(single, pool.whole_total * pool.big)))
    return Fragmentation(stranded_gpus=tuple(stranded), largest_placeable=tuple(largest))
