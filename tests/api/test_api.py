"""The API in-process over a real store (both backends), Temporal unreachable.

With Temporal down the API still admits and stores jobs (the placement service's
reconciler starts their workflows later), so these tests cover the API's own rules.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from fairgang.cluster import node_credential
from fairgang.members import PlacedMember
from fairgang.settings import Settings
from fairgang.spec import JobState
from store import jobs, placement
from store.db import Database
from tests.builders import spec_dict


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


ALPHA, BETA, ADMIN = auth("alpha-token"), auth("beta-token"), auth("admin-token")
#: Node h1's own credential (seeding derives it from the cluster's node secret).
NODE = auth(node_credential("node-token", "h1"))


async def test_openapi_and_health(api: httpx.AsyncClient) -> None:
    paths = (await api.get("/openapi.json")).json()["paths"]
    for path in ["/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/logs", "/v1/jobs/{job_id}/cancel", "/v1/fleet", "/v1/queue"]:
        assert path in paths
    health = (await api.get("/healthz")).json()
    assert health["store"] == "ok" and health["temporal"] == "unreachable"


async def test_unknown_or_missing_token_is_refused(api: httpx.AsyncClient) -> None:
    assert (await api.get("/v1/jobs", headers=auth("forged"))).status_code == 401
    assert (await api.get("/v1/jobs")).status_code == 401
    assert (await api.post("/v1/jobs", json=spec_dict(), headers=auth("forged"))).status_code == 401


async def test_submit_stores_a_queued_job_and_repeats_are_idempotent(api: httpx.AsyncClient, seeded: Database) -> None:
    first = await api.post("/v1/jobs", json=spec_dict(idempotency_key="abc"), headers=ALPHA)
    assert first.status_code == 201, first.text
    job = first.json()["job"]
    assert job["state"] == "QUEUED" and job["tenant"] == "alpha" and first.json()["created"]
    again = await api.post("/v1/jobs", json=spec_dict(idempotency_key="abc"), headers=ALPHA)
    assert again.status_code == 200 and again.json()["job"]["id"] == job["id"] and not again.json()["created"]
    by_name = await api.post("/v1/jobs", json=spec_dict(name="by-name"), headers=ALPHA)
    by_name_again = await api.post("/v1/jobs", json=spec_dict(name="by-name"), headers=ALPHA)
    assert by_name.json()["job"]["id"] == by_name_again.json()["job"]["id"]
    assert len(await jobs.list_jobs(seeded)) == 2


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"gpu_type": "TPU"}, "gpu_type"),
        ({"gpu_count": 12}, "gpu_count"),
        ({"max_runtime": "48h"}, "max_runtime"),
        ({"checkpoint_dir": "/elsewhere/x"}, "checkpoint_dir"),
        ({"entrypoint": "python train.py"}, "entrypoint"),
        ({"surprise": 1}, "surprise"),
        ({"tenant": "ghost"}, "tenant"),
    ],
)
async def test_invalid_spec_is_refused_with_its_field_and_nothing_is_stored(
    api: httpx.AsyncClient, seeded: Database, overrides: dict, field: str
) -> None:
    resp = await api.post("/v1/jobs", json=spec_dict(**overrides), headers=ADMIN if "tenant" in overrides else ALPHA)
    assert resp.status_code in (403, 422), resp.text
    problems = resp.json()["problems"]
    assert field in [p["field"] for p in problems], problems
    assert await jobs.list_jobs(seeded) == []


async def test_tenant_cannot_submit_for_another_tenant(api: httpx.AsyncClient, seeded: Database) -> None:
    resp = await api.post("/v1/jobs", json=spec_dict(tenant="beta"), headers=ALPHA)
    assert resp.status_code == 403
    assert resp.json()["problems"][0]["field"] == "tenant"
    assert await jobs.list_jobs(seeded) == []


async def test_tenant_sees_and_acts_on_its_own_jobs_only(api: httpx.AsyncClient) -> None:
    mine = (await api.post("/v1/jobs", json=spec_dict(name="mine", checkpoint_dir="/ckpt/beta/mine"), headers=BETA)).json()["job"]
    assert (await api.get(f"/v1/jobs/{mine['id']}", headers=ALPHA)).status_code == 404
    assert (await api.get(f"/v1/jobs/{mine['id']}/logs", headers=ALPHA)).status_code == 404
    assert (await api.post(f"/v1/jobs/{mine['id']}/cancel", headers=ALPHA)).status_code == 404
    assert (await api.post(f"/v1/jobs/{mine['id']}/preempt", headers=ALPHA)).status_code == 404
    assert (await api.get("/v1/jobs", headers=ALPHA)).json() == []
    assert (await api.get("/v1/jobs", params={"tenant": "beta"}, headers=ALPHA)).status_code == 403
    assert [j["id"] for j in (await api.get("/v1/jobs", headers=BETA)).json()] == [mine["id"]]
    assert [j["id"] for j in (await api.get("/v1/jobs", params={"tenant": "beta"}, headers=ADMIN)).json()] == [mine["id"]]
    assert (await api.get(f"/v1/jobs/{mine['id']}", headers=BETA)).json()["state"] == "QUEUED"
    assert (await api.get("/v1/queue", headers=ALPHA)).json() == []


async def test_nodes_cannot_use_tenant_endpoints_and_tenants_cannot_heartbeat(api: httpx.AsyncClient) -> None:
    assert (await api.get("/v1/jobs", headers=NODE)).status_code == 403
    body = {"node_id": "h1", "gpu_type": "H100-80GB", "gpu_count": 8, "boot_id": "b1"}
    assert (await api.post("/v1/nodes/register", json=body, headers=ALPHA)).status_code == 403
    assert (await api.post("/v1/nodes/register", json=body, headers=NODE)).json()["accepted"]


async def test_cancel_of_a_job_whose_workflow_never_started_ends_it(api: httpx.AsyncClient, seeded: Database) -> None:
    job = (await api.post("/v1/jobs", json=spec_dict(), headers=ALPHA)).json()["job"]
    await api.post(f"/v1/jobs/{job['id']}/cancel", headers=ALPHA)
    detail = (await api.get(f"/v1/jobs/{job['id']}", headers=ALPHA)).json()
    assert detail["state"] == "CANCELLED"
    assert [e["kind"] for e in detail["events"]] == ["SUBMITTED", "CANCELLED"]


async def test_list_filters_by_state_and_rejects_unknown_states(api: httpx.AsyncClient) -> None:
    await api.post("/v1/jobs", json=spec_dict(name="a"), headers=ALPHA)
    assert len((await api.get("/v1/jobs", params={"state": "QUEUED"}, headers=ALPHA)).json()) == 1
    assert (await api.get("/v1/jobs", params={"state": "RUNNING"}, headers=ALPHA)).json() == []
    assert (await api.get("/v1/jobs", params={"state": "NAPPING"}, headers=ALPHA)).status_code == 422


async def test_fleet_lists_nodes_and_gpu_totals(api: httpx.AsyncClient) -> None:
    fleet = (await api.get("/v1/fleet", headers=ALPHA)).json()
    assert fleet["gpu_types"]["H100-80GB"]["total"] == 16
    assert {n["id"] for n in fleet["nodes"]} == {"h1", "h2", "g1"}
    assert not any(n["schedulable"] for n in fleet["nodes"])  # no agent has registered


async def test_queue_lists_jobs_in_fair_order_with_their_reasons(api: httpx.AsyncClient, seeded: Database) -> None:
    ids = {}
    for token, tenant, name in (("alpha-token", "alpha", "a1"), ("alpha-token", "alpha", "a2"), ("beta-token", "beta", "b1")):
        job = (await api.post("/v1/jobs", json=spec_dict(name=name, checkpoint_dir=f"/ckpt/{tenant}/x"), headers=auth(token))).json()["job"]
        await jobs.mark_queued(seeded, job_id=job["id"], attempt=1)
        ids[name] = job["id"]
    everyone = (await api.get("/v1/queue", headers=ADMIN)).json()
    assert [e["position"] for e in everyone] == [1, 2, 3]
    order = [e["job"]["name"] for e in everyone]
    # Fair share: with nothing running, tenants alternate (alpha's name sorts first), each tenant's jobs oldest first.
    assert order == ["a1", "b1", "a2"]
    assert all(e["job"]["pending_reason"] == "waiting for placement" and e["job"]["pending_code"] is None for e in everyone)
    mine = (await api.get("/v1/queue", headers=BETA)).json()
    assert [(e["position"], e["job"]["name"]) for e in mine] == [(2, "b1")]


async def test_a_job_shows_the_schedulers_pending_reason_with_its_code(api: httpx.AsyncClient, seeded: Database) -> None:
    job = (await api.post("/v1/jobs", json=spec_dict(name="waits", checkpoint_dir="/ckpt/alpha/x"), headers=ALPHA)).json()["job"]
    await jobs.mark_queued(seeded, job_id=job["id"], attempt=1)
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    await placement.commit_bindings(
        seeded,
        bindings=[],
        pending_reasons={job["id"]: "no H100-80GB node has 1 free GPUs"},
        pending_codes={job["id"]: "no_free_node"},
        lease_name="placement",
        epoch=epoch,
    )
    shown = (await api.get(f"/v1/jobs/{job['id']}", headers=ALPHA)).json()
    assert (shown["pending_reason"], shown["pending_code"]) == ("no H100-80GB node has 1 free GPUs", "no_free_node")


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        # beta's quotas name only H100-80GB: the fleet has L40S, but beta may not use it.
        ({"gpu_type": "L40S"}, "gpu_type", "tenant 'beta' may not use L40S"),
        # Two whole 8-GPU nodes on one leaf: a shape the fleet can hold, but over beta's limit of 8 per job.
        ({"gpu_count": 16, "topology": {"level": "leaf", "mode": "required"}}, "gpu_count", "limit of 8 GPUs per job"),
        ({"max_runtime": "3h"}, "max_runtime", "limit of 2h"),
    ],
)
async def test_tenant_policy_refusals_at_submit_name_the_field_and_store_nothing(
    api: httpx.AsyncClient, seeded: Database, overrides: dict, field: str, reason: str
) -> None:
    """Admission against the tenant's own policy, through the API: each refusal names its field and reason."""
    resp = await api.post("/v1/jobs", json=spec_dict(checkpoint_dir="/ckpt/beta/x", **overrides), headers=BETA)
    assert resp.status_code == 422, resp.text
    problems = resp.json()["problems"]
    assert [p["field"] for p in problems] == [field], problems
    assert reason in problems[0]["reason"], problems
    assert await jobs.list_jobs(seeded) == []
    # The same spec within beta's policy is admitted: the refusal was the policy, not the spec.
    within = {"gpu_type": "H100-80GB", "gpu_count": 8, "max_runtime": "1h"}
    ok = await api.post("/v1/jobs", json=spec_dict(checkpoint_dir="/ckpt/beta/x", **(overrides | {field: within[field]})), headers=BETA)
    assert ok.status_code == 201, ok.text


