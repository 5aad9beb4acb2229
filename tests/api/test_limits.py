"""The API's limits before any route: request body size (413 before reading or authenticating) and
throttled failed authentication (429 with Retry-After, per client address)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from api.app import create_app
from api.deps import AppState
from api.limits import AuthThrottle, SubmissionBuckets
from fairgang.settings import Settings
from store.db import Database
from store.models import Tenant
from tests.builders import spec_dict

LIMIT = 4096


@pytest.fixture
async def limited(seeded: Database, db_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        database_url=db_url, temporal_address="127.0.0.1:1", log_dir=tmp_path / "logs", api_max_body_bytes=LIMIT, auth_failures_per_minute=5
    )
    app = create_app(settings)
    app.state.fairgang = AppState(settings=settings, db=seeded)
    transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 4000))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_body_over_the_limit_is_refused_413_before_authentication(limited: httpx.AsyncClient, seeded: Database) -> None:
    big = spec_dict(name="big", env={"PAYLOAD": "x" * (2 * LIMIT)})
    for headers in ({}, _auth("no-such-token"), _auth("alpha-token")):
        resp = await limited.post("/v1/jobs", json=big, headers=headers)
        assert resp.status_code == 413, (headers, resp.status_code, resp.text)
        body = resp.json()
        assert resp.headers["content-type"] == "application/problem+json"
        assert body["status"] == 413 and body["title"] == "Request Entity Too Large" and str(LIMIT) in body["detail"]
    # Refused bodies cost no authentication failure, and stored nothing.
    assert (await limited.get("/v1/jobs", headers=_auth("alpha-token"))).json() == []
    # Under the limit the same route answers as usual.
    assert (await limited.post("/v1/jobs", json=spec_dict(name="small"), headers={})).status_code == 401
    assert (await limited.post("/v1/jobs", json=spec_dict(name="small"), headers=_auth("alpha-token"))).status_code == 201


async def test_a_chunked_body_is_cut_off_once_it_grows_past_the_limit(limited: httpx.AsyncClient) -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(1000):
            sent += 1024
            yield b" " * 1024

    resp = await limited.post("/v1/jobs", content=chunks(), headers=_auth("alpha-token") | {"Content-Type": "application/json"})
    assert resp.status_code == 413, resp.text
    assert "content-length" not in {k.lower() for k in resp.request.headers}


async def test_refused_tokens_are_throttled_per_client_and_valid_ones_never_count(limited: httpx.AsyncClient, seeded: Database) -> None:
    for _ in range(20):
        assert (await limited.get("/v1/jobs", headers=_auth("alpha-token"))).status_code == 200
    for _ in range(5):
        assert (await limited.get("/v1/jobs", headers=_auth("guess"))).status_code == 401
    resp = await limited.get("/v1/jobs", headers=_auth("guess"))
    assert resp.status_code == 429 and 1 <= int(resp.headers["Retry-After"]) <= 60, resp.text
    # Once throttled, even a valid token from that address waits (the token is not looked up).
    assert (await limited.get("/v1/jobs", headers=_auth("alpha-token"))).status_code == 429
    # Another address is not affected.
    app = limited._transport.app  # type: ignore[attr-defined]
    other = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.0.0.2", 4000)), base_url="http://api")
    async with other:
        assert (await other.get("/v1/jobs", headers=_auth("alpha-token"))).status_code == 200


def test_the_throttle_lets_a_client_try_again_once_its_oldest_failure_is_a_minute_old() -> None:
    now = [1000.0]
    throttle = AuthThrottle(3, clock=lambda: now[0])
    for step in (0.0, 10.0, 20.0):
        now[0] = 1000.0 + step
        assert throttle.retry_after("a") is None
        throttle.failed("a")
    assert throttle.retry_after("a") == 40  # the first failure (t=1000) leaves the window at t=1060
    assert throttle.retry_after("b") is None
    now[0] = 1060.0
    assert throttle.retry_after("a") is None
    throttle.failed("a")
    assert throttle.retry_after("a") == 10  # now the failure at t=1010 is the oldest of the last three
    assert AuthThrottle(0).retry_after("a") is None  # 0: no limit


async def test_a_tenant_over_its_submission_rate_is_answered_429_and_others_are_not(limited: httpx.AsyncClient, seeded: Database) -> None:
    async with seeded.transaction() as session:
        alpha = await session.get(Tenant, "alpha")
        assert alpha is not None
        alpha.submissions_per_minute, alpha.submission_burst = 1.0, 3
    codes = [(await limited.post("/v1/jobs", json=spec_dict(name=f"r{i}"), headers=_auth("alpha-token"))).status_code for i in range(3)]
    assert codes == [201, 201, 201]
    over = await limited.post("/v1/jobs", json=spec_dict(name="r3"), headers=_auth("alpha-token"))
    assert over.status_code == 429 and 1 <= int(over.headers["Retry-After"]) <= 60, over.text
    assert "submission rate" in over.json()["detail"]
    assert len((await limited.get("/v1/jobs", headers=_auth("alpha-token"))).json()) == 3
    beta = spec_dict(name="b0", checkpoint_dir="/ckpt/beta/b0")
    assert (await limited.post("/v1/jobs", json=beta, headers=_auth("beta-token"))).status_code == 201


def test_a_submission_bucket_refills_at_the_tenants_rate_up_to_its_burst() -> None:
    now = [0.0]
    buckets = SubmissionBuckets(clock=lambda: now[0])
    assert [buckets.take("a", 6.0, 2) for _ in range(3)] == [None, None, 10]  # 6 a minute: one every 10 s
    now[0] = 5.0
    assert buckets.take("a", 6.0, 2) == 5
    now[0] = 10.0
    assert buckets.take("a", 6.0, 2) is None
    now[0] = 1000.0  # long idle: the bucket holds its burst, no more
    assert [buckets.take("a", 6.0, 2) for _ in range(3)] == [None, None, 10]
    assert buckets.take("b", 6.0, 2) is None


async def test_a_query_parameter_the_route_does_not_declare_is_refused_with_its_name(api: httpx.AsyncClient) -> None:
    alpha = {"Authorization": "Bearer alpha-token"}
    misspelt = await api.get("/v1/jobs", params={"stat": "RUNNING", "limit": 5}, headers=alpha)
    assert misspelt.status_code == 422 and misspelt.headers["content-type"] == "application/problem+json"
    assert misspelt.json()["problems"] == [{"field": "query.stat", "reason": "unknown query parameter"}]
    twice = await api.get("/v1/jobs", params=[("state", "RUNNING"), ("state", "QUEUED")], headers=alpha)
    assert twice.status_code == 422 and twice.json()["problems"][0]["field"] == "query.state"
    # Declared ones, of the route and of its dependencies, pass.
    assert (await api.get("/v1/jobs", params={"state": "RUNNING", "limit": 5}, headers=alpha)).status_code == 200
    assert (await api.get("/v1/audit", params={"target": "node:h1"}, headers={"Authorization": "Bearer admin-token"})).status_code == 200
