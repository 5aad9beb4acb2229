"""Elastic jobs (SPEC R9.2): a GPU range, started at its minimum, grown onto idle GPUs, shrunk before anyone is preempted.

A job asks for ``gpu_count`` (its minimum: what it starts with and what counts against its
tenant's quota) up to ``gpu_max``. Its step is one GPU while it stays on one node, one whole
node once it spans several (every member then holds a whole node).

- **Start**: like any job, once its minimum fits (admission and placement see ``gpu_count``).
- **Shrink** (:func:`plan_shrink`): a job that is entitled to GPUs but does not fit takes back
  GPUs above elastic jobs' minimums before any whole job is preempted for it (KAI-Scheduler
  and Volcano take elastic members first). Donors are walked cheapest first (the least work
  since their last checkpoint, as victims are); each gives back its last-ranked whole members
  (or its highest GPU indices on one node) until the job can be placed; only the GPUs the
  placement uses are taken back. The job holds a nomination on those GPUs until every donor's
  resize has committed, and binds then. Never below a donor's minimum.
- **Grow** (:func:`grow`): after admission, while no job of a GPU type waits for capacity,
  an elastic job of that type takes GPUs that have been free for ``elastic_grow_idle_s``: on
  its own node, or whole nodes inside its topology domain (the domain of its first member at
  its required level; nearest domains first when the level is only preferred). Not before it has
  run ``elastic_resize_interval_s`` since it started or was last resized: growth never thrashes;
  shrinking for a waiting job is never delayed.

A resize stops every member and restarts them all at the new size (TorchElastic's model): its
cost is the work since the job's last checkpoint, which is why donors are taken cheapest first.
Above-minimum GPUs never count against the quota: they are borrowed whatever the quota, and the
first taken back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.core.order import victim_cost_key
from scheduler.core.placement import fits_ignoring_holds, level_index, place
from scheduler.core.reasons import Pending
from scheduler.core.state import NodeState, Pool, Workspace
from scheduler.core.types import Member, PendingJob, Resize, RunningJob

if TYPE_CHECKING:
    from scheduler.core.cycle import Cycle

#: A shrink's reason: a waiting job needs the GPUs.
SHRINK_REASON = "waiting_job"
#: A growth's reason: GPUs have been idle with no job of their type waiting.
GROW_REASON = "idle"

#: Reasons that say a job waits for capacity of its type (growth of that type waits too).
_WANTS_CAPACITY = frozenset(
    {
        Pending.BACKFILL_OFF,
        Pending.PREEMPTING,
        Pending.SHRINKING,
        Pending.NO_FREE_NODE,
        Pending.NO_FREE_DOMAIN,
        Pending.RESERVED,
    }
)


def multi_node(ws: Workspace, job: RunningJob) -> bool:
    """Whether the job's step is a whole node: it spans several nodes, or its maximum is more than its node holds."""
    if len(job.members) != 1:
        return True
    node = ws.by_id.get(job.members[0].node_id)
    return node is None or (job.gpu_max or 0) > node.size


def above_minimum(ws: Workspace, job: RunningJob) -> list[tuple[Member, tuple[int, ...]]]:
    """What ``job`` gives back first, in that order: (member, its GPUs given back). Whole last-ranked members
    when its step is a node, else the highest GPU indices of its one member; never below its minimum."""
    extra = job.gpu_count - (job.gpu_min if job.gpu_min is not None else job.gpu_count)
    if extra <= 0:
        return []
    if not multi_node(ws, job):
        member = job.members[0]
        return [(member, tuple(sorted(member.gpu_indices)[-extra:]))]
    out = []
    for member in sorted(job.members, key=lambda m: -m.rank):
        if len(member.gpu_indices) > extra:
            break
        out.append((member, member.gpu_indices))
        extra -= len(member.gpu_indices)
    return out


def elastic_by_type(cycle: Cycle) -> dict[str, list[RunningJob]]:
    """Running elastic jobs per GPU type, by id (built once per cycle from the workspace's index of them)."""
    if cycle.elastic is None:
        cycle.elastic = {}
        for job in sorted(cycle.ws.elastic_running.values(), key=lambda r: r.id):
            cycle.elastic.setdefault(job.gpu_type, []).append(job)
    return cycle.elastic


def elastic_jobs(cycle: Cycle, gpu_type: str) -> list[RunningJob]:
    """Running elastic jobs of the type, by id."""
    return elastic_by_type(cycle).get(gpu_type, [])


def plan_shrink(cycle: Cycle, pool: Pool, job: PendingJob, end: float) -> tuple[tuple[Member, ...], tuple[Resize, ...]] | None:
    """Where ``job`` goes if elastic jobs give back GPUs above their minimums, and the shrinks that free them; or None."""
    donors = [
        d
        for d in elastic_jobs(cycle, job.gpu_type)
        if d.gpu_count > (d.gpu_min or d.gpu_count) and d.id not in cycle.stopping and d.id not in cycle.resizing
    ]
    if not donors:
        return None
    donors.sort(key=lambda d: victim_cost_key(d, cycle.now))
    ws = cycle.ws
    start = ws.mark()
    chosen: list[RunningJob] = []
    members = None
    for donor in donors:
        released = False
        for member, gpus in above_minimum(ws, donor):
            node = ws.by_id.get(member.node_id)
            if node is None:
                continue
            held = tuple(g for g in gpus if g not in node.free and g < node.size)
            if held:
                ws.give(node, held)
                released = True
        if not released:
            continue
        chosen.append(donor)
        if fits_ignoring_holds(ws, pool, job):
            members = place(ws, pool, job, end)
            if members is not None:
                break
    ws.rollback(start)
    if members is None:
        return None
    used = {(m.node_id, g) for m in members for g in m.gpu_indices}
    shrinks = tuple(s for s in (_shrink(ws, donor, used, job.id) for donor in chosen) if s is not None)
    return members, shrinks


