"""``POST /v1/admin/whatif`` in process over a real store (both backends): admins only, "no change" agrees with the
live queue estimates, each kind of change moves them the right way, bad changes are refused naming the field, and
nothing in the store changes."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlmodel import SQLModel

from api import whatif
from store.db import Database
from store.models import Job, UsageLedger
from tests.api.test_api import ADMIN, ALPHA, BETA, auth
from tests.api.test_observability import bind, queue_job, register

ALPHA_ADMIN = auth("alpha-admin-token")


async def busy_fleet(api: httpx.AsyncClient, db: Database) -> dict[str, str]:
    """h1 and h2 full (alpha's "short" job on h2 and "long" on h1, both expected to run their hour: the earlier
    "short" run's row is marked done without its event, so nothing is learned from it), beta and alpha waiting.
    Returns the waiting jobs' ids by name."""
    await register(api, "h1", 0.0)
    await register(api, "h2", 0.0)
    now = time.time()
    done = await queue_job(api, db, ALPHA, name="short")
    async with db.transaction() as session:
        row = await session.get(Job, done)
        assert row is not None
        row.state, row.started_at, row.finished_at = "SUCCEEDED", now - 1000, now - 400
    long = await queue_job(api, db, ALPHA, name="long", gpu_count=8)
    await bind(db, long, "h1", list(range(8)))
    short = await queue_job(api, db, ALPHA, name="short", idempotency_key="again", gpu_count=8)
    await bind(db, short, "h2", list(range(8)))
    # It started so that it is expected to end at 15 s past an odd half-minute: the ETA on the estimator's 30 s
    # grid is on a half-minute, on any coarser grid later.
    async with db.transaction() as session:
        row = await session.get(Job, short)
        assert row is not None
        row.started_at = math.floor(now / 60) * 60 + 135 - 600
    return {
        "next": await queue_job(api, db, BETA, name="next", checkpoint_dir="/ckpt/beta/next", gpu_count=8),
        "four": await queue_job(api, db, ALPHA, name="four", checkpoint_dir="/ckpt/alpha/four", gpu_count=4),
        # alpha's, not beta's: a 1-GPU job of beta would go before beta's 8-GPU job (the short-job boost) and take
        # part of beta's guarantee, so that the 8-GPU job could not start even on added nodes.
        "one": await queue_job(api, db, ALPHA, name="one", checkpoint_dir="/ckpt/alpha/one", gpu_count=1),
    }


async def what_if(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    resp = await api.post("/v1/admin/whatif", json={"jobs": True, **body}, headers=ADMIN)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def starts(answer: dict[str, Any]) -> dict[str, tuple[float | None, float | None]]:
    return {j["job_id"]: (j["before"], j["after"]) for j in answer["jobs"]}


def tenant(answer: dict[str, Any], name: str) -> dict[str, Any]:
    (row,) = [t for t in answer["tenants"] if t["tenant"] == name]
    return row


async def test_only_admins_may_ask(api: httpx.AsyncClient) -> None:
    for headers in (ALPHA, BETA, ALPHA_ADMIN):
        assert (await api.post("/v1/admin/whatif", json={}, headers=headers)).status_code == 403
    assert (await api.post("/v1/admin/whatif", json={})).status_code == 401
    assert "/v1/admin/whatif" in (await api.get("/openapi.json")).json()["paths"]


async def test_no_change_agrees_with_the_live_queue_estimates(api: httpx.AsyncClient, seeded: Database) -> None:
    waiting = await busy_fleet(api, seeded)
    answer = await what_if(api, hours=168)
    live = {e["job"]["id"]: e["estimated_start"] for e in (await api.get("/v1/queue", headers=ADMIN)).json()}
    assert set(live) == set(waiting.values())
    assert all(eta is not None and eta > time.time() for eta in live.values())  # none starts now: no clock in the comparison
    assert starts(answer) == {job_id: (eta, eta) for job_id, eta in live.items()}
    assert answer["changes"] == ["no change"]
    everyone = tenant(answer, "*")
    assert (everyone["waiting"], everyone["started_before"], everyone["started_after"]) == (3, 3, 3)
    assert everyone["mean_wait_before_s"] == everyone["mean_wait_after_s"] > 0


async def test_draining_delays_and_adding_nodes_advances(api: httpx.AsyncClient, seeded: Database) -> None:
    waiting = await busy_fleet(api, seeded)
    base = starts(await what_if(api))
    drained = await what_if(api, drain=["h2"])
    for job_id, (before, after) in starts(drained).items():
        assert before == base[job_id][0]
        assert after is None or (before is not None and after > before), job_id
    assert tenant(drained, "beta")["mean_wait_after_s"] > tenant(drained, "beta")["mean_wait_before_s"]
    # Two more nodes: beta's 8-GPU job starts now; the others are held back by their quotas (alpha already borrows
    # all of beta's guarantee that beta's 8-GPU job does not take), so they start no earlier and no later.
    added = await what_if(api, add_nodes=[{"count": 2, "gpu_type": "H100-80GB", "gpus": 8, "domain": {"leaf": "l1"}}])
    moved = starts(added)
    assert moved[waiting["next"]][1] == added["now"] < moved[waiting["next"]][0]
    assert all(moved[waiting[name]][0] == moved[waiting[name]][1] for name in ("four", "one"))
    assert tenant(added, "*")["mean_wait_after_s"] < tenant(added, "*")["mean_wait_before_s"]
    assert added["changes"] == ["add 2 node(s) of 8 H100-80GB GPUs in leaf l1"]


async def contended(api: httpx.AsyncClient, db: Database) -> dict[str, list[str]]:
    """Both tenants guaranteed all 16 H100s; alpha holds h1 for an hour, beta half of h2. Waiting: beta's 8-GPU job
    (the reservation's head) and four 30-minute 1-GPU jobs of each tenant, for h2's free half, in the priority class
    below (in the same class the short-job boost would put beta's small jobs before its 8-GPU job, and the head would
    be one of them). Job ids by tenant."""
    for name in ("alpha", "beta"):
        resp = await api.patch(f"/v1/tenants/{name}", json={"quotas": {"H100-80GB": {"nominal": 16}}}, headers=ADMIN)
        assert resp.status_code == 200, resp.text
    await register(api, "h1", 0.0)
    await register(api, "h2", 0.0)
    await bind(db, await queue_job(api, db, ALPHA, name="hold", gpu_count=8), "h1", list(range(8)))
    await bind(db, await queue_job(api, db, BETA, name="half", gpu_count=4, checkpoint_dir="/ckpt/beta/half"), "h2", [0, 1, 2, 3])
    ids: dict[str, list[str]] = {"big": [await queue_job(api, db, BETA, name="big", checkpoint_dir="/ckpt/beta/big", gpu_count=8)]}
    for who, headers in (("beta", BETA), ("alpha", ALPHA)):
        ids[who] = [
            await queue_job(
                api, db, headers, name=f"{who}{i}", checkpoint_dir=f"/ckpt/{who}/{who}{i}", max_runtime="30m", priority_class="low"
            )
            for i in range(4)
        ]
    return ids


async def test_a_heavier_weight_gets_a_tenant_the_free_gpus_first(api: httpx.AsyncClient, seeded: Database) -> None:
    ids = await contended(api, seeded)
    answer = await what_if(api, weights={"alpha": 8})
    now, moved = answer["now"], starts(answer)
    # Without the change beta, the lighter user, gets h2's free half now; with it alpha does.
    assert all(moved[j][0] == now and moved[j][1] is not None and moved[j][1] > now for j in ids["beta"])
    assert all(moved[j][0] is not None and moved[j][0] > now and moved[j][1] == now for j in ids["alpha"])
    assert tenant(answer, "alpha")["mean_wait_after_s"] < tenant(answer, "alpha")["mean_wait_before_s"]
    assert tenant(answer, "beta")["mean_wait_after_s"] > tenant(answer, "beta")["mean_wait_before_s"]
    assert answer["changes"] == ["tenant alpha: weight 1 -> 8"]


async def test_a_smaller_quota_holds_a_tenant_back(api: httpx.AsyncClient, seeded: Database) -> None:
    ids = await contended(api, seeded)
    answer = await what_if(api, quotas={"beta": {"H100-80GB": {"nominal": 0, "borrow_limit": 0}}})
    moved = starts(answer)
    assert all(moved[j][0] is not None and moved[j][1] is None for j in ids["beta"] + ids["big"])
    beta = tenant(answer, "beta")
    assert (beta["started_before"], beta["started_after"]) == (5, 0)
    assert beta["mean_wait_after_s"] == answer["horizon_s"] > beta["mean_wait_before_s"]
    assert answer["changes"] == ["tenant beta: H100-80GB quota 16 -> 0 (borrow at most 0)"]


async def test_backfill_off_keeps_the_small_jobs_behind_the_head(api: httpx.AsyncClient, seeded: Database) -> None:
    ids = await contended(api, seeded)
    answer = await what_if(api, policy={"backfill": "false"}, hours=4)
    now, moved = answer["now"], starts(answer)
    assert all(moved[j][0] == now for j in ids["beta"])
    assert all(moved[j][1] is not None and moved[j][1] > now for j in ids["beta"] + ids["alpha"])
    assert tenant(answer, "*")["mean_wait_after_s"] > tenant(answer, "*")["mean_wait_before_s"]
    assert answer["changes"] == ["policy backfill: True -> False"]


@pytest.mark.settings(backfill=False)
async def test_the_queue_view_and_a_what_if_decide_under_the_placement_services_policy(api: httpx.AsyncClient, seeded: Database) -> None:
    # The placement service runs without backfill here: beta's small jobs wait behind its 8-GPU head, and the queue
    # view says so (under the defaults they would start now, as in the test above).
    ids = await contended(api, seeded)
    now = time.time()
    resp = await api.get("/v1/queue", headers=ADMIN)
    assert resp.status_code == 200, resp.text
    live = {e["job"]["id"]: e["estimated_start"] for e in resp.json()}
    assert all(live[j] is not None and live[j] > now + 60 for j in ids["beta"])
    # ... and so does a what-if of no change.
    answer = await what_if(api, hours=4)
    assert all(before is not None and before > answer["now"] + 60 for before, _ in (starts(answer)[j] for j in ids["beta"]))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"weights": {"ghost": 2}}, "weights.ghost"),
        ({"weights": {"alpha": 0}}, "weights.alpha"),
        ({"drain": ["nowhere"]}, "drain"),
        ({"quotas": {"alpha": {"TPU": {"nominal": 1}}}}, "quotas.alpha.TPU"),
        ({"quotas": {"alpha": {"H100-80GB": {"nominal": -1}}}}, "quotas.alpha.H100-80GB.nominal"),
        ({"add_nodes": [{"count": 1, "gpu_type": "H100-80GB", "gpus": 8, "domain": {"rack": "r1"}}]}, "add_nodes[0].domain"),
        ({"add_nodes": [{"count": 0, "gpu_type": "H100-80GB", "gpus": 8}]}, "add_nodes.0.count"),
        ({"policy": {"speed": 2}}, "policy.speed"),
        ({"policy": {"backfill": "maybe"}}, "policy.backfill"),
        ({"policy": {"aging_per_hour": "fast"}}, "policy.aging_per_hour"),
        ({"hours": 0}, "hours"),
        ({"surprise": 1}, "surprise"),
    ],
)
async def test_a_bad_change_is_refused_naming_its_field(api: httpx.AsyncClient, body: dict[str, Any], field: str) -> None:
    resp = await api.post("/v1/admin/whatif", json=body, headers=ADMIN)
    assert resp.status_code == 422, resp.text
    assert field in [p["field"] for p in resp.json()["problems"]], resp.json()


