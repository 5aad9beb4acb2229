"""GET /v1/jobs pages through any number of jobs by cursor, newest submission first, and filters them by state,
tenant, labels and submission time; what it cannot read is refused with the parameter named."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx

from store import jobs
from store.db import Database
from tests.builders import job_spec

ADMIN = {"Authorization": "Bearer admin-token"}
ALPHA = {"Authorization": "Bearer alpha-token"}
T0 = 1_790_000_000.0


async def submitted(db: Database, n: int) -> list[str]:
    """n jobs, alternately alpha's and beta's, one a minute from T0 (three of them at one instant), every third
    labelled team=vision; newest first."""
    ids = []
    for i in range(n):
        at = T0 + 60 * min(i, 10)  # jobs 10, 11, 12 share one submission time: the cursor must tell them apart
        labels = {"team": "vision"} if i % 3 == 0 else {"team": "nlp"}
        job, _ = await jobs.create_job(
            db, spec=job_spec(name=f"h-{i:02d}", labels=labels), tenant="alpha" if i % 2 == 0 else "beta", now=at
        )
        ids.append(job.id)
    rows = await jobs.list_jobs(db, limit=1000)
    return [r.id for r in rows if r.id in ids]


async def pages(api: httpx.AsyncClient, headers: dict[str, str], **params: Any) -> list[list[dict[str, Any]]]:
    found, cursor = [], None
    while True:
        resp = await api.get("/v1/jobs", params=params | ({"cursor": cursor} if cursor else {}), headers=headers)
        assert resp.status_code == 200, resp.text
        found.append(resp.json())
        cursor = resp.headers.get("X-Next-Cursor")
        if cursor is None:
            assert "Link" not in resp.headers
            return found
        assert resp.headers["Link"].endswith('rel="next"') and f"cursor={cursor}" in resp.headers["Link"]


async def test_pages_hold_every_job_once_newest_first(api: httpx.AsyncClient, seeded: Database) -> None:
    newest_first = await submitted(seeded, 13)
    got = await pages(api, ADMIN, limit=4)
    assert [len(p) for p in got] == [4, 4, 4, 1]
    assert [j["id"] for p in got for j in p] == newest_first
    assert [j["created_at"] for p in got for j in p] == sorted((j["created_at"] for p in got for j in p), reverse=True)
    # A page that ends inside the jobs of one instant: the next starts with the rest of them.
    assert [j["id"] for p in await pages(api, ADMIN, limit=2) for j in p] == newest_first
    # A page of exactly what is left has no next cursor.
    assert [len(p) for p in await pages(api, ADMIN, limit=13)] == [13]


async def test_filters_by_tenant_state_labels_and_submission_time(api: httpx.AsyncClient, seeded: Database) -> None:
    newest_first = await submitted(seeded, 13)
    every = {j["id"]: j for p in await pages(api, ADMIN, limit=100) for j in p}
    alphas = [j["id"] for p in await pages(api, ALPHA, limit=3) for j in p]
    assert alphas == [i for i in newest_first if every[i]["tenant"] == "alpha"] and len(alphas) == 7
    vision = [j["id"] for p in await pages(api, ADMIN, label="team=vision", limit=2) for j in p]
    assert vision == [i for i in newest_first if every[i]["spec"]["labels"]["team"] == "vision"] and len(vision) == 5
    both = [j["id"] for p in await pages(api, ADMIN, label=["team=vision", "nope=x"]) for j in p]
    assert both == []
    since, until = T0 + 120, datetime.fromtimestamp(T0 + 300, UTC).isoformat()
    window = [j["id"] for p in await pages(api, ADMIN, since=str(since), until=until, limit=2) for j in p]
    assert window == [i for i in newest_first if since <= every[i]["created_at"] < T0 + 300] and len(window) == 3
    queued = [j["id"] for p in await pages(api, ADMIN, state="QUEUED", tenant="beta") for j in p]
    assert len(queued) == 6 and all(every[i]["tenant"] == "beta" for i in queued)
    # A naive ISO time is UTC.
    naive = [j["id"] for p in await pages(api, ADMIN, since="2026-09-21T12:00:00") for j in p]
    assert naive == [i for i in newest_first if every[i]["created_at"] >= datetime(2026, 9, 21, 12, tzinfo=UTC).timestamp()]


async def test_what_it_cannot_read_is_refused_with_the_parameter_named(api: httpx.AsyncClient, seeded: Database) -> None:
    await submitted(seeded, 2)
    for params, name in (
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"since": "yesterday"}, "since"),
        ({"until": "nan"}, "until"),
        ({"label": "team"}, "label"),
        ({"state": "DONE"}, "state"),
        ({"limit": 0}, "limit"),
    ):
        resp = await api.get("/v1/jobs", params=params, headers=ADMIN)
        assert resp.status_code == 422 and name in resp.text, (params, resp.text)
    assert (await api.get("/v1/jobs", params={"tenant": "beta"}, headers=ALPHA)).status_code == 403


async def test_usage_over_the_api_is_the_stores_report_and_a_tenant_sees_its_own(api: httpx.AsyncClient, seeded: Database) -> None:
    from tests.store.test_accounting import NOW, UNTIL, T, scenario

    await scenario(seeded)
    window = {"since": str(T), "until": str(UNTIL)}
    every = (await api.get("/v1/usage", params=window, headers=ADMIN)).json()
    assert every["since"] == T and every["until"] == UNTIL and every["by"] == ["tenant", "gpu_type"]
    beta = {(r["tenant"], r["gpu_type"]): r for r in every["rows"]}[("beta", "H100-80GB")]
    # Made now, long after the window: J2's allocation, still held, counts to the window's end.
    assert beta["gpu_hours"] == 16 * (UNTIL - T - 1800) / 3600 + 8 and beta["jobs"] == 2 and beta["wait_p50_s"] == 1300
    own = (await api.get("/v1/usage", params=window | {"by": "tenant"}, headers=ALPHA)).json()
    assert [(r["tenant"], r["gpu_type"], r["gpu_hours"]) for r in own["rows"]] == [("alpha", None, 26.0)]
    assert (await api.get("/v1/usage", params=window | {"tenant": "beta"}, headers=ALPHA)).status_code == 403
    for params, name in (({"by": "node"}, "by"), ({"since": "soon"}, "since"), ({"since": str(UNTIL), "until": str(T)}, "until")):
        resp = await api.get("/v1/usage", params=params, headers=ADMIN)
        assert resp.status_code == 422 and name in resp.text, (params, resp.text)
    assert NOW < UNTIL
