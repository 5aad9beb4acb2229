"""One scheduling cycle: order the queue, place each job whole or not at all.

This is the first-fit policy: jobs in (priority, age, id) order, single-node jobs on
the first node with room, multi-node jobs on whole free nodes inside one domain of
their topology level. It keeps the ``run_cycle(snapshot, now)`` contract that richer
policies fill in.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.core.types import Bind, Decisions, Member, NodeView, PendingJob, Snapshot


def queue_order_key(job: PendingJob) -> tuple[int, float, str]:
    """Tie-breaks in order: 1. higher priority, 2. older, 3. job id."""
    return (-job.priority, job.queued_at, job.id)


def run_cycle(snapshot: Snapshot, now: float) -> Decisions:
    """Decide which queued jobs start now and on which GPUs.

    Args:
        snapshot: nodes with their free GPUs, and the queued jobs.
        now: the cycle's clock (injected; the core never reads a clock).

    Returns:
        Bindings in order, and a pending reason for every job left waiting.
    """
    del now  # first-fit does not look at time; richer policies do
    # 1. Working copy of free GPUs, which tentative bindings consume.
    free: dict[str, set[int]] = {n.id: set(n.free) for n in snapshot.nodes if n.schedulable}
    nodes = sorted((n for n in snapshot.nodes if n.schedulable), key=lambda n: n.id)
    binds: list[Bind] = []
    reasons: dict[str, str] = {}
    # 2. Walk the queue in order; each job is placed whole or not at all.
    for job in sorted(snapshot.pending, key=queue_order_key):
        candidates = [n for n in nodes if n.gpu_type == job.gpu_type]
        members, reason = _place(job, candidates, free)
        if members is None:
            reasons[job.id] = reason
            continue
        for member in members:
            free[member.node_id].difference_update(member.gpu_indices)
        binds.append(Bind(job_id=job.id, attempt=job.attempt, members=members))
    return Decisions(binds=tuple(binds), pending_reasons=reasons)


def _place(job: PendingJob, nodes: Sequence[NodeView], free: dict[str, set[int]]) -> tuple[tuple[Member, ...] | None, str]:
    if not nodes:
        return None, f"no schedulable {job.gpu_type} node"
    biggest = max(n.gpu_count for n in nodes)
    if job.gpu_count <= biggest:
        for node in nodes:
            if len(free[node.id]) >= job.gpu_count:
                gpus = tuple(sorted(free[node.id])[: job.gpu_count])
                return (Member(node_id=node.id, gpu_indices=gpus, rank=0),), ""
        return None, f"no {job.gpu_type} node has {job.gpu_count} free GPUs"
    return _place_multi_node(job, nodes, free)


def _place_multi_node(job: PendingJob, nodes: Sequence[NodeView], free: dict[str, set[int]]) -> tuple[tuple[Member, ...] | None, str]:
    whole = [n for n in nodes if len(free[n.id]) == n.gpu_count and job.gpu_count % n.gpu_count == 0]
    level = job.topology_level
    groups: dict[str, list[NodeView]] = {}
    for node in whole:
        key = "*" if level == "any" else node.domain(level)
        if key is not None:
            groups.setdefault(key, []).append(node)
    for key in sorted(groups):
        chosen: list[NodeView] = []
        remaining = job.gpu_count
        for node in groups[key]:
            if remaining <= 0:
                break
            chosen.append(node)
            remaining -= node.gpu_count
        if remaining == 0:
            members = tuple(Member(node_id=n.id, gpu_indices=tuple(sorted(free[n.id])), rank=rank) for rank, n in enumerate(chosen))
            return members, ""
    where = "" if level == "any" else f" in one {level}"
    return None, f"not enough whole free {job.gpu_type} nodes{where} for {job.gpu_count} GPUs"
