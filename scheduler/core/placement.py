"""Where a job's GPUs go on the topology (SPEC R3), read-only on the workspace.

Single-node jobs (count <= the type's largest node): best fit, the fullest node that
still holds the job (walk the free-count buckets up from ``count``; ties by node id), so
partly used nodes fill first and whole nodes stay free for gangs.

Multi-node jobs take ``ceil(count / node size)`` wholly free nodes of the type's full
size, Kueue TAS style: with the count of wholly free nodes per domain kept per level,
go bottom-up and take the lowest level where one domain holds the gang (among several,
the one with the fewest free nodes that suffices: best fit again); then descend, at each
level taking child domains with the most free nodes first and, for the remainder, the
smallest child that holds it, so the gang spans as few domains as possible. A required
level caps the climb; "any" or a preferred level may, when no domain holds the gang,
span the whole pool the same way.

A node held by another job's reservation is usable only as :func:`hold_allows` says.
"""

from __future__ import annotations

import math

from scheduler.core.reasons import Pending, PendingReason, pending_reason
from scheduler.core.state import DomainKey, Hold, NodeState, Pool, Workspace
from scheduler.core.types import Member, PendingJob

#: What a placement attempt is told about reservations: the job's latest end, or None to ignore them.
Respect = float | None


def hold_allows(hold: Hold | None, job_id: str, gpus: int, job_end: Respect) -> bool:
    """EASY rule: a held node serves a job that ends before the hold starts, or fits in its spare GPUs."""
    if hold is None or job_end is None or hold.job_id == job_id:
        return True
    if hold.hard:
        return False
    return job_end <= hold.start_at or gpus <= hold.spare


def level_index(upper: tuple[str, ...], level: str) -> int | None:
    """Index of ``level`` among the levels above "node"; -1 for "node"; None when unknown."""
    if level == "node":
        return -1
    return upper.index(level) if level in upper else None


def never_fits(ws: Workspace, pool: Pool | None, job: PendingJob) -> PendingReason | None:
    """Why no state of the fleet could ever hold this job (static node shapes), or None."""
    if pool is None:
        return pending_reason(Pending.NO_GPU_TYPE, gpu_type=job.gpu_type)
    if job.gpu_count <= 0:
        return pending_reason(Pending.NO_GPUS)
    if job.gpu_count <= pool.max_size:
        return None
    level = job.topology_level
    if level != "any" and level_index(ws.upper, level) is None:
        return pending_reason(Pending.UNKNOWN_LEVEL, level=level, levels=ws.upper)
    if job.topology_required and level == "node":
        return pending_reason(Pending.NODE_TOO_SMALL, count=job.gpu_count, gpu_type=job.gpu_type, largest=pool.max_size)
    if job.topology_required and level != "any":
        best = max(pool.static[level_index(ws.upper, level) or 0].values(), default=0)
        if best < job.gpu_count:
            return pending_reason(Pending.DOMAIN_TOO_SMALL, level=level, largest=best, gpu_type=job.gpu_type, count=job.gpu_count)
    if pool.static_total < job.gpu_count:
        return pending_reason(Pending.FLEET_TOO_SMALL, largest=pool.static_total, gpu_type=job.gpu_type, count=job.gpu_count)
    return None


def fits_ignoring_holds(ws: Workspace, pool: Pool, job: PendingJob) -> bool:
    """Would :func:`place` succeed if no reservation existed? Counts only, no members built."""
    if job.gpu_count <= pool.max_size:
        buckets = pool.buckets
        return any(buckets[f] for f in range(job.gpu_count, len(buckets)))
    if pool.big <= 0:
        return False
    need = math.ceil(job.gpu_count / pool.big)
    if pool.whole_total < need:
        return False
    if job.topology_level == "any" or not job.topology_required:
        return True
    cap = level_index(ws.upper, job.topology_level)
    if cap is None or cap < 0:
        return False
    return any(count >= need for level in range(cap + 1) for count in pool.whole[level].values())


def place(ws: Workspace, pool: Pool, job: PendingJob, respect: Respect) -> tuple[Member, ...] | None:
    """The job's members if it fits now, else None. Changes nothing."""
    if job.gpu_count <= pool.max_size:
        node = best_fit_node(ws, pool, job.id, job.gpu_count, respect)
        if node is None:
            return None
        return (Member(node_id=node.id, gpu_indices=tuple(sorted(node.free)[: job.gpu_count]), rank=0),)
    nodes = gang_nodes(ws, pool, job, respect)
    if nodes is None:
        return None
    members = []
    left = job.gpu_count
    for rank, node in enumerate(nodes):
        count = min(left, node.size)
        members.append(Member(node_id=node.id, gpu_indices=tuple(sorted(node.free)[:count]), rank=rank))
        left -= count
    return tuple(members)


