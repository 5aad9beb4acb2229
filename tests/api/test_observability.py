"""/metrics, /v1/fleet domains, /v1/tenants and queue-wait estimates, in-process over a real store."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import requeue_reason
from fairgang.cluster import node_credential
from fairgang.members import PlacedMember
from fairgang.spec import JobState
from simulator.workload import size_class
from store import jobs, placement
from store.db import Database
from tests.api.test_api import ADMIN, ALPHA, BETA, NODE
from tests.builders import spec_dict


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def metric(values: dict, name: str, **labels: str) -> float:
    return values[(name, tuple(sorted(labels.items())))]


async def register(api: httpx.AsyncClient, node_id: str, utilisation: float) -> None:
    gpus = [{"index": i, "uuid": f"GPU-{node_id}-{i}", "health": {"utilization_pct": utilisation}} for i in range(8)]
    body = {
        "node_id": node_id,
        "gpu_type": "H100-80GB",
        "gpu_count": 8,
        "labels": {"leaf": "l1", "spine": "s1"},
        "boot_id": "b",
        "gpus": gpus,
    }
    own = {"Authorization": f"Bearer {node_credential('node-token', node_id)}"}  # each node speaks for itself
    assert (await api.post("/v1/nodes/register", json=body, headers=own)).json()["accepted"]


async def queue_job(api: httpx.AsyncClient, db: Database, headers: dict, **spec: Any) -> str:
    resp = await api.post("/v1/jobs", json=spec_dict(**spec), headers=headers)
    assert resp.status_code == 201, resp.text
    job_id = str(resp.json()["job"]["id"])
    await jobs.mark_queued(db, job_id=job_id, attempt=1)
    return job_id


async def bind(db: Database, job_id: str, node_id: str, gpus: list[int]) -> None:
    epoch = await placement.acquire_lease(db, name="placement", holder="test", ttl_s=60)
    assert epoch is not None
    rows = [placement.BindingRow(job_id=job_id, attempt=1, members=[PlacedMember(node_id=node_id, gpu_indices=gpus, rank=0)])]
    assert await placement.commit_bindings(db, bindings=rows, pending_reasons={}, lease_name="placement", epoch=epoch)


async def test_metrics_count_the_fleet_the_queue_and_the_tenants(api: httpx.AsyncClient, seeded: Database) -> None:
    await register(api, "h1", 50.0)
    await register(api, "h2", 0.0)
    running = await queue_job(api, seeded, ALPHA, name="big", gpu_count=4)
    await bind(seeded, running, "h1", [0, 1, 2, 3])
    await queue_job(api, seeded, BETA, name="one", checkpoint_dir="/ckpt/beta/one")
    await queue_job(api, seeded, BETA, name="two", checkpoint_dir="/ckpt/beta/two", gpu_count=2)

    values = scrape((await api.get("/metrics")).text)
    assert metric(values, "fairgang_gpus", gpu_type="H100-80GB", state="allocated") == 4
    assert metric(values, "fairgang_gpus", gpu_type="H100-80GB", state="free") == 12
    assert metric(values, "fairgang_gpus", gpu_type="L40S", state="unavailable") == 4  # its agent never registered
    assert metric(values, "fairgang_gpus_capacity", gpu_type="H100-80GB") == 16
    assert metric(values, "fairgang_gpus_stranded", gpu_type="H100-80GB") == 4
    assert metric(values, "fairgang_gpu_utilization_ratio", node="h1", gpu="3", gpu_type="H100-80GB") == 0.5
    assert metric(values, "fairgang_nodes", state="READY") == 2 and metric(values, "fairgang_nodes", state="DOWN") == 1
    assert metric(values, "fairgang_queue_length", tenant="beta", gpu_type="H100-80GB", size_class="1") == 1
    assert metric(values, "fairgang_queue_length", tenant="beta", gpu_type="H100-80GB", size_class="2-8") == 1
    assert metric(values, "fairgang_tenant_used_gpus", tenant="alpha", gpu_type="H100-80GB") == 4
    assert metric(values, "fairgang_tenant_guaranteed_gpus", tenant="alpha", gpu_type="H100-80GB") == 8
    assert metric(values, "fairgang_tenant_borrowed_gpus", tenant="alpha", gpu_type="H100-80GB") == 0
    assert metric(values, "fairgang_tenant_dominant_share", tenant="alpha") > metric(
        values, "fairgang_tenant_dominant_share", tenant="beta"
    )
    assert metric(values, "fairgang_requeues_total", reason="reclaim") == 0

    await jobs.requeue_job(seeded, job_id=running, from_attempt=1, reason="preempted: reclaim: its GPUs go to j-x")
    values = scrape((await api.get("/metrics")).text)
    assert metric(values, "fairgang_requeues_total", reason="reclaim") == 1
    assert metric(values, "fairgang_gpus", gpu_type="H100-80GB", state="allocated") == 0


def test_requeue_reasons_and_size_classes_are_named() -> None:
    assert requeue_reason("preempted: priority: its GPUs go to j-1") == "priority"
    assert requeue_reason("preempted: preempted by admin") == "manual"
    assert requeue_reason("job failed (exit 3); retry 1 of 2") == "retry"
    assert requeue_reason("node h1 lost") == "infrastructure"
    assert [size_class(n) for n in (1, 2, 8, 9, 32, 33)] == ["1", "2-8", "2-8", "9-32", "9-32", "33+"]


async def test_fleet_shows_each_topology_domain_with_its_fragmentation(api: httpx.AsyncClient, seeded: Database) -> None:
    await register(api, "h1", 0.0)
    await register(api, "h2", 0.0)
    job = await queue_job(api, seeded, ALPHA, gpu_count=2)
    await bind(seeded, job, "h2", [0, 1])
    fleet = (await api.get("/v1/fleet", headers=BETA)).json()
    leaf = fleet["domains"]["leaf"]["l1"]
    assert (leaf["total"], leaf["used"], leaf["free"], leaf["stranded"], leaf["whole_nodes_free"]) == (16, 2, 14, 6, 1)
    assert leaf["fragmentation"] == round(6 / 14, 4)
    assert fleet["domains"]["leaf"]["l2"]["free"] == 0  # g1 has no agent
    assert fleet["gpu_types"]["H100-80GB"]["used"] == 2


async def test_a_tenant_sees_only_its_own_quota_usage_and_waiting_jobs(api: httpx.AsyncClient, seeded: Database) -> None:
    waiting = await queue_job(api, seeded, BETA, checkpoint_dir="/ckpt/beta/x")
    assert [t["name"] for t in (await api.get("/v1/tenants", headers=ADMIN)).json()] == ["alpha", "beta"]
    mine = (await api.get("/v1/tenants", headers=BETA)).json()
    assert [t["name"] for t in mine] == ["beta"]
    assert mine[0]["waiting_jobs"] == [waiting] and mine[0]["quotas"]["H100-80GB"]["guaranteed"] == 8
    assert (await api.get("/v1/tenants/beta", headers=ALPHA)).status_code == 404
    assert (await api.get("/v1/tenants/beta", headers=BETA)).json()["cohort"] == "research"


async def test_queue_estimates_start_when_the_running_jobs_are_expected_to_end(api: httpx.AsyncClient, seeded: Database) -> None:
    await register(api, "h1", 0.0)
    await register(api, "h2", 0.0)
    now = time.time()
    # alpha's "short" job has taken 10 minutes three times before (limit: 1 h): its running copy on h1 should end 10
    # minutes after it started. The predictor's errors: 600/3600 (nothing known yet), then 1 and 1.
    for i in range(3):
        done = await queue_job(api, seeded, ALPHA, name="short", idempotency_key=f"before-{i}")
        await jobs.record_transition(seeded, job_id=done, attempt=1, state=JobState.RUNNING, event_key="run", now=now - 2000 + i)
        await jobs.record_transition(
            seeded, job_id=done, attempt=1, state=JobState.SUCCEEDED, event_key="end", exit_code=0, now=now - 1400 + i
        )
    short = await queue_job(api, seeded, ALPHA, name="short", idempotency_key="again", gpu_count=8)
    await bind(seeded, short, "h1", list(range(8)))
    long = await queue_job(api, seeded, ALPHA, name="long", gpu_count=8)
    await bind(seeded, long, "h2", list(range(8)))
    waiting = await queue_job(api, seeded, BETA, name="next", checkpoint_dir="/ckpt/beta/next", gpu_count=8)

    queue = (await api.get("/v1/queue", headers=BETA)).json()
    assert [(e["position"], e["job"]["id"]) for e in queue] == [(1, waiting)]
    eta = queue[0]["estimated_start"]
    assert eta is not None and now + 600 - 5 <= eta <= now + 600 + 60, eta - now
    # The interval: the p10 of the errors is 1/6 + 0.2 * 5/6 = 1/3 of the 10 minutes; the p90 is 1.
    low, high = queue[0]["estimated_start_low"], queue[0]["estimated_start_high"]
    assert low is not None and now + 200 - 5 <= low <= now + 200 + 125, low - now
    assert high is not None and eta <= high <= now + 600 + 125, high - now
    detail = (await api.get(f"/v1/jobs/{waiting}", headers=BETA)).json()
    assert detail["queue_position"] == 1 and detail["estimated_start"] == eta
    # The same view (to the second: a bound's forward simulation scales run times from its own clock).
    assert (detail["estimated_start_low"], detail["estimated_start_high"]) == pytest.approx((low, high), abs=1.0)


async def test_recent_events_show_requeues_to_their_tenant_only(api: httpx.AsyncClient, seeded: Database) -> None:
    await register(api, "h1", 0.0)
    job = await queue_job(api, seeded, ALPHA, name="moved", gpu_count=2)
    await bind(seeded, job, "h1", [0, 1])
    await jobs.requeue_job(seeded, job_id=job, from_attempt=1, reason="preempted: reclaim: its GPUs go to j-x")
    events = (await api.get("/v1/events/recent", params={"kinds": "REQUEUED"}, headers=ALPHA)).json()
    assert [(e["job_id"], e["kind"], e["tenant"], e["name"]) for e in events] == [(job, "REQUEUED", "alpha", "moved")]
    assert events[0]["message"].startswith("preempted: reclaim") and events[0]["temporal_url"].endswith(f"/workflows/{job}")
    assert (await api.get("/v1/events/recent", params={"kinds": "REQUEUED"}, headers=BETA)).json() == []
    assert (await api.get("/v1/events/recent", params={"kinds": " , "}, headers=ADMIN)).status_code == 422
    assert (await api.get("/v1/events/recent", headers=NODE)).status_code == 403


async def test_the_dashboard_is_served_with_the_temporal_ui_address(api: httpx.AsyncClient) -> None:
    page = await api.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'content="http://127.0.0.1:8233/namespaces/default/workflows/"' in page.text
    for table in ("fleet-types", "fleet-domains", "queue", "tenants", "jobs", "preemptions", "health-events"):
        assert f'id="{table}"' in page.text


async def test_an_elastic_jobs_size_range_and_resizes_are_shown(api: httpx.AsyncClient, seeded: Database) -> None:
    await register(api, "h1", 0.0)
    await register(api, "h2", 0.0)
    job_id = await queue_job(api, seeded, ALPHA, name="elastic", gpu_count={"min": 8, "max": 16})
    await bind(seeded, job_id, "h1", list(range(8)))
    shown = (await api.get(f"/v1/jobs/{job_id}", headers=ALPHA)).json()
    assert (shown["gpu_count"], shown["gpu_max"], shown["gpus_now"]) == (8, 16, 8)
    [alloc] = await jobs.job_allocations(seeded, job_id)
    grown = [PlacedMember(node_id="h1", gpu_indices=list(range(8)), rank=0), PlacedMember(node_id="h2", gpu_indices=list(range(8)), rank=1)]
    new = await placement.resize_allocation(seeded, job_id=job_id, attempt=1, allocation_id=alloc.id, members=grown, reason="idle")
    await placement.resize_allocation(seeded, job_id=job_id, attempt=1, allocation_id=new.id, members=grown[:1], reason="waiting_job")
    shown = (await api.get(f"/v1/jobs/{job_id}", headers=ALPHA)).json()
    assert shown["gpus_now"] == 8 and shown["allocation"]["id"] != new.id and len(shown["allocations"]) == 3
    resized = [e for e in shown["events"] if e["kind"] == "RESIZED"]
    assert [(e["data"]["from_gpus"], e["data"]["to_gpus"]) for e in resized] == [(8, 16), (16, 8)]
    values = scrape((await api.get("/metrics")).text)
    assert metric(values, "fairgang_resizes_total", direction="grow", reason="idle") == 1
    assert metric(values, "fairgang_resizes_total", direction="shrink", reason="waiting_job") == 1
    listed = (await api.get("/v1/jobs", headers=ALPHA)).json()
    assert [(j["gpu_count"], j["gpu_max"]) for j in listed if j["id"] == job_id] == [(8, 16)]
