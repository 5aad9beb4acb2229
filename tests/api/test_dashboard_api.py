"""What the dashboard reads besides the views it shares with the CLI: the rollup, the caller, job search, each node's jobs."""

from __future__ import annotations

import time

import httpx

from fairgang.members import PlacedMember
from store import nodes, placement, rollup
from store.db import Database
from tests.api.test_api import ADMIN, ALPHA, NODE
from tests.store.helpers import bind, queued_job


async def test_rollup_serves_the_rows_of_the_window_asked_for(api: httpx.AsyncClient, seeded: Database) -> None:
    now = time.time()
    buckets = [rollup.bucket_of(now - k * 3600, 60) for k in (30, 2, 1)]  # one older than a day, two within it
    for bucket in buckets:
        assert await rollup.record_rollup(seeded, now=bucket + 5, span_s=60)
    stored = {r.bucket: r.as_dict() for r in await rollup.rollup_rows(seeded, since=0, until=now + 60)}
    day = await api.get("/v1/rollup", headers=ALPHA)
    assert day.status_code == 200, day.text
    assert day.json()["rows"] == [stored[b] for b in buckets[1:]]
    assert day.json()["bucket_s"] == 60
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(buckets[0] - 1))
    window = await api.get("/v1/rollup", params={"since": since, "until": buckets[1]}, headers=ADMIN)
    assert [r["bucket"] for r in window.json()["rows"]] == [buckets[0]]


async def test_rollup_refuses_a_bad_window_naming_the_parameter(api: httpx.AsyncClient) -> None:
    bad = await api.get("/v1/rollup", params={"since": "yesterday"}, headers=ALPHA)
    assert bad.status_code == 422 and "since" in bad.json()["detail"]
    backwards = await api.get("/v1/rollup", params={"since": 200, "until": 100}, headers=ALPHA)
    assert backwards.status_code == 422 and "until" in backwards.json()["detail"]
    assert (await api.get("/v1/rollup", headers=NODE)).status_code == 403


async def test_whoami_says_the_role_and_tenant_of_the_token(api: httpx.AsyncClient) -> None:
    alpha = (await api.get("/v1/whoami", headers=ALPHA)).json()
    admin = (await api.get("/v1/whoami", headers=ADMIN)).json()
    assert (alpha["role"], alpha["tenant"], alpha["admin"]) == ("tenant", "alpha", False)
    assert (admin["role"], admin["tenant"], admin["admin"]) == ("admin", None, True)
    assert (await api.get("/v1/whoami")).status_code == 401


async def test_jobs_search_matches_an_id_or_a_part_of_the_name(api: httpx.AsyncClient, seeded: Database) -> None:
    train = await queued_job(seeded, "train-resnet")
    await queued_job(seeded, "eval-resnet")
    await queued_job(seeded, "a_b")
    await queued_job(seeded, "axb")

    async def names(search: str) -> list[str]:
        resp = await api.get("/v1/jobs", params={"search": search}, headers=ALPHA)
        assert resp.status_code == 200, resp.text
        return sorted(j["name"] for j in resp.json())

    assert await names("ResNet") == ["eval-resnet", "train-resnet"]
    assert await names(train.id) == ["train-resnet"]
    assert await names("a_b") == ["a_b"]  # a LIKE wildcard is taken literally
    assert await names("nothing-like-it") == []


async def test_the_fleet_lists_each_nodes_jobs_and_whether_it_drains(api: httpx.AsyncClient, seeded: Database) -> None:
    for node_id, gpu_type, count in (("h1", "H100-80GB", 8), ("h2", "H100-80GB", 8), ("g1", "L40S", 4)):
        await nodes.register_node(seeded, node_id=node_id, gpu_type=gpu_type, gpu_count=count, labels={}, boot_id="b", gpus=[])
    job = await queued_job(seeded, "on-h1")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="t", ttl_s=600)
    assert epoch is not None
    await bind(seeded, job.id, [PlacedMember(node_id="h1", gpu_indices=[2, 3], rank=0)], epoch)
    other = await queued_job(seeded, "on-h2")
    await bind(seeded, other.id, [PlacedMember(node_id="h2", gpu_indices=[0], rank=0)], epoch)
    assert (await api.post("/v1/nodes/h1/drain", headers=ADMIN)).status_code == 200
    assert (await api.post("/v1/nodes/h2/cordon", headers=ADMIN)).status_code == 200
    fleet = {n["id"]: n for n in (await api.get("/v1/fleet", headers=ADMIN)).json()["nodes"]}
    assert fleet["h1"]["jobs"] == [job.id] and fleet["h2"]["jobs"] == [other.id] and fleet["g1"]["jobs"] == []
    assert [g["index"] for g in fleet["h1"]["gpu_health"] if g["job_id"] == job.id] == [2, 3]
    assert (fleet["h1"]["state"], fleet["h1"]["draining"]) == ("CORDONED", True)
    # Cordoned, not drained: its jobs stay, it is not draining.
    assert (fleet["h2"]["state"], fleet["h2"]["draining"]) == ("CORDONED", False)


async def test_the_dashboard_is_served_with_the_temporal_address_and_polls_without_overlapping(api: httpx.AsyncClient) -> None:
    resp = await api.get("/dashboard")
    assert resp.status_code == 200 and "__TEMPORAL_WORKFLOWS_URL__" not in resp.text
    assert 'name="fairgang-temporal-workflows" content="http' in resp.text
    # An interval fires whether or not the previous refresh has answered: each refresh is scheduled when the last ended.
    assert "setInterval" not in resp.text
    assert "setTimeout(() => poll(mine), REFRESH_MS)" in resp.text
