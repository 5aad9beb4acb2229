"""The API's heavy views come from a cache its view worker fills: stamped when computed, shared, never computed in the API's process.

The API in process over a real store (both backends), with its real view worker process,
instrumented by ``tests.api.view_hooks`` (steered by files). Also: the metric counters counted
in SQL give what counting every row in Python gives.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from api import insight, views
from api.app import create_app
from api.deps import AppState
from api.metrics import WAIT_BUCKETS, preemption_reason, requeue_reason
from fairgang.settings import Settings
from store import health, jobs, nodes, observability
from store.db import Database
from store.models import HealthEvent, Job, JobEvent
from tests.api.test_api import ADMIN, ALPHA, BETA
from tests.api.view_hooks import keys, times
from tests.builders import job_spec, spec_dict

Served = tuple[httpx.AsyncClient, AppState]


@pytest.fixture
def hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The directory of files that steers the view worker's instrumentation (see tests.api.view_hooks)."""
    where = tmp_path / "hooks"
    where.mkdir()
    monkeypatch.setattr(views, "WORKER_SETUP", (("tests.api.view_hooks:install", str(where)),))
    return where


@pytest.fixture
async def served(seeded: Database, db_url: str, tmp_path: Path, hooks: Path) -> AsyncIterator[Served]:
    """The API in process, with its state at hand (the view cache and its counts); its view worker is a real process."""
    settings = Settings(database_url=db_url, temporal_address="127.0.0.1:1", log_dir=tmp_path / "logs")
    app = create_app(settings)
    state = AppState(settings=settings, db=seeded)
    app.state.fairgang = state
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        yield client, state
    await asyncio.to_thread(state.views.close)


def computed_at(resp: httpx.Response) -> float:
    assert resp.status_code == 200, resp.text
    return float(resp.headers["X-Computed-At"])


