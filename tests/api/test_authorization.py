"""Every route of the app, tried as every kind of caller: anonymous, the owning tenant (a member, and its tenant
admin), another tenant, a platform admin, the node a request speaks for, and another node. Each route has a rule here; a route without one
(a new route) fails the test, and so does any caller let through, or refused, against its route's rule.

Refused means 401 or 403, or 404 for another tenant's resource (as if it did not exist); let through means
anything else but a server error. Temporal runs for real (sweeps and schedules live there).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from api.app import create_app
from cli.platform import temporal_binary
from fairgang.cluster import node_credential
from fairgang.settings import SEARCH_ATTRIBUTES, Settings
from store.db import Database
from tests.builders import spec_dict

ANON, OWNER, OTHER, ADMIN, NODE, OTHER_NODE = "anonymous", "owner", "other tenant", "admin", "its node", "other node"
OWNER_ADMIN = "owner's tenant admin"
CALLERS = (ANON, OWNER, OWNER_ADMIN, OTHER, ADMIN, NODE, OTHER_NODE)
TOKENS = {
    OWNER: "alpha-token",
    OWNER_ADMIN: "alpha-admin-token",
    OTHER: "beta-token",
    ADMIN: "admin-token",
    NODE: node_credential("node-token", "h1"),
    OTHER_NODE: node_credential("node-token", "h2"),
}
EVERYONE = frozenset(CALLERS)
USERS = frozenset({OWNER, OWNER_ADMIN, OTHER, ADMIN})
AUTHENTICATED = EVERYONE - {ANON}
OWNER_AND_ADMIN = frozenset({OWNER, OWNER_ADMIN, ADMIN})
TOKEN_ADMINS = frozenset({OWNER_ADMIN, ADMIN})

#: (method, path template) -> who may call it. Path parameters name the owner's job, sweep, schedule, tenant
#: and node h1 (the node NODE speaks for).
RULES: dict[tuple[str, str], frozenset[str]] = {
    ("GET", "/openapi.json"): EVERYONE,
    ("GET", "/docs"): EVERYONE,
    ("GET", "/docs/oauth2-redirect"): EVERYONE,
    ("GET", "/redoc"): EVERYONE,
    ("GET", "/healthz"): EVERYONE,
    ("GET", "/metrics"): EVERYONE,
    ("GET", "/dashboard"): EVERYONE,
    ("GET", "/v1/health/events"): AUTHENTICATED,
    ("GET", "/v1/fleet"): AUTHENTICATED,
    ("GET", "/v1/rollup"): USERS,
    ("GET", "/v1/whoami"): AUTHENTICATED,
    ("POST", "/v1/jobs"): USERS,
    ("GET", "/v1/jobs"): USERS,
    ("GET", "/v1/usage"): USERS,
    ("GET", "/v1/jobs/{job_id}"): OWNER_AND_ADMIN,
    ("PATCH", "/v1/jobs/{job_id}"): OWNER_AND_ADMIN,
    ("POST", "/v1/jobs/{job_id}/hold"): OWNER_AND_ADMIN,
    ("POST", "/v1/jobs/{job_id}/release"): OWNER_AND_ADMIN,
    ("GET", "/v1/jobs/{job_id}/logs"): OWNER_AND_ADMIN,
    ("POST", "/v1/jobs/{job_id}/preempt"): OWNER_AND_ADMIN,
    ("POST", "/v1/jobs/{job_id}/cancel"): OWNER_AND_ADMIN,
    ("GET", "/v1/queue"): USERS,
    ("GET", "/v1/eta-accuracy"): USERS,
    ("GET", "/v1/events/recent"): USERS,
    ("GET", "/v1/tenants"): USERS,
    ("GET", "/v1/tenants/{name}"): OWNER_AND_ADMIN,
    ("PATCH", "/v1/tenants/{name}"): frozenset({ADMIN}),
    ("GET", "/v1/audit"): frozenset({ADMIN}),
    ("POST", "/v1/admin/whatif"): frozenset({ADMIN}),
    ("POST", "/v1/sweeps"): USERS,
    ("GET", "/v1/sweeps"): USERS,
    ("GET", "/v1/sweeps/{sweep_id}"): OWNER_AND_ADMIN,
    ("POST", "/v1/sweeps/{sweep_id}/cancel"): OWNER_AND_ADMIN,
    ("POST", "/v1/schedules"): USERS,
    ("GET", "/v1/schedules"): USERS,
    ("GET", "/v1/schedules/{schedule_id}"): OWNER_AND_ADMIN,
    ("POST", "/v1/schedules/{schedule_id}/pause"): OWNER_AND_ADMIN,
    ("POST", "/v1/schedules/{schedule_id}/resume"): OWNER_AND_ADMIN,
    ("POST", "/v1/schedules/{schedule_id}/trigger"): OWNER_AND_ADMIN,
    ("POST", "/v1/schedules/{schedule_id}/backfill"): OWNER_AND_ADMIN,
    ("DELETE", "/v1/schedules/{schedule_id}"): OWNER_AND_ADMIN,
    ("POST", "/v1/tokens"): TOKEN_ADMINS,
    ("GET", "/v1/tokens"): TOKEN_ADMINS,
    ("DELETE", "/v1/tokens/{token_id}"): TOKEN_ADMINS,
    ("POST", "/v1/nodes"): frozenset({ADMIN}),
    ("POST", "/v1/nodes/register"): frozenset({NODE}),
    ("POST", "/v1/nodes/{node_id}/heartbeat"): frozenset({NODE}),
    ("POST", "/v1/nodes/{node_id}/checkpoints"): frozenset({NODE}),
    ("POST", "/v1/nodes/{node_id}/cordon"): frozenset({ADMIN}),
    ("POST", "/v1/nodes/{node_id}/uncordon"): frozenset({ADMIN}),
    ("POST", "/v1/nodes/{node_id}/drain"): frozenset({ADMIN}),
    ("POST", "/v1/nodes/{node_id}/retire"): frozenset({ADMIN}),
    ("POST", "/v1/nodes/{node_id}/gpus/{index}/return"): frozenset({ADMIN}),
    ("POST", "/v1/nodes/{node_id}/gpus/{index}/faults"): frozenset({ADMIN}),
}
#: Routes of another tenant's resource: a refusal may be 404.
OWNED = ("{job_id}", "{sweep_id}", "{schedule_id}", "{token_id}")


def app_routes(app: Any) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves, included routers too."""
    found: set[tuple[str, str]] = set()

    def walk(routes: list[Any]) -> None:
        for route in routes:
            if hasattr(route, "methods") and hasattr(route, "path"):
                found.update((m, route.path) for m in route.methods - {"HEAD"})
            elif hasattr(route, "original_router"):
                walk(route.original_router.routes)

    walk(app.routes)
    return found


