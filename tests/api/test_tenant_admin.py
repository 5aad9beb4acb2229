"""Quota administration, live and audited (both backends): an admin changes a tenant's policy through the API, the
next submission and the next scheduling cycle use it without a restart, a bad change is refused with its field
named and changes nothing, and every change (tenants, tokens, node enrolments) is in the append-only audit log."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text

from scheduler.snapshot import SnapshotReader
from store import tenants
from store.db import Database
from tests.api.test_api import ADMIN, ALPHA
from tests.api.test_tokens import ALPHA_ADMIN
from tests.builders import spec_dict
from tests.scheduler.test_snapshot_incremental import CONFIG, STALE


async def audit_of(api: httpx.AsyncClient, target: str, action: str | None = None) -> list[dict[str, Any]]:
    resp = await api.get("/v1/audit", params={"target": target}, headers=ADMIN)
    assert resp.status_code == 200, resp.text
    return [e for e in resp.json() if action is None or e["action"] == action]


async def test_an_admin_changes_a_tenants_policy_and_the_next_submission_uses_it(api: httpx.AsyncClient) -> None:
    assert (await api.post("/v1/jobs", json=spec_dict(name="wide", gpu_count=8), headers=ALPHA)).status_code == 201
    change = {"weight": 3, "max_gpus_per_job": 4, "quotas": {"H100-80GB": {"nominal": 6, "borrow_limit": 2}, "L40S": None}}
    resp = await api.patch("/v1/tenants/alpha", json=change, headers=ADMIN)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["before"]["weight"], body["after"]["weight"]) == (1.0, 3.0)
    assert body["after"]["quotas"] == {"H100-80GB": {"nominal": 6, "borrow_limit": 2, "lend_limit": None}}
    assert body["after"]["max_gpus_per_job"] == 4 and body["after"]["max_runtime_s"] == body["before"]["max_runtime_s"]
    # At once: the tenant may no longer submit 8 GPUs, nor use L40S.
    wide = await api.post("/v1/jobs", json=spec_dict(name="wide-2", gpu_count=8), headers=ALPHA)
    assert wide.status_code == 422 and "limit of 4 GPUs per job" in wide.text, wide.text
    l40s = await api.post("/v1/jobs", json=spec_dict(name="l40s", gpu_type="L40S"), headers=ALPHA)
    assert l40s.status_code == 422 and "gpu_type" in l40s.text
    # Recorded: who, when, before, after.
    [event] = await audit_of(api, "tenant:alpha", "tenant.update")
    assert event["actor"].startswith("admin:platform#") and event["at"] > 0
    assert event["before"] == body["before"] and event["after"] == body["after"]
    # A repeat changes nothing and records nothing.
    assert (await api.patch("/v1/tenants/alpha", json={"weight": 3}, headers=ADMIN)).status_code == 200
    assert len(await audit_of(api, "tenant:alpha", "tenant.update")) == 1
    # The seeding that made the tenant is on record too.
    [made] = await audit_of(api, "tenant:alpha", "tenant.create")
    assert made["actor"] == "seed" and made["before"] is None and made["after"]["weight"] == 1.0


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"quotas": {"TPU-v5": {"nominal": 4}}}, "quotas.TPU-v5", "unknown GPU type 'TPU-v5'"),
        ({"quotas": {"H100-80GB": {"nominal": -1}}}, "nominal", "greater than or equal to 0"),
        ({"weight": -2}, "weight", "greater than 0"),
        ({"max_runtime": "forever"}, "max_runtime", ""),
        ({"checkpoint_prefix": "/ckpt/beta/mine"}, "checkpoint_prefix", "lies within tenant 'beta'"),
        ({"checkpoint_prefix": "/ckpt"}, "checkpoint_prefix", "lies within tenant 'alpha'"),
        ({"colour": "blue"}, "colour", ""),
    ],
)
async def test_a_bad_change_is_refused_naming_the_field_and_changes_nothing(
    api: httpx.AsyncClient, seeded: Database, change: dict[str, Any], field: str, reason: str
) -> None:
    before = tenants.policy_of(await tenants.get_tenant(seeded, "alpha"))  # type: ignore[arg-type]
    resp = await api.patch("/v1/tenants/alpha", json={**change, "weight": change.get("weight", 5)}, headers=ADMIN)
    assert resp.status_code == 422 and field in resp.text and reason in resp.text, resp.text
    assert tenants.policy_of(await tenants.get_tenant(seeded, "alpha")) == before  # type: ignore[arg-type]
    assert await audit_of(api, "tenant:alpha", "tenant.update") == []


async def test_only_a_platform_admin_changes_tenants_or_reads_the_audit_log(api: httpx.AsyncClient) -> None:
    for who in (ALPHA, ALPHA_ADMIN):
        assert (await api.patch("/v1/tenants/alpha", json={"weight": 9}, headers=who)).status_code == 403
        assert (await api.get("/v1/audit", headers=who)).status_code == 403
    assert (await api.patch("/v1/tenants/nobody", json={"weight": 9}, headers=ADMIN)).status_code == 404


async def test_a_cohort_whose_guarantees_exceed_the_fleet_is_reported(api: httpx.AsyncClient) -> None:
    # alpha and beta share cohort 'research'; the fleet has 16 H100s.
    resp = await api.patch("/v1/tenants/alpha", json={"quotas": {"H100-80GB": {"nominal": 12}}}, headers=ADMIN)
    assert resp.status_code == 200 and resp.json()["warnings"] == ["cohort research: 20 H100-80GB GPUs guaranteed, the fleet has 16"]
    calm = await api.patch("/v1/tenants/alpha", json={"quotas": {"H100-80GB": {"nominal": 8}}}, headers=ADMIN)
    assert calm.json()["warnings"] == []


async def test_tokens_and_node_enrolments_are_audited_too(api: httpx.AsyncClient) -> None:
    made = (await api.post("/v1/tokens", json={"name": "ci"}, headers=ALPHA_ADMIN)).json()["info"]
    await api.delete(f"/v1/tokens/{made['id']}", headers=ALPHA_ADMIN)
    created, revoked = reversed(await audit_of(api, f"token:{made['id']}"))
    assert (created["action"], created["before"], created["after"]["name"]) == ("token.create", None, "ci")
    assert (
        revoked["action"] == "token.revoke"
        and revoked["after"]["revoked_at"] is not None
        and revoked["actor"].startswith("tenant_admin:alpha#")
    )
    enrol = await api.post("/v1/nodes", json={"node_id": "n9", "gpu_type": "L40S", "gpu_count": 2}, headers=ADMIN)
    assert enrol.status_code == 201, enrol.text
    [event] = await audit_of(api, "node:n9")
    assert event["action"] == "node.enrol" and event["after"] == {"gpu_type": "L40S", "gpu_count": 2, "labels": {}}
    # The log pages back from the newest.
    newest = (await api.get("/v1/audit", params={"limit": 1}, headers=ADMIN)).json()
    older = (await api.get("/v1/audit", params={"limit": 1, "before_id": newest[0]["id"]}, headers=ADMIN)).json()
    assert newest[0]["target"] == "node:n9" and older[0]["id"] < newest[0]["id"]


async def test_the_audit_log_is_append_only(seeded: Database) -> None:
    await tenants.update_tenant(seeded, "alpha", {"weight": 2.0}, actor="test")
    for statement in ("UPDATE audit_event SET actor = 'someone else'", "DELETE FROM audit_event"):
        with pytest.raises(Exception, match="append-only"):
            async with seeded.transaction() as session:
                await session.execute(text(statement))


async def test_the_next_scheduling_cycle_reads_the_change_without_a_restart(seeded: Database) -> None:
    reader = SnapshotReader()
    first = await reader.read(seeded, now=1000.0, stale_after_s=STALE, config=CONFIG)
    assert {t.name: t.weight for t in first.tenants}["alpha"] == 1.0
    await tenants.update_tenant(seeded, "alpha", {"weight": 4.0, "quotas": {"H100-80GB": {"nominal": 2}}}, actor="test")
    second = await reader.read(seeded, now=1001.0, stale_after_s=STALE, config=CONFIG)
    alpha = next(t for t in second.tenants if t.name == "alpha")
    assert alpha.weight == 4.0 and {k: q.nominal for k, q in alpha.quotas} == {"H100-80GB": 2}


async def test_a_tenants_allowed_images_bound_its_jobs_from_the_next_submission(api: httpx.AsyncClient) -> None:
    assert (await api.post("/v1/jobs", json=spec_dict(name="any", image="busybox:1"), headers=ALPHA)).status_code == 201
    resp = await api.patch("/v1/tenants/alpha", json={"allowed_images": ["registry.example/ml/*", "local"]}, headers=ADMIN)
    assert resp.status_code == 200 and resp.json()["after"]["allowed_images"] == ["registry.example/ml/*", "local"]
    refused = await api.post("/v1/jobs", json=spec_dict(name="other", image="busybox:1"), headers=ALPHA)
    assert refused.status_code == 422, refused.text
    assert {p["field"]: p["reason"] for p in refused.json()["problems"]} == {
        "image": "'busybox:1' is not among tenant 'alpha' allowed images (registry.example/ml/*, local)"
    }
    for image in ("registry.example/ml/train:2", "local"):
        assert (await api.post("/v1/jobs", json=spec_dict(name=f"ok-{len(image)}", image=image), headers=ALPHA)).status_code == 201
    # Null: any image again.
    assert (await api.patch("/v1/tenants/alpha", json={"allowed_images": None}, headers=ADMIN)).json()["after"]["allowed_images"] is None
    assert (await api.post("/v1/jobs", json=spec_dict(name="other", image="busybox:1"), headers=ALPHA)).status_code == 201
