"""Builders for small fleets, workloads and snapshots."""

from __future__ import annotations

import math
from collections.abc import Sequence

from scheduler.core.types import Member, NodeView, PendingJob, RunningJob, Snapshot, TenantView
from simulator.fleet import Fleet, SimNode, TenantSpec
from simulator.workload import SimJob, Workload


def fleet_of(nodes: int, gpus: int = 8, gpu_type: str = "H100", per_leaf: int = 4) -> Fleet:
    return Fleet(
        nodes=tuple(
            SimNode(id=f"n{i}", gpu_type=gpu_type, gpus=gpus, labels=(("leaf", f"l{i // per_leaf}"), ("spine", "s0"))) for i in range(nodes)
        )
    )


def job(
    id: str,
    submit: float,
    gpus: int,
    duration: float,
    *,
    tenant: str = "a",
    limit: float | None = None,
    priority: int = 100,
    ckpt: float = math.inf,
    gpu_type: str = "H100",
    node_size: int = 8,
) -> SimJob:
    return SimJob(
        id=id,
        tenant=tenant,
        submit_s=submit,
        gpu_type=gpu_type,
        gpu_count=gpus,
        duration_s=duration,
        max_runtime_s=limit if limit is not None else duration,
        priority=priority,
        checkpoint_interval_s=ckpt,
        topology_level="node" if gpus <= node_size else "leaf",
    )


def workload(*jobs: SimJob, tenants: tuple[TenantSpec, ...] = ()) -> Workload:
    ordered = tuple(sorted(jobs, key=lambda j: (j.submit_s, j.id)))
    names = sorted({j.tenant for j in jobs})
    return Workload(name="test", jobs=ordered, tenants=tenants or tuple(TenantSpec(name=n) for n in names))


def node(id: str, free: int | set[int], gpus: int = 8, leaf: str = "l0", gpu_type: str = "H100") -> NodeView:
    free_set = set(range(free)) if isinstance(free, int) else free
    return NodeView(id=id, gpu_type=gpu_type, gpu_count=gpus, labels=(("leaf", leaf), ("spine", "s0")), free=frozenset(free_set))


def pending(
    id: str, gpus: int, *, at: float = 0.0, tenant: str = "a", runtime: float = 3600.0, priority: int = 100, gpu_type: str = "H100"
) -> PendingJob:
    return PendingJob(
        id=id,
        tenant=tenant,
        attempt=1,
        gpu_type=gpu_type,
        gpu_count=gpus,
        priority=priority,
        queued_at=at,
        topology_level="node" if gpus <= 8 else "leaf",
        max_runtime_s=runtime,
        submitted_at=at,
    )


def running(id: str, node_id: str, gpus: tuple[int, ...], *, end: float, start: float = 0.0, tenant: str = "a") -> RunningJob:
    return RunningJob(
        id=id,
        tenant=tenant,
        attempt=1,
        gpu_type="H100",
        gpu_count=len(gpus),
        priority=100,
        members=(Member(node_id=node_id, gpu_indices=gpus, rank=0),),
        started_at=start,
        expected_end=end,
    )


def snapshot(
    nodes: Sequence[NodeView], queue: Sequence[PendingJob], run: Sequence[RunningJob] = (), tenants: Sequence[str] = ("a",)
) -> Snapshot:
    return Snapshot(nodes=tuple(nodes), pending=tuple(queue), running=tuple(run), tenants=tuple(TenantView(name=t) for t in tenants))