def _sweep(name: str) -> dict[str, Any]:
    template = {k: v for k, v in spec_dict(checkpoint_dir="/ckpt/alpha/sw").items() if k != "name"}
    template["entrypoint"] = ["python3", "-c", "print({{lr}})"]
    return {"name": name, "parameters": {"grid": {"lr": [1, 2]}}, "template": template}


def _body(method: str, path: str, names: dict[str, str]) -> dict[str, Any] | None:
    """A plausible body for the route (what a legitimate caller would send)."""
    if method == "PATCH":
        return {"priority_class": "low"} if path == "/v1/jobs/{job_id}" else {"weight": 1}
    if method != "POST":
        return None
    bodies: dict[str, dict[str, Any]] = {
        "/v1/jobs": spec_dict(name=f"j-{uuid.uuid4().hex[:6]}"),
        "/v1/sweeps": _sweep(f"s-{uuid.uuid4().hex[:6]}"),
        "/v1/schedules": {"name": f"sc-{uuid.uuid4().hex[:6]}", "schedule": {"interval": "1h"}, "paused": True, "sweep": _sweep("nightly")},
        "/v1/nodes": {"node_id": f"n-{uuid.uuid4().hex[:6]}", "gpu_type": "L40S", "gpu_count": 2},
        "/v1/tokens": {"name": "made", "tenant": "alpha"},
        "/v1/nodes/register": {"node_id": "h1", "gpu_type": "H100-80GB", "gpu_count": 8, "boot_id": "b1"},
        "/v1/nodes/{node_id}/heartbeat": {"boot_id": "b1"},
        "/v1/nodes/{node_id}/checkpoints": {"allocation_id": "a-none", "path": "/ckpt/alpha/x", "seq": 1},
        "/v1/nodes/{node_id}/gpus/{index}/faults": {"kind": "thermal"},
        "/v1/schedules/{schedule_id}/backfill": {"start": 1767225600, "end": 1767229200},
    }
    return bodies.get(path, {})