async def test_after_a_failed_connect_to_temporal_requests_do_not_each_try_again(seeded: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    from api import deps

    tries = 0

    async def unreachable(settings: Settings) -> Any:
        nonlocal tries
        tries += 1
        raise ConnectionError("temporal is down")

    monkeypatch.setattr(deps, "connect", unreachable)
    state = deps.AppState(settings=Settings(database_url=seeded.url), db=seeded)
    assert [await state.temporal() for _ in range(20)] == [None] * 20
    assert tries == 1
    monkeypatch.setattr(deps, "TEMPORAL_RETRY_S", 0.0)
    state._retry_at = 0.0
    assert await state.temporal() is None and tries == 2


async def test_every_error_is_one_problem_shape_and_every_route_declares_the_errors(api: httpx.AsyncClient) -> None:
    """RFC 9457 problem details for every error, whichever part answers it, and in the OpenAPI spec of every route."""
    from api.schemas import Problem

    answers = [
        await api.get("/v1/jobs"),  # no token
        await api.get("/v1/jobs", headers=auth("forged")),  # unknown token
        await api.post("/v1/nodes/h1/cordon", headers=ALPHA),  # a tenant on an admin's route
        await api.get("/v1/jobs/j-nope", headers=ALPHA),  # no such job
        await api.post("/v1/jobs", json=spec_dict(gpu_type="TPU"), headers=ALPHA),  # refused by admission
        await api.post("/v1/jobs", json={"name": 3}, headers=ALPHA),  # not a spec at all
        await api.get("/v1/audit", params={"limit": 0}, headers=ADMIN),  # a bad query
    ]
    assert [r.status_code for r in answers] == [401, 401, 403, 404, 422, 422, 422]
    for resp in answers:
        assert resp.headers["content-type"] == "application/problem+json", resp.text
        body = Problem.model_validate(resp.json())
        assert body.status == resp.status_code and body.title and body.detail
    assert {p.field for p in Problem.model_validate(answers[4].json()).problems or []} == {"gpu_type"}
    assert "name" in {p.field for p in Problem.model_validate(answers[5].json()).problems or []}
    spec = (await api.get("/openapi.json")).json()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            declared = operation["responses"]
            for code in ("401", "403", "404", "422", "429", "503"):
                schema = declared.get(code, {}).get("content", {}).get("application/problem+json", {}).get("schema")
                assert schema == {"$ref": "#/components/schemas/Problem"}, (method, path, code, declared.get(code))


async def test_cancel_of_an_ended_job_is_409_and_of_a_cancelled_one_answers_it_as_it_is(api: httpx.AsyncClient, seeded: Database) -> None:
    done = (await api.post("/v1/jobs", json=spec_dict(name="done"), headers=ALPHA)).json()["job"]
    await jobs.record_transition(seeded, job_id=done["id"], attempt=1, state=JobState.SUCCEEDED, event_key="end-1")
    refused = await api.post(f"/v1/jobs/{done['id']}/cancel", headers=ALPHA)
    assert refused.status_code == 409 and "already ended (SUCCEEDED)" in refused.json()["detail"]
    gone = (await api.post("/v1/jobs", json=spec_dict(name="gone"), headers=ALPHA)).json()["job"]
    assert (await api.post(f"/v1/jobs/{gone['id']}/cancel", headers=ALPHA)).json()["state"] == "CANCELLED"
    again = await api.post(f"/v1/jobs/{gone['id']}/cancel", headers=ALPHA)
    assert again.status_code == 200 and again.json()["state"] == "CANCELLED"


async def test_logs_of_an_attempt_or_rank_the_job_never_had_are_404(api: httpx.AsyncClient, seeded: Database) -> None:
    job = (await api.post("/v1/jobs", json=spec_dict(name="logged", gpu_count=16), headers=ALPHA)).json()["job"]
    # Not started yet: the current attempt's log is empty, not missing.
    assert (await api.get(f"/v1/jobs/{job['id']}/logs", headers=ALPHA)).text == ""
    no_attempt = await api.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": 2}, headers=ALPHA)
    assert no_attempt.status_code == 404 and "no attempt 2 (its latest is 1)" in no_attempt.json()["detail"]
    await jobs.mark_queued(seeded, job_id=job["id"], attempt=1)
    epoch = await placement.acquire_lease(seeded, name="placement", holder="test", ttl_s=60)
    assert epoch is not None
    members = [PlacedMember(node_id=n, gpu_indices=list(range(8)), rank=r) for r, n in enumerate(("h1", "h2"))]
    await placement.commit_bindings(
        seeded,
        bindings=[placement.BindingRow(job_id=job["id"], attempt=1, members=members)],
        pending_reasons={},
        lease_name="placement",
        epoch=epoch,
    )
    assert (await api.get(f"/v1/jobs/{job['id']}/logs", params={"rank": 1}, headers=ALPHA)).status_code == 200
    no_rank = await api.get(f"/v1/jobs/{job['id']}/logs", params={"rank": 2}, headers=ALPHA)
    assert no_rank.status_code == 404 and "has no rank 2 (ranks 0-1)" in no_rank.json()["detail"]