async def rows(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in a stable order."""
    out = {}
    async with db.sessions() as session:
        for table in SQLModel.metadata.sorted_tables:
            found = (await session.execute(select(table))).all()
            out[table.name] = sorted((tuple(r) for r in found), key=repr)
    return out


async def test_a_what_if_writes_nothing(api: httpx.AsyncClient, seeded: Database) -> None:
    await busy_fleet(api, seeded)
    assert (await api.get("/v1/audit", headers=ADMIN)).status_code == 200  # the admin's token is known as it will be
    async with seeded.sessions() as session:
        assert (await session.execute(select(UsageLedger))).all() == []  # no ledger yet: the what-if must not build one
    before = await rows(seeded)
    assert sum(len(r) for r in before.values()) > 0
    everything = {
        "weights": {"alpha": 3},
        "quotas": {"beta": {"H100-80GB": {"nominal": 16}}},
        "add_nodes": [{"count": 1, "gpu_type": "H100-80GB", "gpus": 8}],
        "drain": ["h1"],
        "policy": {"usage_half_life_s": 3600, "aging_per_hour": 30, "backfill": False},
    }
    answer = await what_if(api, **everything)
    assert len(answer["changes"]) == 7
    await what_if(api)
    assert await rows(seeded) == before


def test_the_replay_processes_end_with_an_api_process_killed_by_a_signal(tmp_path: Path) -> None:
    script = (
        "import os, sys, time\n"
        "from api import whatif\n"
        "pool = whatif._replay_pool()\n"
        "pids = [f.result(timeout=120) for f in [pool.submit(time.sleep, 1) for _ in range(whatif.REPLAY_PROCESSES)]]\n"
        "print(' '.join(str(p) for p in pool._processes), flush=True)\n"
        "time.sleep(600)\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = os.environ | {"PYTHONPATH": str(root)}
    api = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert api.stdout is not None
        workers = [int(p) for p in api.stdout.readline().split()]
        assert len(workers) == whatif.REPLAY_PROCESSES and all(alive(p) for p in workers)
    finally:
        api.kill()  # SIGKILL: no exit handler runs
        api.wait()
    deadline = time.monotonic() + 60
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in workers if alive(p)]
    for pid in left:  # a failure leaves nothing behind
        os.kill(pid, signal.SIGKILL)
    assert not left


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