@pytest.fixture
def backend() -> str:
    """The rules do not depend on the store: SQLite only."""
    return "sqlite"


@pytest.fixture(scope="module")
async def temporal() -> AsyncIterator[WorkflowEnvironment]:
    """One Temporal dev server for the whole module (each caller's test makes resources of its own)."""
    search = [SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTES]
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(), search_attributes=search)
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
async def platform(seeded: Database, db_url: str, tmp_path: Path, temporal: WorkflowEnvironment) -> AsyncIterator[httpx.AsyncClient]:
    address = temporal.client.service_client.config.target_host
    settings = Settings(database_url=db_url, temporal_address=address, log_dir=tmp_path / "logs", auth_failures_per_minute=0)
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://api", timeout=60) as client:
        client.app = app  # type: ignore[attr-defined]
        yield client


async def _owned(api: httpx.AsyncClient) -> dict[str, str]:
    """The owner's job, sweep and schedule, and the names the path templates take."""
    alpha = {"Authorization": f"Bearer {TOKENS[OWNER]}"}
    job = await api.post("/v1/jobs", json=spec_dict(name=f"owned-{uuid.uuid4().hex[:6]}"), headers=alpha)
    sweep = await api.post("/v1/sweeps", json=_sweep(f"owned-{uuid.uuid4().hex[:6]}"), headers=alpha)
    schedule = await api.post("/v1/schedules", json=_body("POST", "/v1/schedules", {}), headers=alpha)
    token = await api.post("/v1/tokens", json={"name": "owned", "tenant": "alpha"}, headers={"Authorization": f"Bearer {TOKENS[ADMIN]}"})
    for resp in (job, sweep, schedule, token):
        assert resp.status_code == 201, resp.text
    return {
        "{job_id}": job.json()["job"]["id"],
        "{sweep_id}": sweep.json()["sweep"]["id"],
        "{schedule_id}": schedule.json()["id"],
        "{token_id}": str(token.json()["info"]["id"]),
        "{name}": "alpha",
        "{node_id}": "h1",
        "{index}": "0",
    }


def _order(route: tuple[str, str]) -> tuple[int, str, str]:
    """Reads first, then changes, then what ends a resource (cancel, delete)."""
    method, path = route
    last = path.endswith("/cancel") or method == "DELETE" or path.endswith(("/preempt", "/drain", "/retire"))
    return (2 if last else 0 if method == "GET" else 1, path, method)


def test_every_route_of_the_app_has_a_rule() -> None:
    app = create_app(Settings(database_url="sqlite+aiosqlite:///:memory:"))
    routes = app_routes(app)
    assert routes - set(RULES) == set(), f"routes without an authorization rule in this test: {sorted(routes - set(RULES))}"
    assert set(RULES) - routes == set(), f"rules for routes the app does not serve: {sorted(set(RULES) - routes)}"


@pytest.mark.parametrize("caller", CALLERS)
async def test_each_route_lets_through_exactly_the_callers_its_rule_names(platform: httpx.AsyncClient, caller: str) -> None:
    names = await _owned(platform)
    headers = {"Authorization": f"Bearer {TOKENS[caller]}"} if caller in TOKENS else {}
    wrong: list[str] = []
    for method, template in sorted(RULES, key=_order):
        path = template
        for key, value in names.items():
            path = path.replace(key, value)
        resp = await platform.request(method, path, json=_body(method, template, names), headers=headers)
        owned = any(key in template for key in OWNED) or template == "/v1/tenants/{name}"
        refused = resp.status_code in (401, 403) or (owned and resp.status_code == 404)
        allowed = caller in RULES[(method, template)]
        if resp.status_code >= 500 and resp.status_code != 503:
            wrong.append(f"{method} {template}: {resp.status_code} {resp.text[:200]}")
        elif allowed == refused:
            verdict = "refused" if refused else "let through"
            wrong.append(f"{method} {template}: {verdict} ({resp.status_code} {resp.text[:160]})")
    assert not wrong, f"as {caller}:\n" + "\n".join(wrong)
