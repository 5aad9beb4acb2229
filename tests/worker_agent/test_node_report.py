"""What an agent reports it runs, and what the API answers (both store backends).

The API answers each register and heartbeat with the reported allocations the store no longer holds
on the node (``fence``), and logs a ``FENCED`` event of their jobs; a revoked allocation keeps its GPUs
but is no longer held; a node declared lost holds nothing, whatever its late heartbeat reports.
"""

from __future__ import annotations

import httpx

from fairgang.cluster import node_credential
from fairgang.members import PlacedMember
from fairgang.spec import JobState
from store import jobs, nodes, placement
from store.db import Database
from tests.builders import job_spec

NODE = {"Authorization": f"Bearer {node_credential('node-token', 'h1')}"}


async def _running_job(db: Database, name: str, gpu: int) -> tuple[str, str]:
    """A job bound to h1's GPU ``gpu`` and acknowledged; returns (job id, allocation id)."""
    job, _ = await jobs.create_job(db, spec=job_spec(name=name), tenant="alpha")
    await jobs.mark_queued(db, job_id=job.id, attempt=1)
    epoch = await placement.acquire_lease(db, name="placement", holder="t", ttl_s=60)
    assert epoch is not None
    members = [PlacedMember(node_id="h1", gpu_indices=[gpu], rank=0)]
    [alloc] = await placement.commit_bindings(
        db,
        bindings=[placement.BindingRow(job_id=job.id, attempt=1, members=members)],
        pending_reasons={},
        lease_name="placement",
        epoch=epoch,
    )
    await jobs.record_transition(db, job_id=job.id, attempt=1, state=JobState.LAUNCHING, event_key="l-1", allocation_id=alloc.id)
    return job.id, alloc.id


def _registration(boot: str, running: list[str]) -> dict[str, object]:
    return {"node_id": "h1", "gpu_type": "H100-80GB", "gpu_count": 8, "boot_id": boot, "running": running}


async def _fenced_events(db: Database, job_id: str) -> list[str]:
    return [e.message for e in await jobs.job_events(db, job_id) if e.kind == "FENCED"]


async def test_the_answer_names_what_the_store_no_longer_holds_and_logs_it(api: httpx.AsyncClient, seeded: Database) -> None:
    kept, kept_alloc = await _running_job(seeded, "kept", 0)
    revoked, revoked_alloc = await _running_job(seeded, "revoked", 1)
    released, released_alloc = await _running_job(seeded, "released", 2)
    answer = (await api.post("/v1/nodes/register", json=_registration("boot-1", []), headers=NODE)).json()
    assert answer["accepted"] and answer["fence"] == []
    assert set(answer["live_allocations"]) == {kept_alloc, revoked_alloc, released_alloc}

    assert await placement.revoke_allocation(seeded, job_id=revoked, allocation_id=revoked_alloc, reason="member 0 lost")
    assert not await placement.revoke_allocation(seeded, job_id=revoked, allocation_id=revoked_alloc, reason="again")  # idempotent
    assert await placement.release_allocation(seeded, job_id=released, allocation_id=released_alloc)
    running = [kept_alloc, revoked_alloc, released_alloc, "a-unknown"]
    for _ in range(2):  # a repeated report logs nothing new
        beat = await api.post("/v1/nodes/h1/heartbeat", json={"boot_id": "boot-1", "running": running}, headers=NODE)
        answer = beat.json()
        assert answer["accepted"]
        assert answer["live_allocations"] == [kept_alloc]
        assert answer["fence"] == sorted([revoked_alloc, released_alloc, "a-unknown"])
    assert await _fenced_events(seeded, kept) == []
    [message] = await _fenced_events(seeded, revoked)
    assert message == f"node h1 still ran allocation {revoked_alloc} (revoked): its agent kills it"
    assert len(await _fenced_events(seeded, released)) == 1
    # A revoked allocation keeps its GPU until the job is queued again (then it is released).
    held = {(g.node_id, g.gpu_index) for g in await placement.live_allocation_gpus(seeded)}
    assert held == {("h1", 0), ("h1", 1)}
    await jobs.requeue_job(seeded, job_id=revoked, from_attempt=1, reason="lost")
    assert [a.state for a in await jobs.job_allocations(seeded, revoked)] == ["RELEASED"]
    assert {(g.node_id, g.gpu_index) for g in await placement.live_allocation_gpus(seeded)} == {("h1", 0)}


async def test_a_lost_node_holds_nothing_whatever_its_late_heartbeat_reports(api: httpx.AsyncClient, seeded: Database) -> None:
    job_id, alloc_id = await _running_job(seeded, "on-lost-node", 3)
    await api.post("/v1/nodes/register", json=_registration("boot-1", []), headers=NODE)
    await nodes.mark_lost_nodes(seeded, lost_after_s=0.0, now=1e13)
    late = (await api.post("/v1/nodes/h1/heartbeat", json={"boot_id": "boot-1", "running": [alloc_id]}, headers=NODE)).json()
    assert not late["accepted"] and late["live_allocations"] == [] and late["fence"] == [alloc_id]
    node = next(n for n in await nodes.list_nodes(seeded) if n.id == "h1")
    assert node.state == "LOST"  # the late heartbeat revived nothing
    # Registering again (the agent resumed, or restarted) brings the node back empty-handed.
    again = (await api.post("/v1/nodes/register", json=_registration("boot-1", [alloc_id]), headers=NODE)).json()
    assert again["accepted"] and again["live_allocations"] == [] and again["fence"] == [alloc_id]
    assert len(await _fenced_events(seeded, job_id)) == 1