def best_fit_node(ws: Workspace, pool: Pool, job_id: str, count: int, respect: Respect) -> NodeState | None:
    """The fullest schedulable node with ``count`` usable free GPUs (ties: node id)."""
    holds = pool.holds
    for free in range(count, len(pool.buckets)):
        for ordinal in pool.buckets[free]:
            if not holds or hold_allows(holds.get(ordinal), job_id, count, respect):
                return ws.nodes[ordinal]
    return None


def gang_reach(upper: tuple[str, ...], job: PendingJob) -> tuple[int, bool] | None:
    """How far up a gang may go: the highest level index whose domains may hold it, and whether it
    may span the whole pool when none does ("any", or a preferred level); None when it never can."""
    if job.topology_level != "any" and job.topology_required:
        cap = level_index(upper, job.topology_level)
        if cap is None or cap < 0:
            return None
        return cap, False
    return len(upper) - 1, True


def gang_nodes(ws: Workspace, pool: Pool, job: PendingJob, respect: Respect) -> list[NodeState] | None:
    """Wholly free full-size nodes for a gang, in the fewest domains (see the module docstring)."""
    if pool.big <= 0:
        return None
    need = math.ceil(job.gpu_count / pool.big)
    levels = len(ws.upper)
    reach = gang_reach(ws.upper, job)
    if reach is None:
        return None
    top, spanning = reach
    blocked = _blocked_whole(ws, pool, job, respect)
    if pool.whole_total - blocked.get(-1, {}).get((), 0) < need:
        return None

    def avail(level: int, key: DomainKey) -> int:
        if level == levels:
            return pool.whole_total - blocked.get(-1, {}).get((), 0)
        return pool.whole[level].get(key, 0) - blocked.get(level, {}).get(key, 0)

    def usable(node: NodeState) -> bool:
        return len(node.free) == node.size == pool.big and hold_allows(pool.holds.get(node.ord), job.id, node.size, respect)

    def descend(level: int, key: DomainKey, want: int) -> list[NodeState]:
        if level == 0 or levels == 0:
            source = pool.members.get(key, []) if levels else [n for n in pool.nodes if n.size == pool.big]
            return [n for n in source if usable(n)][:want]
        kids = pool.children[level].get(key, []) if level < levels else sorted(pool.whole[levels - 1])
        ranked = sorted(((avail(level - 1, k), k) for k in kids), key=lambda t: (-t[0], t[1]))
        ranked = [(a, k) for a, k in ranked if a > 0]
        chosen: list[NodeState] = []
        left = want
        for index, (count, kid) in enumerate(ranked):
            if left <= 0:
                break
            fits = [(a, k) for a, k in ranked[index:] if a >= left]
            if fits:
                _, best = min(fits)
                chosen += descend(level - 1, best, left)
                left = 0
                break
            chosen += descend(level - 1, kid, count)
            left -= count
        return chosen

    for level in range(0, top + 1):
        fitting = [(count - blocked.get(level, {}).get(key, 0), key) for key, count in pool.whole[level].items()]
        fitting = [(a, k) for a, k in fitting if a >= need]
        if fitting:
            _, key = min(fitting)
            return descend(level, key, need)
    if spanning:
        return descend(levels, (), need)
    return None


def _blocked_whole(ws: Workspace, pool: Pool, job: PendingJob, respect: Respect) -> dict[int, dict[DomainKey, int]]:
    """Wholly free nodes the job may not use because of holds, per level and domain (level -1: the pool)."""
    blocked: dict[int, dict[DomainKey, int]] = {}
    if respect is None or not pool.holds:
        return blocked
    for ordinal in sorted(pool.holds):
        node, hold = ws.nodes[ordinal], pool.holds[ordinal]
        if len(node.free) != node.size or node.size != pool.big or hold_allows(hold, job.id, node.size, respect):
            continue
        for level, key in enumerate(node.domains):
            per = blocked.setdefault(level, {})
            per[key] = per.get(key, 0) + 1
        total = blocked.setdefault(-1, {})
        total[()] = total.get((), 0) + 1
    return blocked
