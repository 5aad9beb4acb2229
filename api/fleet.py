"""/v1/fleet and the node agents' endpoints (/v1/nodes/...)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from api.deps import Caller, State, require_node
from api.schemas import NodeAnswer, NodeHeartbeat, NodeRegistration
from store import repo

router = APIRouter(prefix="/v1", tags=["fleet"])


@router.get("/fleet")
async def fleet(state: State, who: Caller) -> dict[str, Any]:
    """Nodes with their GPUs (free, used, unhealthy), and totals per GPU type."""
    del who  # any authenticated caller may see the fleet
    now = time.time()
    used: dict[tuple[str, int], str] = {(g.node_id, g.gpu_index): g.allocation_id for g in await repo.live_allocation_gpus(state.db)}
    gpus_by_node: dict[str, list[Any]] = {}
    for gpu in await repo.list_gpus(state.db):
        gpus_by_node.setdefault(gpu.node_id, []).append(gpu)
    nodes = []
    totals: dict[str, dict[str, int]] = {}
    for node in await repo.list_nodes(state.db):
        stale = node.last_heartbeat is None or now - node.last_heartbeat > state.settings.node_stale_after_s
        gpus = gpus_by_node.get(node.id, [])
        n_used = sum(1 for g in gpus if (node.id, g.index) in used)
        n_unhealthy = sum(1 for g in gpus if not g.healthy)
        schedulable = node.state == "READY" and not stale
        n_free = sum(1 for g in gpus if g.healthy and (node.id, g.index) not in used) if schedulable else 0
        nodes.append(
            {
                "id": node.id,
                "gpu_type": node.gpu_type,
                "gpu_count": node.gpu_count,
                "labels": node.labels,
                "state": node.state,
                "schedulable": schedulable,
                "last_heartbeat": node.last_heartbeat,
                "gpus": {"used": n_used, "free": n_free, "unhealthy": n_unhealthy},
                "allocations": sorted({used[(node.id, g.index)] for g in gpus if (node.id, g.index) in used}),
            }
        )
        t = totals.setdefault(node.gpu_type, {"total": 0, "used": 0, "free": 0, "unhealthy": 0, "nodes": 0})
        t["total"] += node.gpu_count
        t["used"] += n_used
        t["free"] += n_free
        t["unhealthy"] += n_unhealthy
        t["nodes"] += 1
    return {"gpu_types": totals, "nodes": nodes}


@router.post("/nodes/register", response_model=NodeAnswer)
async def register(state: State, who: Caller, body: NodeRegistration) -> NodeAnswer:
    """An agent registers (or re-registers after a restart) its node."""
    require_node(who)
    _, live = await repo.register_node(
        state.db,
        node_id=body.node_id,
        gpu_type=body.gpu_type,
        gpu_count=body.gpu_count,
        labels=body.labels,
        boot_id=body.boot_id,
        gpus=body.gpus,
        address=body.address,
    )
    return NodeAnswer(accepted=True, live_allocations=live)


@router.post("/nodes/{node_id}/heartbeat", response_model=NodeAnswer)
async def heartbeat(state: State, who: Caller, node_id: str, body: NodeHeartbeat) -> NodeAnswer:
    """A heartbeat; refused (accepted=false) for an old boot or a node declared lost."""
    require_node(who)
    accepted, live = await repo.node_heartbeat(state.db, node_id=node_id, boot_id=body.boot_id)
    return NodeAnswer(accepted=accepted, live_allocations=live)