async def eventually(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_view_is_stamped_when_computed_reused_and_recomputed_when_the_store_changes(
    served: Served, hooks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, state = served
    monkeypatch.setattr(views, "MAX_AGE_S", 3600.0)  # only a change of the store makes it stale here
    monkeypatch.setattr(views, "CALIBRATE_CPU_S", 0.0)  # no repeated first computation: count every one
    # Cheap by any measure, its one-time costs included: on a loaded machine the first computation took over 1 s of CPU.
    monkeypatch.setattr(views, "QUICK_CPU_S", 30.0)
    monkeypatch.setattr(views, "FRESH_WAIT_S", 60.0)  # a loaded machine may take more than the default 5 s to recompute
    # A computation that takes a while: its stamp is its end, not its start.
    (hooks / "tenants.sleep").write_text("0.3")
    first = await client.get("/v1/tenants", headers=ADMIN)
    again = await client.get("/v1/tenants", headers=BETA)
    assert state.views.computations["tenants"] == 1
    ended = times(hooks, "tenants", "ended")
    assert computed_at(first) == computed_at(again) >= ended[0]
    assert [t["name"] for t in first.json()] == ["alpha", "beta"] and [t["name"] for t in again.json()] == ["beta"]

    await nodes.set_node_state(state.db, node_id="h1", state="CORDONED")  # moves the store's version
    cordoned = await observability.view_version(state.db)
    after = await client.get("/v1/tenants", headers=ADMIN)
    assert state.views.computations["tenants"] == 2
    ended = times(hooks, "tenants", "ended")
    assert computed_at(after) >= ended[1] > computed_at(first)
    assert all(a >= b for a, b in zip(keys(hooks, "tenants")[1], cordoned, strict=True))
    beta = await client.get("/v1/tenants/beta", headers=BETA)
    assert beta.json()["name"] == "beta"
    # Reused while the store stays at its version: never computed twice at one version. (Should the store move
    # meanwhile, a recomputation is right; each computation's version is recorded.)
    computed = keys(hooks, "tenants")
    assert state.views.computations["tenants"] == len(computed) and len(set(computed)) == len(computed), computed
    assert computed_at(beta) == computed_at(after) or len(computed) == 3, computed

    fleet = await client.get("/v1/fleet", headers=ALPHA)
    assert fleet.json()["computed_at"] == computed_at(fleet)
    assert next(n for n in fleet.json()["nodes"] if n["id"] == "h1")["state"] == "CORDONED"


async def test_concurrent_first_requests_wait_for_one_computation(served: Served, hooks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client, state = served
    monkeypatch.setattr(views, "CALIBRATE_CPU_S", 0.0)
    for name in ("alpha", "beta"):
        token = ALPHA if name == "alpha" else BETA
        job = (await client.post("/v1/jobs", json=spec_dict(name=f"{name}-1", checkpoint_dir=f"/ckpt/{name}/x"), headers=token)).json()
        await jobs.mark_queued(state.db, job_id=job["job"]["id"], attempt=1)
    (hooks / "queue.sleep").write_text("0.2")  # long enough for every request to arrive while it runs
    answers = await asyncio.gather(*(client.get("/v1/queue", headers=ADMIN if i % 2 else ALPHA) for i in range(20)))
    assert len(times(hooks, "queue", "started")) == 1 and state.views.computations["queue"] == 1
    assert {computed_at(a) for a in answers} == {computed_at(answers[0])}
    assert [len(a.json()) for a in answers[:2]] == [1, 2]  # alpha's own job, with its global position; the admin sees both
    assert answers[0].json()[0]["job"]["tenant"] == "alpha"
    metrics = await asyncio.gather(*(client.get("/metrics") for _ in range(10)))
    assert {computed_at(m) for m in metrics} == {computed_at(metrics[0])} and state.views.computations["metrics"] == 1


async def test_a_costly_view_is_computed_off_the_api_process_and_answered_from_the_cache_meanwhile(
    served: Served, hooks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, state = served
    monkeypatch.setattr(views, "QUICK_CPU_S", 0.0)  # every view counts as costly
    job = (await client.post("/v1/jobs", json=spec_dict(name="mine"), headers=ALPHA)).json()["job"]
    await jobs.mark_queued(state.db, job_id=job["id"], attempt=1)
    first = computed_at(await client.get("/v1/queue", headers=ALPHA))

    async def calibrated() -> bool:  # a first computation is repeated at once, to learn its steady cost
        return state.views.computations.get("queue") == 2

    await eventually("the first computation repeated", calibrated)
    second = computed_at(await client.get("/v1/queue", headers=ALPHA))
    assert second > first and state.views.computations["queue"] == 2

    # The next computation blocks its thread, as a long simulation does: in the API's process, nothing would be
    # answered meanwhile.
    (hooks / "queue.block").touch()
    await nodes.set_node_state(state.db, node_id="h1", state="READY")
    stale = await asyncio.wait_for(client.get("/v1/queue", headers=ALPHA), 60)
    assert computed_at(stale) == second  # answered at once, from the cache

    async def blocked() -> bool:
        return (hooks / "queue.blocked").exists()

    await eventually("the worker blocked in the queue's computation", blocked)
    # While the worker computes, the API answers the cached views, a job and the health check.
    assert computed_at(await client.get("/v1/queue", headers=ADMIN)) == second
    assert (await client.get(f"/v1/jobs/{job['id']}", headers=ALPHA)).json()["queue_position"] == 1
    assert (await client.get("/healthz")).status_code == 200
    assert not (hooks / "queue.timed_out").exists()
    (hooks / "queue.release").touch()

    async def recomputed() -> bool:
        return computed_at(await client.get("/v1/queue", headers=ALPHA)) > second

    await eventually("the queue recomputed", recomputed)
    assert not (hooks / "queue.timed_out").exists()


async def test_on_a_costly_fleet_a_view_cheap_on_its_own_is_answered_from_the_cache_after_a_change(
    served: Served, hooks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker computes one view at a time: where the views together are costly, a request never waits for a
    recomputation (it would queue behind the others), however cheap its own view is."""
    client, state = served
    monkeypatch.setattr(views, "CALIBRATE_CPU_S", 0.0)
    monkeypatch.setattr(views, "FRESH_WAIT_S", 120.0)  # were it to wait, it would wait for the blocked computation
    for path in ("/v1/fleet", "/v1/tenants", "/metrics"):
        computed_at(await client.get(path, headers=ADMIN))
    costs = [v.cpu_s for v in (state.views.cached(n) for n in ("fleet", "tenants", "metrics")) if v is not None]
    assert len(costs) == 3 and sum(costs) > max(costs)
    monkeypatch.setattr(views, "QUICK_CPU_S", (max(costs) + sum(costs)) / 2)  # each view cheap, all of them not
    before = computed_at(await client.get("/v1/tenants", headers=ADMIN))
    (hooks / "tenants.block").touch()
    await nodes.set_node_state(state.db, node_id="h1", state="CORDONED")
    answer = await asyncio.wait_for(client.get("/v1/tenants", headers=ADMIN), 30)
    assert computed_at(answer) == before  # the cached one, while the worker recomputes
    (hooks / "tenants.release").touch()


async def test_the_first_request_gets_503_when_the_first_computation_fails(served: Served, hooks: Path) -> None:
    client, _ = served
    (hooks / "fleet.fail").write_text("store on fire")
    resp = await client.get("/v1/fleet", headers=ALPHA)
    assert resp.status_code == 503 and "store on fire" in resp.json()["detail"]
    (hooks / "fleet.fail").unlink()

    async def recovered() -> bool:
        return (await client.get("/v1/fleet", headers=ALPHA)).status_code == 200

    await eventually("the fleet computed once the failure is gone", recovered)


async def test_a_killed_worker_is_answered_503_then_replaced(served: Served, hooks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client, state = served
    monkeypatch.setattr(views, "CALIBRATE_CPU_S", 0.0)
    monkeypatch.setattr(views, "FRESH_WAIT_S", 3600.0)  # a request waits for the recomputation as long as the worker lives
    first = await client.get("/v1/tenants", headers=ADMIN)
    pid = state.views.worker_pid
    assert pid is not None and pid != os.getpid() and state.views.cached("tenants") is not None
    assert state.views.cached("tenants").pid == pid  # type: ignore[union-attr]
    # A request waits for the worker (blocked in a computation after a change); the worker is killed meanwhile.
    (hooks / "tenants.block").touch()
    await nodes.set_node_state(state.db, node_id="h1", state="CORDONED")
    waiting = asyncio.ensure_future(client.get("/v1/tenants", headers=ADMIN))

    async def blocked() -> bool:
        return (hooks / "tenants.blocked").exists()

    await eventually("the worker blocked in the tenants' computation", blocked)
    os.kill(pid, signal.SIGKILL)
    resp = await asyncio.wait_for(waiting, 60)
    # The waiting request is answered at once: the older view (it has one), not a hang.
    assert computed_at(resp) == computed_at(first)
    (hooks / "tenants.block").unlink()

    async def replaced() -> bool:
        resp = await client.get("/v1/tenants", headers=ADMIN)
        return resp.status_code == 200 and computed_at(resp) > computed_at(first)

    await eventually("a new worker's view", replaced)
    assert state.views.worker_pid not in (None, pid)


# ---------------------------------------------------------------- counters counted in SQL

PREEMPTING = [
    "priority: its GPUs go to j-1",
    " reclaim : its GPUs go to j-2",
    "max_wait: waited 2h",
    "health: GPU 3 failed",
    "health",
    "healthy: no such policy",
    "preempted by admin",
    "Priority: capitalised",
    "",
    "x:y:z",
    "reclaim:no space",
]
REQUEUED = [
    "preempted: reclaim: its GPUs go to j-x",
    "preempted: preempted by admin",
    "preempted:  priority : two spaces",
    "preempted: health",
    "preempted: max_wait: waited",
    "preempted:reclaim: no space",
    "Preempted: reclaim: capitalised",
    "job failed (exit 3); retry 1 of 2",
    "job failedX",
    "JOB FAILED (exit 1)",
    "node h1 lost",
    "préempted: reclaim",
    "",
]


async def test_event_counters_in_sql_match_counting_every_message(seeded: Database) -> None:
    job, _ = await jobs.create_job(seeded, spec=job_spec(name="events"), tenant="alpha")
    rows = [("PREEMPTING", m) for m in PREEMPTING] + [("REQUEUED", m) for m in REQUEUED] + [("REQUEUED", REQUEUED[0])] * 3
    async with seeded.transaction() as session:
        for i, (kind, message) in enumerate(rows):
            session.add(JobEvent(job_id=job.id, ts=float(i), attempt=1, kind=kind, message=message, data={}, dedupe_key=f"e-{i}"))
        for i, kind in enumerate(["cordon", "xid", "xid", "uncordon"]):
            session.add(HealthEvent(ts=float(i), node_id="h1", kind=kind, severity="info", message="", data={}, dedupe_key=f"h-{i}"))
    expected: dict[tuple[str, str], int] = {}
    for kind, message in rows:
        reason = preemption_reason(message) if kind == "PREEMPTING" else requeue_reason(message)
        expected[(kind, reason)] = expected.get((kind, reason), 0) + 1
    counted: dict[tuple[str, str], int] = {}
    for kind, head, n in await observability.event_message_heads(seeded, ["PREEMPTING", "REQUEUED"]):
        reason = preemption_reason(head) if kind == "PREEMPTING" else requeue_reason(head)
        counted[(kind, reason)] = counted.get((kind, reason), 0) + n
    assert counted == expected
    assert await health.health_event_counts(seeded) == {"cordon": 1, "xid": 2, "uncordon": 1}


async def test_queue_wait_histogram_in_sql_matches_every_wait(seeded: Database) -> None:
    now = time.time()
    waits = [(1, 5.0), (1, 10.0), (2, 45.5), (2, 7200.0), (16, 100000.0), (1, -1.0)]  # the last never started on this attempt
    expected: dict[tuple[str, str, int], list[float]] = {}
    for i, (gpus, wait) in enumerate(waits):
        job, _ = await jobs.create_job(seeded, spec=job_spec(name=f"w{i}", gpu_count=gpus), tenant="alpha")
        async with seeded.transaction() as session:
            row = await session.get(Job, job.id)
            assert row is not None
            row.queued_at, row.started_at, row.state = now - 200000, now - 200000 + wait, "RUNNING"
        if wait >= 0:
            expected.setdefault(("alpha", "H100-80GB", gpus), []).append(wait)
    got = {(w.tenant, w.gpu_type, w.gpu_count): w for w in await observability.started_attempt_waits(seeded, WAIT_BUCKETS)}
    assert set(got) == set(expected)
    for key, values in expected.items():
        assert got[key].count == len(values)
        assert got[key].at_most == tuple(sum(1 for v in values if v <= b) for b in WAIT_BUCKETS)
        assert got[key].sum_s == pytest.approx(sum(values), rel=1e-9)


async def test_every_view_is_computed_in_the_worker_with_the_answer_an_in_process_computation_gives(served: Served) -> None:
    client, state = served
    for name, token in (("a1", ALPHA), ("b1", BETA), ("a2", ALPHA)):
        tenant = "alpha" if token is ALPHA else "beta"
        job = (await client.post("/v1/jobs", json=spec_dict(name=name, checkpoint_dir=f"/ckpt/{tenant}/x"), headers=token)).json()
        await jobs.mark_queued(state.db, job_id=job["job"]["id"], attempt=1)
    answer = (await client.get("/v1/queue", headers=ADMIN)).json()
    expected = await insight.queue_view(state.db, state.settings)
    assert [(e["position"], e["job"]["id"]) for e in answer] == sorted((p, j) for j, p in expected.position.items())
    assert [e["job"]["name"] for e in answer] == ["a1", "b1", "a2"]
    fleet = (await client.get("/v1/fleet", headers=ADMIN)).json()
    in_process = await insight.fleet_view(state.db, state.settings)
    assert [(n["id"], n["state"], n["gpu_health"]) for n in fleet["nodes"]] == [
        (n["id"], n["state"], n["gpu_health"]) for n in in_process["nodes"]
    ]
    assert {t: g["total"] for t, g in fleet["gpu_types"].items()} == {t: g["total"] for t, g in in_process["gpu_types"].items()}
    tenants = (await client.get("/v1/tenants", headers=ADMIN)).json()
    assert [t["name"] for t in tenants] == [t["name"] for t in await insight.tenant_usage(state.db, state.settings)]
    assert (await client.get("/metrics")).status_code == 200
    worker = state.views.worker_pid
    assert worker is not None and worker != os.getpid()
    for name in views.ORDER:
        view = state.views.cached(name)
        assert view is not None and view.pid == worker, name


def children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


async def test_a_costly_simulation_runs_in_a_process_of_its_own_with_the_same_answer(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, state = served
    monkeypatch.setattr(views, "PROCESS_CPU_S", 0.0)  # every simulation after the first (in a thread) counts as costly
    for name, token in (("a1", ALPHA), ("b1", BETA), ("a2", ALPHA)):
        tenant = "alpha" if token is ALPHA else "beta"
        job = (await client.post("/v1/jobs", json=spec_dict(name=name, checkpoint_dir=f"/ckpt/{tenant}/x"), headers=token)).json()
        await jobs.mark_queued(state.db, job_id=job["job"]["id"], attempt=1)
    in_thread = (await client.get("/v1/queue", headers=ADMIN)).json()
    assert [e["job"]["name"] for e in in_thread] == ["a1", "b1", "a2"]
    worker = state.views.worker_pid
    assert worker is not None
    await nodes.set_node_state(state.db, node_id="h1", state="CORDONED")

    async def in_process() -> bool:
        await client.get("/v1/queue", headers=ADMIN)
        return state.views.computations["queue"] >= 3

    await eventually("a simulation in a process of its own", in_process)
    assert children(worker)
    answer = (await client.get("/v1/queue", headers=ADMIN)).json()
    assert [(e["position"], e["job"]["id"]) for e in answer] == [(e["position"], e["job"]["id"]) for e in in_thread]
