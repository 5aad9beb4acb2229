"""EASY-backfill reservations: where and when a blocked job will fit, from expected ends.

A node's GPUs come free at the expected ends of the jobs on it (running jobs' expected
end, this cycle's binds at now + max runtime). For a single-node job, each node's
earliest time with ``count`` free GPUs; the reservation takes the earliest (ties: the
node with fewer spare GPUs then, then node id). For a gang, each full-size node's time of
being wholly free; per domain at each allowed level the ``need``-th earliest is when that
domain could hold the gang; the reservation takes the earliest such time (ties: the
lower level, then the domain key) and its ``need`` earliest nodes.

Nodes already held (another reservation or a nomination) are not considered.

A standing holder keeps its nodes (``keep``) while they can still hold it and no other nodes are expected
to hold it much sooner (:func:`moves`): its shadow time is planned again on them, not on whichever nodes
are now expected to free first. Expected ends are learned run times, and the node expected to free first
is the one most likely to run late; a reservation that moved to it every cycle would give up the nodes it
had drained and could wait for ever. On kept nodes nothing new starts that is expected to end after the
shadow time; when their jobs outlive their learned ends by hours, the holder moves.
"""

from __future__ import annotations

import math

from scheduler.core.placement import gang_reach
from scheduler.core.state import DomainKey, Hold, NodeState, Pool, Workspace
from scheduler.core.types import PendingJob

INF = math.inf


def free_at(node: NodeState, count: int, now: float) -> tuple[float, int]:
    """Earliest time the node has ``count`` free GPUs, and how many it has free then."""
    free = len(node.free)
    if free >= count:
        return now, free
    for end, gpus in sorted((max(end, now), gpus) for end, gpus in node.ends):
        free += gpus
        if free >= count:
            return end, free
    return INF, free


def plan_reservation(
    ws: Workspace, pool: Pool, job: PendingJob, excluded: set[int], keep: tuple[str, ...] = ()
) -> tuple[list[NodeState], float, list[Hold]] | None:
    """The nodes to hold for ``job``, the shadow time, and the holds; None when nothing ever frees.

    ``keep``: the nodes its standing reservation holds; planned on again while they still can hold it.
    """
    candidates = [n for n in pool.nodes if n.ord not in pool.holds and n.ord not in excluded]
    kept = _on_kept(ws, pool, job, candidates, keep)
    fresh = _earliest(ws, pool, job, candidates)
    if kept is not None and (fresh is None or not moves(kept[1], fresh[1], ws.now)):
        return kept
    return fresh


def moves(kept_at: float, fresh_at: float, now: float) -> bool:
    """Does a standing holder leave its nodes (shadow time ``kept_at``) for nodes now expected to hold it at
    ``fresh_at``? Only when those would start it at least ``MOVE_SLACK_S`` sooner and in under half the time:
    a kept reservation whose nodes' jobs keep outliving their learned ends would otherwise hold the GPU type's
    only reservation for as long as their max runtimes, while every other blocked job of the type waits
    unprotected; a small gain is not worth the drained GPUs it gives up."""
    return kept_at - now > 2.0 * (fresh_at - now) + MOVE_SLACK_S


#: How much sooner other nodes must be expected to hold a standing holder before it moves (plus half the wait).
MOVE_SLACK_S = 3600.0


def _earliest(ws: Workspace, pool: Pool, job: PendingJob, candidates: list[NodeState]) -> tuple[list[NodeState], float, list[Hold]] | None:
    """The reservation on the candidates expected to hold ``job`` first (module docstring)."""
    now = ws.now
    if job.gpu_count <= pool.max_size:
        best: tuple[float, int, int] | None = None
        for node in candidates:
            if node.size < job.gpu_count:
                continue
            at, free = free_at(node, job.gpu_count, now)
            if at < INF and (best is None or (at, free - job.gpu_count, node.ord) < best):
                best = (at, free - job.gpu_count, node.ord)
        if best is None:
            return None
        at, spare, ordinal = best
        return [ws.nodes[ordinal]], at, [Hold(job_id=job.id, start_at=at, spare=spare)]
    need = math.ceil(job.gpu_count / pool.big) if pool.big else 0
    if need <= 0:
        return None
    levels = len(ws.upper)
    reach = gang_reach(ws.upper, job)
    if reach is None:
        return None
    top, spanning = reach
    groups: dict[tuple[int, DomainKey], list[tuple[float, int]]] = {}
    for node in candidates:
        if node.size != pool.big:
            continue
        at, _ = free_at(node, node.size, now)
        if at == INF:
            continue
        for level in range(0, top + 1):
            groups.setdefault((level, node.domains[level]), []).append((at, node.ord))
        if spanning:
            groups.setdefault((levels, ()), []).append((at, node.ord))
    choice: tuple[float, int, DomainKey] | None = None
    for (level, key), times in groups.items():
        if len(times) >= need:
            times.sort()
            option = (times[need - 1][0], level, key)
            if choice is None or option < choice:
                choice = option
    if choice is None:
        return None
    at, level, key = choice
    chosen = [ws.nodes[ordinal] for _, ordinal in groups[(level, key)][:need]]
    return chosen, at, [Hold(job_id=job.id, start_at=at, spare=0) for _ in chosen]


def _on_kept(
    ws: Workspace, pool: Pool, job: PendingJob, candidates: list[NodeState], keep: tuple[str, ...]
) -> tuple[list[NodeState], float, list[Hold]] | None:
    """The reservation planned again on the nodes it holds, if they are all still candidates and still hold the job:
    a single-node job's node has at least its GPUs; a gang's nodes are as many full-size nodes as it needs."""
    if not keep:
        return None
    ordinals = {n.ord for n in candidates}
    nodes = [ws.by_id[node_id] for node_id in keep if node_id in ws.by_id]
    if len(nodes) != len(keep) or any(n.ord not in ordinals for n in nodes):
        return None
    if job.gpu_count <= pool.max_size:
        if len(nodes) != 1 or nodes[0].size < job.gpu_count:
            return None
        at, free = free_at(nodes[0], job.gpu_count, ws.now)
        return None if at == INF else (nodes, at, [Hold(job_id=job.id, start_at=at, spare=free - job.gpu_count)])
    need = math.ceil(job.gpu_count / pool.big) if pool.big else 0
    if need <= 0 or len(nodes) != need or any(n.size != pool.big for n in nodes):
        return None
    at = max(free_at(n, n.size, ws.now)[0] for n in nodes)
    return None if at == INF else (nodes, at, [Hold(job_id=job.id, start_at=at, spare=0) for _ in nodes])
