"""Roles and tokens with a lifecycle through the API (both backends): a platform admin manages everyone's tokens,
a tenant admin its own tenant's, a member none; a made token works at once, until it expires or is revoked."""

from __future__ import annotations

import asyncio

import httpx

from tests.api.test_api import ADMIN, ALPHA, BETA, NODE, auth
from tests.builders import spec_dict

ALPHA_ADMIN = auth("alpha-admin-token")


async def test_a_tenant_admin_makes_lists_and_revokes_its_own_tenants_tokens(api: httpx.AsyncClient) -> None:
    made = await api.post("/v1/tokens", json={"name": "ci runner"}, headers=ALPHA_ADMIN)
    assert made.status_code == 201, made.text
    secret, info = made.json()["token"], made.json()["info"]
    assert (info["role"], info["tenant"], info["name"], info["expires_at"], info["revoked_at"]) == (
        "tenant",
        "alpha",
        "ci runner",
        None,
        None,
    )
    assert info["created_by"].startswith("tenant_admin:alpha#")
    # The new member's token works at once, as alpha's.
    job = await api.post("/v1/jobs", json=spec_dict(name="by-ci"), headers=auth(secret))
    assert job.status_code == 201 and job.json()["job"]["tenant"] == "alpha", job.text
    # A member may not manage tokens.
    assert (await api.post("/v1/tokens", json={"name": "x"}, headers=auth(secret))).status_code == 403
    assert (await api.get("/v1/tokens", headers=ALPHA)).status_code == 403
    # Listed for its tenant's admin, never with a secret or a digest.
    listed = (await api.get("/v1/tokens", headers=ALPHA_ADMIN)).json()
    assert {t["tenant"] for t in listed} == {"alpha"} and info["id"] in {t["id"] for t in listed}
    assert secret not in str(listed) and all("token" not in t and "token_hash" not in t for t in listed)
    # Revoked: refused from then on; the record stays, with when.
    revoked = await api.delete(f"/v1/tokens/{info['id']}", headers=ALPHA_ADMIN)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert (await api.get("/v1/jobs", headers=auth(secret))).status_code == 401
    again = [t for t in (await api.get("/v1/tokens", headers=ALPHA_ADMIN)).json() if t["id"] == info["id"]]
    assert again and again[0]["revoked_at"] == revoked.json()["revoked_at"]


async def test_a_tenant_admin_cannot_reach_past_its_tenant(api: httpx.AsyncClient) -> None:
    other = await api.post("/v1/tokens", json={"name": "beta-ci", "tenant": "beta"}, headers=ALPHA_ADMIN)
    assert other.status_code == 403 and "own tenant" in other.text
    assert (await api.post("/v1/tokens", json={"name": "root", "role": "admin"}, headers=ALPHA_ADMIN)).status_code == 403
    beta = (await api.post("/v1/tokens", json={"name": "beta-ci", "tenant": "beta"}, headers=ADMIN)).json()["info"]
    assert (await api.delete(f"/v1/tokens/{beta['id']}", headers=ALPHA_ADMIN)).status_code == 404
    assert beta["id"] not in {t["id"] for t in (await api.get("/v1/tokens", headers=ALPHA_ADMIN)).json()}
    # Neither a node nor another tenant's member gets in.
    for who in (NODE, BETA):
        assert (await api.get("/v1/tokens", headers=who)).status_code == 403


async def test_a_platform_admin_manages_everyones_tokens_and_an_expired_token_is_refused(api: httpx.AsyncClient) -> None:
    admin = (await api.post("/v1/tokens", json={"name": "ops", "role": "admin"}, headers=ADMIN)).json()
    assert admin["info"]["tenant"] is None and admin["info"]["role"] == "admin"
    assert (await api.post("/v1/nodes/h1/cordon", headers=auth(admin["token"]))).status_code == 200
    tenant_admin = (await api.post("/v1/tokens", json={"name": "lead", "role": "tenant_admin", "tenant": "beta"}, headers=ADMIN)).json()
    assert (await api.get("/v1/tokens", headers=auth(tenant_admin["token"]))).status_code == 200
    everyone = (await api.get("/v1/tokens", headers=ADMIN)).json()
    assert {"alpha", "beta", None} <= {t["tenant"] for t in everyone}
    assert {t["tenant"] for t in (await api.get("/v1/tokens", params={"tenant": "beta"}, headers=ADMIN)).json()} == {"beta"}

    short = (await api.post("/v1/tokens", json={"name": "brief", "tenant": "alpha", "expires_in": "1s"}, headers=ADMIN)).json()
    assert short["info"]["expires_at"] is not None
    deadline = asyncio.get_running_loop().time() + 30
    while (await api.get("/v1/jobs", headers=auth(short["token"]))).status_code != 401:
        assert asyncio.get_running_loop().time() < deadline, "the token never expired"
        await asyncio.sleep(0.2)


async def test_bad_token_requests_name_what_is_wrong(api: httpx.AsyncClient) -> None:
    cases = [
        ({"name": "x", "role": "owner"}, "role"),
        ({"name": "x", "expires_in": "-5m"}, "expires_in"),
        ({"name": "x", "expires_in": "soon"}, "expires_in"),
        ({"name": ""}, "name"),
        ({"name": "x", "tenant": "nobody"}, "no tenant 'nobody'"),
        ({"name": "x", "role": "tenant"}, "names its tenant"),
        ({"name": "x", "role": "admin", "tenant": "alpha"}, "belongs to no tenant"),
    ]
    for body, wrong in cases:
        resp = await api.post("/v1/tokens", json=body, headers=ADMIN)
        assert resp.status_code == 422 and wrong in resp.text, (body, resp.text)
    assert (await api.delete("/v1/tokens/999999", headers=ADMIN)).status_code == 404


async def test_an_id_or_index_past_what_the_store_holds_is_refused_by_name(api: httpx.AsyncClient) -> None:
    """A path's integer beyond the store's keys (32-bit in PostgreSQL) or a GPU index beyond 32 bits is a 422 naming
    it, never sent to the store (neither store can bind it; the fuzz test found a 500)."""
    for path, name in (
        (f"/v1/tokens/{2**64}", "token_id"),
        (f"/v1/tokens/{2**31}", "token_id"),
        ("/v1/tokens/0", "token_id"),
        (f"/v1/nodes/h1/gpus/{2**64}/return", "index"),
        (f"/v1/nodes/h1/gpus/{2**40}/faults", "index"),
    ):
        if path.startswith("/v1/tokens"):
            resp = await api.delete(path, headers=ADMIN)
        else:
            resp = await api.post(path, json={"kind": "xid", "xid": 79}, headers=ADMIN)
        assert resp.status_code == 422 and name in resp.text, (path, resp.status_code, resp.text)
    assert (await api.delete(f"/v1/tokens/{2**31 - 1}", headers=ADMIN)).status_code == 404
    assert (await api.post(f"/v1/nodes/h1/gpus/{2**31 - 1}/return", headers=ADMIN)).status_code == 404
