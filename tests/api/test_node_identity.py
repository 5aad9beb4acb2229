"""One identity per node: a node's credential speaks for that node only; registration checks the inventory
against the node's enrolment; an admin enrols nodes (and enrols them again to change their GPUs)."""

from __future__ import annotations

import time
from typing import Any

import httpx

from api import insight
from fairgang.cluster import node_credential
from fairgang.members import PlacedMember
from fairgang.settings import Settings
from store import jobs, nodes, placement, tenants
from store import snapshot as snapshot_rows
from store.db import Database
from tests.conftest import small_cluster
from tests.store.helpers import bind, queued_job


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


H1, H2, ADMIN, ALPHA = (
    auth(node_credential("node-token", "h1")),
    auth(node_credential("node-token", "h2")),
    auth("admin-token"),
    auth("alpha-token"),
)


def registration(node_id: str = "h1", **extra: Any) -> dict[str, Any]:
    body = {"node_id": node_id, "gpu_type": "H100-80GB", "gpu_count": 8, "boot_id": "b1", "gpus": [{"index": i} for i in range(8)]}
    return body | extra


def fields(resp: httpx.Response) -> dict[str, str]:
    return {p["field"]: p["reason"] for p in resp.json()["problems"]}


async def test_a_node_credential_speaks_for_its_own_node_only(api: httpx.AsyncClient) -> None:
    assert (await api.post("/v1/nodes/register", json=registration("h1"), headers=H1)).json()["accepted"]
    as_other = await api.post("/v1/nodes/register", json=registration("h2"), headers=H1)
    assert as_other.status_code == 403 and "node h1's, not node h2's" in as_other.json()["detail"]
    assert (await api.post("/v1/nodes/h2/heartbeat", json={"boot_id": "b1"}, headers=H1)).status_code == 403
    assert (await api.post("/v1/nodes/h1/heartbeat", json={"boot_id": "b1"}, headers=H1)).json()["accepted"]
    # Neither an admin nor a tenant speaks for a node, and the cluster's node secret itself is no credential.
    for headers in (ADMIN, ALPHA):
        assert (await api.post("/v1/nodes/register", json=registration("h2"), headers=headers)).status_code == 403
        assert (await api.post("/v1/nodes/h1/heartbeat", json={"boot_id": "b1"}, headers=headers)).status_code == 403
    assert (await api.post("/v1/nodes/register", json=registration("h2"), headers=auth("node-token"))).status_code == 401


async def test_registration_checks_the_inventory_and_the_enrolment(api: httpx.AsyncClient) -> None:
    bad = [
        (registration(gpu_count=0), "gpu_count"),
        (registration(gpu_count=-5), "gpu_count"),
        (registration(gpus=[{"index": -3}]), "gpus.0.index"),
        (registration(gpus=[{"index": i} for i in (0, 1, 2, 3, 4, 5, 6, 9)]), "gpus"),
        (registration(gpus=[{"index": 0}] * 8), "gpus"),
        (registration(node_id="h1/../h2"), "node_id"),
    ]
    for body, field in bad:
        resp = await api.post("/v1/nodes/register", json=body, headers=H1)
        assert resp.status_code == 422 and field in fields(resp), (body, resp.text)
    # GPU type and count change only through an admin's enrolment.
    other_type = await api.post("/v1/nodes/register", json=registration(gpu_type="L40S"), headers=H1)
    assert other_type.status_code == 409 and "enrolled with H100-80GB" in fields(other_type)["gpu_type"]
    fewer = await api.post("/v1/nodes/register", json=registration(gpu_count=4, gpus=[{"index": i} for i in range(4)]), headers=H1)
    assert fewer.status_code == 409 and "enrolled with 8 GPUs" in fields(fewer)["gpu_count"]


