"""GPU health on the API side (SPEC R6.1, R9.1): the heartbeat's health reports through the policy, and the
admin endpoints: cordon, drain, uncordon, return a GPU to service, inject a simulated fault.

The policy itself is pure (``fairgang.health.assess``); here its findings become store
changes, health events and job moves. A job is moved through its workflow's ``preempt``
update (a graceful stop: it checkpoints, requeues and resumes elsewhere, since the GPU is
out of service); if the workflow cannot take the update, the node-lost signal requeues it at once.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException, Query

from api.deps import AppState, Caller, GpuIndex, State, log, require_admin
from api.schemas import FaultInjection
from fairgang.health import FAULT_KINDS, Finding, Thresholds, assess, cordons, effective_report, moves_at_checkpoint, parse_xids, takes_out
from fairgang.settings import Settings
from store import auth, nodes
from store import health as stored_health
from store import jobs as stored_jobs
from workflows import starter

router = APIRouter(prefix="/v1", tags=["health"])


def thresholds(settings: Settings) -> Thresholds:
    return Thresholds(
        fatal_xids=parse_xids(settings.health_fatal_xids),
        throttle_beats=settings.health_throttle_beats,
        correctable_ecc_rise=settings.health_correctable_ecc_rise,
        retired_pages_fatal=settings.health_retired_pages_fatal,
    )


async def move_job(state: AppState, *, job_id: str, attempt: int, node_id: str, reason: str) -> None:
    """Ask the job to checkpoint and move (once per attempt); if its workflow does not answer, requeue it as if the node were lost."""
    if not await stored_health.add_health_event(
        state.db, node_id=node_id, kind="job_moved", key=f"move-{job_id}-{attempt}", message=f"{job_id}: {reason}"
    ):
        return
    client = await state.temporal()
    if client is None:
        log.warning("cannot move %s off %s: Temporal unreachable", job_id, node_id)
        return
    try:
        await starter.preempt(client, job_id=job_id, reason=reason)
    except Exception as err:  # noqa: BLE001 - refused (not running yet, already stopping) or unanswered
        log.warning("preempting %s for health failed (%s): requeueing it as on a lost node", job_id, err)
        try:
            await starter.signal_node_lost(client, job_id=job_id, node_id=node_id)
        except Exception as err2:  # noqa: BLE001 - the member's heartbeat timeout catches it anyway
            log.warning("node-lost signal to %s failed: %s", job_id, err2)


class _Assessment:
    """The health policy over one heartbeat's reports, run by the store inside the heartbeat's transaction."""

    def __init__(self, reports: list[dict[str, Any]], limits: Thresholds) -> None:
        self.reports, self.limits = reports, limits
        #: GPU index -> the injected faults the agent should simulate.
        self.faults: dict[int, list[dict[str, Any]]] = {}
        #: GPU index -> the policy's findings on its report.
        self.findings: dict[int, list[Finding]] = {}

    def __call__(self, gpus: dict[int, nodes.GpuHealth]) -> dict[int, tuple[dict[str, Any], bool]]:
        self.faults = {i: list(g.health["injected"]) for i, g in gpus.items() if g.health.get("injected")}
        writes: dict[int, tuple[dict[str, Any], bool]] = {}
        for entry in self.reports:
            gpu = gpus.get(int(entry.get("index", -1)))
            report = entry.get("health")
            if gpu is None or not isinstance(report, dict):
                continue
            report = effective_report(report, fault_injected=gpu.index in self.faults)
            findings, book = assess(report, gpu.health, self.limits)
            if findings:
                self.findings[gpu.index] = findings
            writes[gpu.index] = ({**report, **book}, takes_out(findings))
        return writes


async def heartbeat(
    state: AppState, *, node_id: str, boot_id: str, reports: list[dict[str, Any]], now: float | None = None
) -> tuple[bool, list[str], dict[int, list[dict[str, Any]]]]:
    """Record a heartbeat with its GPUs' health reports and apply the policy's findings.

    Returns (accepted, the live allocations on the node, the injected faults the agent should simulate).
    The heartbeat and every GPU's health are one transaction over the node's own rows; only findings
    (a GPU taken out, a degraded node) cost more: health events, a cordon, job moves.
    """
    now = time.time() if now is None else now
    assessment = _Assessment(reports, thresholds(state.settings))
    beat = await nodes.record_heartbeat(state.db, node_id=node_id, boot_id=boot_id, policy=assessment, now=now)
    if not beat.accepted:
        return False, [], {}
    node_state = beat.state
    for index in beat.taken_out:
        fatal = [f for f in assessment.findings.get(index, []) if f.severity == "fatal"]
        why = "; ".join(f.message for f in fatal)
        log.warning("GPU %s/%d out of service: %s", node_id, index, why)
        for f in fatal:
            await stored_health.add_health_event(
                state.db, node_id=node_id, gpu_index=index, kind=f.kind, severity="fatal", message=f.message, key=f"{f.kind}-{index}-{now}"
            )
        for job_id, attempt in sorted({(j, a) for (i, j, a) in beat.gpu_jobs if i == index}):
            await move_job(state, job_id=job_id, attempt=attempt, node_id=node_id, reason=f"health: GPU {node_id}/{index} {why}")
    for index, findings in sorted(assessment.findings.items()):
        if not cordons(findings, node_state):
            continue
        await nodes.set_node_state(state.db, node_id=node_id, state="CORDONED")
        node_state = "CORDONED"
        f = next(f for f in findings if f.severity == "degraded")  # the finding that cordoned it
        await stored_health.add_health_event(
            state.db,
            node_id=node_id,
            gpu_index=index,
            kind=f.kind,
            severity="degraded",
            message=f"node cordoned: {f.message}",
            key=f"{f.kind}-{now}",
        )
    if node_state == "CORDONED":
        await _move_long_jobs_at_checkpoint(state, node_id=node_id, node_gpus=beat.gpu_count)
    return True, beat.live, assessment.faults


async def _move_long_jobs_at_checkpoint(state: AppState, *, node_id: str, node_gpus: int) -> None:
    """On a node cordoned for degradation: a multi-node job moves once it has checkpointed since the cordon (R9.1)."""
    since = await stored_health.degraded_since(state.db, node_id)
    if since is None:
        return
    for job_id, attempt in await nodes.node_jobs(state.db, node_id):
        job = await stored_jobs.get_job(state.db, job_id)
        if job is None or job.attempt != attempt:
            continue
        if not moves_at_checkpoint(
            job_gpus=job.gpu_count, node_gpus=node_gpus, checkpoint_at=job.latest_checkpoint_at, degraded_since=since
        ):
            continue
        await move_job(
            state, job_id=job_id, attempt=attempt, node_id=node_id, reason=f"health: node {node_id} degraded; moving after checkpoint"
        )


# ---------------------------------------------------------------- admin


async def _node(state: AppState, node_id: str) -> Any:
    node = await nodes.get_node(state.db, node_id)
    if node is None:
        raise HTTPException(404, f"no node {node_id}")
    return node


def node_public(node: Any) -> dict[str, Any]:
    return {"id": node.id, "state": node.state, "gpu_type": node.gpu_type, "gpu_count": node.gpu_count}


async def _set_admin_state(state: State, who: auth.Principal, node_id: str, new_state: str, kind: str, message: str) -> Any:
    """An admin's change of a node's state, with its health event."""
    require_admin(who)
    await _node(state, node_id)
    try:
        node = await nodes.set_node_state(state.db, node_id=node_id, state=new_state)
    except nodes.NodeRefused as err:
        raise HTTPException(409, {"error": f"node not {kind}ed", "problems": [{"field": err.field, "reason": err.reason}]}) from None
    await stored_health.add_health_event(state.db, node_id=node_id, kind=kind, message=message, key=f"{kind}-{time.time()}")
    return node


@router.post("/nodes/{node_id}/cordon")
async def cordon(state: State, who: Caller, node_id: str) -> dict[str, Any]:
    """No new work on the node; what runs there keeps running."""
    return node_public(await _set_admin_state(state, who, node_id, "CORDONED", "cordon", "cordoned by admin"))


@router.post("/nodes/{node_id}/uncordon")
async def uncordon(state: State, who: Caller, node_id: str) -> dict[str, Any]:
    return node_public(await _set_admin_state(state, who, node_id, "READY", "uncordon", "uncordoned by admin"))


@router.post("/nodes/{node_id}/drain")
async def drain(
    state: State,
    who: Caller,
    node_id: str,
    checkpoint: bool = Query(default=False, description="Checkpoint the node's jobs off it now (else let them finish)."),
) -> dict[str, Any]:
    """Cordon the node and either let its jobs finish or move them (each checkpoints, requeues and resumes elsewhere)."""
    how = "checkpointing its jobs off" if checkpoint else "letting its jobs finish"
    node = await _set_admin_state(state, who, node_id, "CORDONED", "drain", f"drained by admin, {how}")
    jobs = await nodes.node_jobs(state.db, node_id)
    if checkpoint:
        client = await state.temporal()
        if client is None:
            raise HTTPException(503, "the workflow service is unreachable; try again")
        for job_id, _ in jobs:
            try:
                await starter.preempt(client, job_id=job_id, reason=f"drain: node {node_id} drained by admin")
            except Exception as err:  # noqa: BLE001 - not running yet or already stopping: it will not come back here
                log.info("drain: %s not preempted: %s", job_id, err)
    return {**node_public(node), "jobs": [j for j, _ in jobs], "moving": checkpoint}


@router.post("/nodes/{node_id}/gpus/{index}/return")
async def return_gpu(state: State, who: Caller, node_id: str, index: GpuIndex) -> dict[str, Any]:
    """Put a GPU back in service (and forget its injected faults)."""
    require_admin(who)
    gpu = await nodes.get_gpu(state.db, node_id=node_id, index=index)
    if gpu is None:
        raise HTTPException(404, f"no GPU {node_id}/{index}")
    health = {k: v for k, v in gpu.health.items() if k not in ("injected", "xid_errors", "throttled_beats")}
    await stored_health.set_gpu_health(state.db, node_id=node_id, index=index, healthy=True, health=health)
    await stored_health.add_health_event(
        state.db,
        node_id=node_id,
        gpu_index=index,
        kind="gpu_returned",
        message="returned to service by admin",
        key=f"return-{index}-{time.time()}",
    )
    return {"node_id": node_id, "index": index, "healthy": True}


@router.post("/nodes/{node_id}/gpus/{index}/faults")
async def inject_fault(state: State, who: Caller, node_id: str, index: GpuIndex, fault: FaultInjection) -> dict[str, Any]:
    """Simulated backend only: the node's agent reports this fault from its next heartbeat on, until the GPU is returned."""
    require_admin(who)
    if fault.kind not in FAULT_KINDS:
        raise HTTPException(422, f"kind: one of {', '.join(FAULT_KINDS)}")
    injected = await stored_health.inject_gpu_fault(state.db, node_id=node_id, index=index, fault=fault.model_dump(exclude_none=True))
    if injected is None:
        raise HTTPException(404, f"no GPU {node_id}/{index}")
    return {"node_id": node_id, "index": index, "injected": injected}


@router.get("/health/events")
async def health_events(state: State, who: Caller, limit: int = Query(default=50, ge=1, le=1000)) -> list[dict[str, Any]]:
    """The latest GPU health events, newest first."""
    del who  # any authenticated caller may see the fleet's health
    return [
        {"ts": e.ts, "node_id": e.node_id, "gpu_index": e.gpu_index, "kind": e.kind, "severity": e.severity, "message": e.message}
        for e in await stored_health.recent_health_events(state.db, limit=limit)
    ]