def _shrink(ws: Workspace, donor: RunningJob, used: set[tuple[str, int]], for_job: str) -> Resize | None:
    """The donor's resize that gives back exactly its above-minimum GPUs in ``used`` (whole members when its step is a node)."""
    dropped_members: set[tuple[str, int]] = set()
    dropped_gpus: set[int] = set()
    whole = multi_node(ws, donor)
    for member, gpus in above_minimum(ws, donor):
        taken = [g for g in gpus if (member.node_id, g) in used]
        if not taken:
            continue
        if whole:
            dropped_members.add((member.node_id, member.rank))
        else:
            dropped_gpus.update(taken)
    if not dropped_members and not dropped_gpus:
        return None
    if whole:
        kept = [m for m in sorted(donor.members, key=lambda m: m.rank) if (m.node_id, m.rank) not in dropped_members]
        members = tuple(Member(node_id=m.node_id, gpu_indices=m.gpu_indices, rank=i) for i, m in enumerate(kept))
    else:
        only = donor.members[0]
        members = (Member(node_id=only.node_id, gpu_indices=tuple(g for g in only.gpu_indices if g not in dropped_gpus), rank=0),)
    to_gpus = sum(len(m.gpu_indices) for m in members)
    return Resize(
        job_id=donor.id,
        attempt=donor.attempt,
        members=members,
        from_gpus=donor.gpu_count,
        to_gpus=to_gpus,
        reason=SHRINK_REASON,
        for_job=for_job,
    )


def grow(cycle: Cycle) -> None:
    """Phase 5b: elastic jobs take GPUs idle long enough, where no job of their type waits for capacity."""
    config = cycle.config
    ws = cycle.ws
    by_type = elastic_by_type(cycle)
    if not by_type:
        return
    waiting = {cycle.pending[job_id].gpu_type for job_id, why in cycle.reasons.items() if why.code in _WANTS_CAPACITY}
    types = sorted(set(by_type) - waiting)
    for gpu_type in types:
        pool = ws.pools.get(gpu_type)
        if pool is None:
            continue
        growers = [
            job
            for job in elastic_jobs(cycle, gpu_type)
            if job.gpu_count < (job.gpu_max or 0)
            and job.id not in cycle.stopping
            and job.id not in cycle.resizing
            and cycle.now - (job.started_at if job.resized_at is None else job.resized_at) >= config.elastic_resize_interval_s
        ]
        # The furthest below its maximum first (a fair split of the idle GPUs), then by id.
        for job in sorted(growers, key=lambda j: (j.gpu_count / (j.gpu_max or 1), j.id)):
            members = _grown(cycle, pool, job)
            if members is None:
                continue
            for member in members:
                node = ws.by_id[member.node_id]
                before = next((m.gpu_indices for m in job.members if m.node_id == member.node_id), ())
                new = tuple(g for g in member.gpu_indices if g not in before)
                if new:
                    ws.take(node, new)
            ws.commit()
            cycle.resizing.add(job.id)
            to_gpus = sum(len(m.gpu_indices) for m in members)
            cycle.resizes.append(
                Resize(job_id=job.id, attempt=job.attempt, members=members, from_gpus=job.gpu_count, to_gpus=to_gpus, reason=GROW_REASON)
            )


def _idle(cycle: Cycle, pool: Pool, node: NodeState) -> bool:
    """Whether the node's free GPUs have been free long enough to grow onto, and no reservation claims it."""
    if node.ord in pool.holds or node.ord in cycle.nominated:
        return False
    since = node.free_since
    return since is not None and cycle.now - since >= cycle.config.elastic_grow_idle_s


def _grown(cycle: Cycle, pool: Pool, job: RunningJob) -> tuple[Member, ...] | None:
    """The job's members after growing onto idle GPUs (as many as its maximum allows), or None when none are idle."""
    ws = cycle.ws
    room = (job.gpu_max or 0) - job.gpu_count
    if not multi_node(ws, job):
        only = job.members[0]
        node = ws.by_id.get(only.node_id)
        if node is None or not node.free or not _idle(cycle, pool, node):
            return None
        extra = sorted(node.free)[:room]
        return (Member(node_id=only.node_id, gpu_indices=tuple(sorted(only.gpu_indices + tuple(extra))), rank=0),)
    step = pool.big
    want = room // step if step > 0 else 0
    first = ws.by_id.get(job.members[0].node_id)
    if want <= 0 or first is None:
        return None
    mine = {m.node_id for m in job.members}
    required = job.topology_required and job.topology_level not in ("any", "node")
    cap = level_index(ws.upper, job.topology_level) if required else None
    if required and cap is None:
        return None
    candidates = []
    for node in pool.nodes:
        if node.size != step or len(node.free) != step or node.id in mine or not _idle(cycle, pool, node):
            continue
        if cap is not None and cap >= 0 and node.domains[cap] != first.domains[cap]:
            continue
        # Nearest first: the lowest level whose domain it shares with the job's first member.
        shared = next((i for i in range(len(node.domains)) if node.domains[i] == first.domains[i]), len(node.domains))
        candidates.append((shared, node.ord, node))
    if not candidates:
        return None
    candidates.sort(key=lambda c: (c[0], c[1]))
    added = [node for _, _, node in candidates[:want]]
    ranked = sorted(job.members, key=lambda m: m.rank)
    base = [Member(node_id=m.node_id, gpu_indices=m.gpu_indices, rank=i) for i, m in enumerate(ranked)]
    return tuple(base) + tuple(
        Member(node_id=node.id, gpu_indices=tuple(sorted(node.free)), rank=len(base) + i) for i, node in enumerate(added)
    )