async def test_an_admin_enrols_a_node_and_enrolling_again_replaces_its_credential(api: httpx.AsyncClient, seeded: Database) -> None:
    body = {"node_id": "n9", "gpu_type": "L40S", "gpu_count": 2, "labels": {"leaf": "l2", "spine": "s1"}}
    assert (await api.post("/v1/nodes", json=body, headers=ALPHA)).status_code == 403
    assert (await api.post("/v1/nodes", json=body | {"gpu_count": 0}, headers=ADMIN)).status_code == 422
    first = await api.post("/v1/nodes", json=body, headers=ADMIN)
    assert first.status_code == 201 and first.json()["node_id"] == "n9"
    n9 = auth(first.json()["token"])
    reg = registration("n9", gpu_type="L40S", gpu_count=2, gpus=[{"index": 0}, {"index": 1}])
    assert (await api.post("/v1/nodes/register", json=reg, headers=n9)).json()["accepted"]
    assert len([g for g in await nodes.list_gpus(seeded) if g.node_id == "n9"]) == 2
    # Enrolled again with four GPUs: the old credential stops working, the new one registers the new inventory.
    again = await api.post("/v1/nodes", json=body | {"gpu_count": 4}, headers=ADMIN)
    assert again.status_code == 201 and again.json()["token"] != first.json()["token"]
    assert (await api.post("/v1/nodes/n9/heartbeat", json={"boot_id": "b1"}, headers=n9)).status_code == 401
    reg4 = reg | {"gpu_count": 4, "gpus": [{"index": i} for i in range(4)]}
    assert (await api.post("/v1/nodes/register", json=reg4, headers=auth(again.json()["token"]))).json()["accepted"]
    assert sorted(g.index for g in await nodes.list_gpus(seeded) if g.node_id == "n9") == [0, 1, 2, 3]


async def test_an_admin_retires_an_empty_node_and_enrolling_it_again_brings_it_back(api: httpx.AsyncClient, seeded: Database) -> None:
    assert (await api.post("/v1/nodes/register", json=registration("h1"), headers=H1)).json()["accepted"]
    epoch = await placement.acquire_lease(seeded, name="placement", holder="test", ttl_s=60)
    assert epoch is not None
    job = await queued_job(seeded, "on-h1")
    (alloc,) = await bind(seeded, job.id, [PlacedMember(node_id="h1", gpu_indices=[0, 1], rank=0)], epoch)
    assert (await api.post("/v1/nodes/h1/retire", headers=ALPHA)).status_code == 403
    assert (await api.post("/v1/nodes/nope/retire", headers=ADMIN)).status_code == 404
    busy = await api.post("/v1/nodes/h1/retire", headers=ADMIN)
    assert busy.status_code == 409 and "drain it" in fields(busy)["node_id"]
    assert (await nodes.get_node(seeded, "h1")).state == "READY"  # type: ignore[union-attr]

    await placement.release_allocation(seeded, job_id=job.id, allocation_id=alloc.id)
    retired = await api.post("/v1/nodes/h1/retire", headers=ADMIN)
    assert retired.status_code == 200 and retired.json()["state"] == "RETIRED"
    assert (await api.post("/v1/nodes/h1/retire", headers=ADMIN)).json()["state"] == "RETIRED"  # idempotent
    # No part of the fleet: not in the placement snapshot, not in admission's fleet shape, not in the fleet view.
    async with seeded.sessions() as session:
        rows = await snapshot_rows.read_rows(session)
    assert [r[0] for r in rows.nodes] == ["g1", "h2"]
    assert (await tenants.fleet_shape(seeded)).shapes["H100-80GB"] == {8: 1}
    fleet = await insight.fleet_view(seeded, Settings(database_url="sqlite+aiosqlite:///:memory:"))
    assert "h1" not in {n["id"] for n in fleet["nodes"]} and fleet["retired"] == ["h1"]
    assert fleet["gpu_types"]["H100-80GB"]["total"] == 8
    # Its agent is refused: the credential is gone; nothing can cordon it back into the fleet; never declared lost.
    assert (await api.post("/v1/nodes/h1/heartbeat", json={"boot_id": "b1"}, headers=H1)).status_code == 401
    assert (await api.post("/v1/nodes/register", json=registration("h1"), headers=H1)).status_code == 401
    for verb in ("cordon", "uncordon", "drain"):
        resp = await api.post(f"/v1/nodes/h1/{verb}", headers=ADMIN)
        assert resp.status_code == 409 and "retired" in fields(resp)["node_id"], (verb, resp.text)
    assert "h1" not in await nodes.mark_lost_nodes(seeded, lost_after_s=60.0, now=time.time() + 3600)
    assert (await nodes.get_node(seeded, "h1")).state == "RETIRED"  # type: ignore[union-attr]
    # Re-seeding keeps it retired (its seeded credential still cannot register it).
    await tenants.seed_cluster(seeded, small_cluster())
    refused = await api.post("/v1/nodes/register", json=registration("h1"), headers=H1)
    assert refused.status_code == 409 and "retired" in fields(refused)["node_id"]
    audit = (await api.get("/v1/audit", params={"target": "node:h1"}, headers=ADMIN)).json()
    assert any(e["action"] == "node.retire" and e["before"] == {"state": "READY"} and e["after"] == {"state": "RETIRED"} for e in audit)

    # Enrolled again: back as DOWN, then READY once its agent registers with the new credential.
    again = await api.post("/v1/nodes", json={"node_id": "h1", "gpu_type": "H100-80GB", "gpu_count": 8}, headers=ADMIN)
    assert again.status_code == 201
    assert (await nodes.get_node(seeded, "h1")).state == "DOWN"  # type: ignore[union-attr]
    assert (await api.post("/v1/nodes/register", json=registration("h1"), headers=auth(again.json()["token"]))).json()["accepted"]
    assert (await nodes.get_node(seeded, "h1")).state == "READY"  # type: ignore[union-attr]
    assert (await tenants.fleet_shape(seeded)).shapes["H100-80GB"] == {8: 2}


