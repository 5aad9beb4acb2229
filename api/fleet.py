"""/v1/fleet, /v1/rollup and the node agents' endpoints (/v1/nodes/...)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from api import health
from api.deps import Caller, State, require_admin, require_node, require_user
from api.jobs import parse_time
from api.schemas import CheckpointRecorded, CheckpointReportIn, NodeAnswer, NodeCredential, NodeEnrolment, NodeHeartbeat, NodeRegistration
from store import jobs, nodes, rollup

router = APIRouter(prefix="/v1", tags=["fleet"])


@router.get("/fleet")
async def fleet(state: State, who: Caller) -> Any:
    """Nodes with their GPUs, and per GPU type and per topology domain: free, used, unhealthy, fragmentation.

    From the view cache (``api.views``); ``computed_at`` says when it was computed.
    """
    del who  # any authenticated caller may see the fleet
    view = await state.views.get("fleet", state.db)
    return Response(view.body, media_type="application/json", headers=view.headers())


@router.get("/rollup")
async def fleet_rollup(
    state: State,
    who: Caller,
    since: str | None = Query(default=None, description="from this bucket on: epoch seconds or ISO 8601 (default: 24 hours before until)"),
    until: str | None = Query(default=None, description="buckets before this: epoch seconds or ISO 8601 (default: now)"),
) -> dict[str, Any]:
    """The fleet rollup, oldest bucket first: per bucket (a minute by default) the GPUs in the fleet, allocated (and
    the utilisation in percent) and unhealthy, the queue's length, and the wait percentiles of the jobs that started
    in the bucket before. Written by the placement service's leader (``store.rollup``)."""
    require_user(who)
    end = parse_time(until, "until") if until is not None else time.time()
    start = parse_time(since, "since") if since is not None else end - 86400
    if end <= start:
        raise HTTPException(422, "until: must be after since")
    rows = await rollup.rollup_rows(state.db, since=start, until=end)
    return {"since": start, "until": end, "bucket_s": state.settings.rollup_bucket_s, "rows": [r.as_dict() for r in rows]}


@router.post("/nodes", response_model=NodeCredential, status_code=201)
async def enrol(state: State, who: Caller, body: NodeEnrolment) -> NodeCredential:
    """Admin: enrol a node, or enrol it again to change its GPU type, count or labels; answers its new credential.

    The credential is shown once; the node's earlier one stops working. GPUs change only on a node with
    nothing placed on it (409 otherwise: drain it first).
    """
    require_admin(who)
    try:
        token = await nodes.enrol_node(
            state.db, node_id=body.node_id, gpu_type=body.gpu_type, gpu_count=body.gpu_count, labels=body.labels, actor=who.name
        )
    except nodes.NodeRefused as err:
        raise HTTPException(409, {"error": "node not enrolled", "problems": [{"field": err.field, "reason": err.reason}]}) from None
    return NodeCredential(node_id=body.node_id, token=token)


@router.post("/nodes/{node_id}/retire")
async def retire(state: State, who: Caller, node_id: str) -> dict[str, Any]:
    """Admin: take a node out of the fleet for good: no capacity, no credential, its agent refused; its history
    stays. Only an empty node (409 otherwise: drain it first); enrolling it again brings it back."""
    require_admin(who)
    try:
        node = await nodes.retire_node(state.db, node_id=node_id, actor=who.name)
    except nodes.NodeRefused as err:
        raise HTTPException(409, {"error": "node not retired", "problems": [{"field": err.field, "reason": err.reason}]}) from None
    if node is None:
        raise HTTPException(404, f"no node {node_id}")
    return health.node_public(node)


@router.post("/nodes/register", response_model=NodeAnswer)
async def register(state: State, who: Caller, body: NodeRegistration) -> NodeAnswer:
    """An agent registers (or re-registers after a restart) its node: only as the node its credential names,
    with the GPU type and count the node was enrolled with (409 otherwise)."""
    require_node(who, body.node_id)
    try:
        _, live = await nodes.register_node(
            state.db,
            node_id=body.node_id,
            gpu_type=body.gpu_type,
            gpu_count=body.gpu_count,
            labels=body.labels,
            boot_id=body.boot_id,
            gpus=[g.model_dump() for g in body.gpus],
            address=body.address,
        )
    except nodes.NodeRefused as err:
        raise HTTPException(409, {"error": "registration refused", "problems": [{"field": err.field, "reason": err.reason}]}) from None
    fence = await nodes.report_running(state.db, node_id=body.node_id, running=body.running, live=live)
    return NodeAnswer(accepted=True, live_allocations=live, fence=fence)


@router.post("/nodes/{node_id}/heartbeat", response_model=NodeAnswer)
async def heartbeat(state: State, who: Caller, node_id: str, body: NodeHeartbeat) -> NodeAnswer:
    """A heartbeat; refused (accepted=false) for an old boot or a node declared lost.

    A refused heartbeat holds nothing: everything it reports running is to be killed (a late heartbeat of
    a node declared lost revives none of its allocations).
    """
    require_node(who, node_id)
    reports = [g.model_dump() for g in body.gpus]
    accepted, live, faults = await health.heartbeat(state, node_id=node_id, boot_id=body.boot_id, reports=reports)
    fence = await nodes.report_running(state.db, node_id=node_id, running=body.running, live=live)
    return NodeAnswer(accepted=accepted, live_allocations=live, faults=faults, fence=fence)


@router.post("/nodes/{node_id}/checkpoints", response_model=CheckpointRecorded)
async def report_checkpoint(state: State, who: Caller, node_id: str, body: CheckpointReportIn) -> CheckpointRecorded:
    """The newest checkpoint of a job whose rank 0 runs on this node (its agent reads the job's LATEST marker).

    Recorded in the store, not in the job's workflow (whose history stays bounded); an older report (a lower
    ``seq`` of the same attempt, or an earlier attempt's) than the newest recorded changes nothing.
    """
    require_node(who, node_id)
    try:
        latest = await jobs.report_checkpoint(state.db, node_id=node_id, allocation_id=body.allocation_id, path=body.path, seq=body.seq)
    except LookupError as err:
        raise HTTPException(404, str(err)) from None
    except jobs.NotOnThisNode as err:
        raise HTTPException(403, str(err)) from None
    return CheckpointRecorded(latest=latest)
