"""A queued job can be held (kept from placement), released (placed again, in its place), and have its priority
class lowered or its max runtime shortened; never raised, never once placed."""

from __future__ import annotations

import httpx

from fairgang.members import PlacedMember
from store import jobs, placement
from store import snapshot as snapshot_rows
from store.db import Database
from tests.builders import job_spec
from tests.store.helpers import bind, queued_job

ALPHA = {"Authorization": "Bearer alpha-token"}
BETA = {"Authorization": "Bearer beta-token"}


async def queued_ids(db: Database) -> list[str]:
    async with db.sessions() as session:
        rows = await snapshot_rows.read_rows(session)
    return [r[0] for r in rows.queued]


async def test_a_held_job_is_never_placed_until_released_and_keeps_its_place(api: httpx.AsyncClient, seeded: Database) -> None:
    first, second = await queued_job(seeded, "first"), await queued_job(seeded, "second")
    for job in (first, second):
        await jobs.mark_workflow_started(seeded, job.id)
    held = await api.post(f"/v1/jobs/{first.id}/hold", headers=ALPHA)
    assert held.status_code == 200 and held.json()["state"] == "HELD" and "fairgang release" in held.json()["pending_reason"]
    assert (await api.post(f"/v1/jobs/{first.id}/hold", headers=ALPHA)).json()["state"] == "HELD"  # again: as it is
    assert await queued_ids(seeded) == [second.id]
    # A binding that raced the hold loses: the job is not QUEUED.
    epoch = await placement.acquire_lease(seeded, name="placement", holder="test", ttl_s=60)
    assert epoch is not None
    assert await bind(seeded, first.id, [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)], epoch) == []
    assert (await api.post(f"/v1/jobs/{first.id}/hold", headers=BETA)).status_code == 404  # not beta's
    released = await api.post(f"/v1/jobs/{first.id}/release", headers=ALPHA)
    assert released.status_code == 200 and released.json()["state"] == "QUEUED"
    assert await queued_ids(seeded) == [first.id, second.id]  # back in its place: submitted first, first in line
    kinds = [e["kind"] for e in (await api.get(f"/v1/jobs/{first.id}", headers=ALPHA)).json()["events"]]
    assert kinds[-2:] == ["HELD", "RELEASED"]
    # Once placed, neither.
    await bind(seeded, first.id, [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)], epoch)
    for verb in ("hold", "release"):
        refused = await api.post(f"/v1/jobs/{first.id}/{verb}", headers=ALPHA)
        assert refused.status_code == 409 and "PLACED" in refused.text, refused.text


async def test_a_waiting_jobs_priority_and_max_runtime_only_go_down(api: httpx.AsyncClient, seeded: Database) -> None:
    # Its workflow not started yet: the store alone holds its limits (the workflow's signal is an e2e test's).
    job, _ = await jobs.create_job(seeded, spec=job_spec(name="limits"), tenant="alpha")
    path = f"/v1/jobs/{job.id}"
    for body, name in (
        ({"priority_class": "urgent"}, "priority_class"),
        ({"priority_class": "best"}, "priority_class"),
        ({"max_runtime": "48h"}, "max_runtime"),
        ({"max_runtime": 0}, "max_runtime"),
        ({}, "nothing to change"),
        ({"gpu_count": 1}, "gpu_count"),
    ):
        resp = await api.patch(path, json=body, headers=ALPHA)
        assert resp.status_code == 422 and name in resp.text, (body, resp.text)
    changed = await api.patch(path, json={"priority_class": "low", "max_runtime": "30m"}, headers=ALPHA)
    assert changed.status_code == 200, changed.text
    assert changed.json()["priority"] == 0 and changed.json()["spec"]["priority_class"] == "low"
    assert changed.json()["spec"]["max_runtime"] == 1800
    assert (await api.patch(path, json={"priority_class": "normal"}, headers=ALPHA)).status_code == 422  # back up: no
    stored = await jobs.get_job(seeded, job.id)
    assert stored is not None and stored.priority == 0 and stored.spec["max_runtime"] == 1800
    # A held job can be changed too; a placed one cannot.
    await api.post(f"/v1/jobs/{job.id}/hold", headers=ALPHA)
    assert (await api.patch(path, json={"max_runtime": "10m"}, headers=ALPHA)).json()["spec"]["max_runtime"] == 600
    await api.post(f"/v1/jobs/{job.id}/release", headers=ALPHA)
    epoch = await placement.acquire_lease(seeded, name="placement", holder="test", ttl_s=60)
    assert epoch is not None
    await bind(seeded, job.id, [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)], epoch)
    assert (await api.patch(path, json={"max_runtime": "5m"}, headers=ALPHA)).status_code == 409