async def test_the_node_running_rank_0_reports_its_jobs_checkpoints_to_the_store(api: httpx.AsyncClient, seeded: Database) -> None:
    for node_id, headers in (("h1", H1), ("h2", H2)):
        assert (await api.post("/v1/nodes/register", json=registration(node_id), headers=headers)).json()["accepted"]
    epoch = await placement.acquire_lease(seeded, name="placement", holder="test", ttl_s=60)
    assert epoch is not None
    job = await queued_job(seeded, "gang")
    members = [
        PlacedMember(node_id="h1", gpu_indices=list(range(8)), rank=0),
        PlacedMember(node_id="h2", gpu_indices=list(range(8)), rank=1),
    ]
    (alloc,) = await bind(seeded, job.id, members, epoch)

    def report(path: str, seq: int, allocation_id: str = alloc.id) -> dict[str, Any]:
        return {"allocation_id": allocation_id, "path": path, "seq": seq}

    first = await api.post("/v1/nodes/h1/checkpoints", json=report("/ckpt/alpha/step-20", 1), headers=H1)
    assert first.status_code == 200 and first.json() == {"latest": True}
    assert (await api.post("/v1/nodes/h1/checkpoints", json=report("/ckpt/alpha/step-40", 2), headers=H1)).json() == {"latest": True}
    # An older report that comes late changes nothing; the same report again is answered as it was.
    assert (await api.post("/v1/nodes/h1/checkpoints", json=report("/ckpt/alpha/step-10", 1), headers=H1)).json() == {"latest": False}
    assert (await api.post("/v1/nodes/h1/checkpoints", json=report("/ckpt/alpha/step-40", 2), headers=H1)).json() == {"latest": True}
    assert await jobs.latest_checkpoint(seeded, job.id) == "/ckpt/alpha/step-40"
    # Only the node running rank 0 speaks for the job's checkpoints; only a node at all; the allocation must exist.
    other = await api.post("/v1/nodes/h2/checkpoints", json=report("/ckpt/alpha/evil", 9), headers=H2)
    assert other.status_code == 403 and "rank 0" in other.json()["detail"]
    assert (await api.post("/v1/nodes/h2/checkpoints", json=report("/ckpt/alpha/evil", 9), headers=H1)).status_code == 403
    for headers in (ADMIN, ALPHA):
        assert (await api.post("/v1/nodes/h1/checkpoints", json=report("/ckpt/alpha/evil", 9), headers=headers)).status_code == 403
    missing = await api.post("/v1/nodes/h1/checkpoints", json=report("/ckpt/alpha/evil", 9, "a-nope"), headers=H1)
    assert missing.status_code == 404 and "a-nope" in missing.json()["detail"]
    bad = await api.post("/v1/nodes/h1/checkpoints", json=report("", 0), headers=H1)
    assert bad.status_code == 422 and {"path", "seq"} <= set(fields(bad))
    assert await jobs.latest_checkpoint(seeded, job.id) == "/ckpt/alpha/step-40"
