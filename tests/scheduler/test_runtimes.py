"""Learned run times from the store to the snapshot: successful runs -> the predictor -> each waiting job's
expected run time and each running job's expected end (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update

from fairgang.members import PlacedMember
from fairgang.settings import Settings
from fairgang.spec import JobState
from scheduler.core import Decisions, SchedulerConfig, Snapshot
from scheduler.runtimes import LearnedRuntimes
from scheduler.service import PlacementService
from scheduler.snapshot import SnapshotReader
from store import jobs, placement
from store.db import Database
from store.models import Job
from tests.builders import job_spec

T0 = 1_000_000.0
STALE = 1e12
HOUR = 3600.0
CONFIG = SchedulerConfig()


async def _succeeded(db: Database, tenant: str, name: str, runtime: float, at: float) -> None:
    job, _ = await jobs.create_job(db, spec=job_spec(name=name, idempotency_key=f"{name}-{at}"), tenant=tenant, now=at - runtime - 10)
    await jobs.record_transition(db, job_id=job.id, attempt=1, state=JobState.RUNNING, event_key="run", now=at - runtime)
    await jobs.record_transition(db, job_id=job.id, attempt=1, state=JobState.SUCCEEDED, event_key="end", exit_code=0, now=at)


async def _queued(db: Database, tenant: str, name: str, at: float, **spec: Any) -> str:
    job, _ = await jobs.create_job(db, spec=job_spec(name=name, idempotency_key=f"q-{name}-{at}", **spec), tenant=tenant, now=at)
    await jobs.mark_queued(db, job_id=job.id, attempt=1, now=at)
    return job.id


async def _running(db: Database, tenant: str, name: str, at: float, node: str) -> str:
    job_id = await _queued(db, tenant, name, at - 1, gpu_count=8)
    epoch = await placement.acquire_lease(db, name="placement", holder="test", ttl_s=1e9, now=at)
    assert epoch is not None
    members = [PlacedMember(node_id=node, gpu_indices=list(range(8)), rank=0)]
    row = placement.BindingRow(job_id=job_id, attempt=1, members=members)
    await placement.commit_bindings(db, bindings=[row], pending_reasons={}, lease_name="placement", epoch=epoch, now=at)
    await jobs.record_transition(db, job_id=job_id, attempt=1, state=JobState.RUNNING, event_key="run", now=at)
    return job_id


async def _history(db: Database) -> None:
    """alpha's "train" ran 100, 300, then 500 s; its "other" 1000 s (alpha's last two runs: 500 and 1000)."""
    for i, runtime in enumerate((100.0, 300.0, 500.0)):
        await _succeeded(db, "alpha", "train", runtime, T0 - 5000 + i * 1000)
    await _succeeded(db, "alpha", "other", 1000.0, T0 - 1000)


async def test_waiting_and_running_jobs_get_run_times_learned_per_tenant_and_job_name(seeded: Database) -> None:
    await _history(seeded)
    train = await _queued(seeded, "alpha", "train", T0)
    new = await _queued(seeded, "alpha", "new", T0)
    other_tenant = await _queued(seeded, "beta", "train", T0)
    running = await _running(seeded, "alpha", "train", T0, "h1")
    reader = SnapshotReader()
    snap = await reader.read(seeded, now=T0 + 100, stale_after_s=STALE, config=CONFIG)
    expected = {j.id: j.expected_runtime_s for j in snap.pending}
    # The job name's last two runs; another name of the tenant: the tenant's last two; beta: nothing, its limit (1 h).
    assert expected == {train: 400.0, new: 750.0, other_tenant: HOUR}
    (run,) = snap.running
    assert (run.id, run.started_at, run.expected_end, run.max_end) == (running, T0, T0 + 400.0, T0 + HOUR)
    # Outlived: the prediction doubles (800 s), then doubles again, and never passes the limit.
    snap = await reader.read(seeded, now=T0 + 400, stale_after_s=STALE, config=CONFIG)
    assert snap.running[0].expected_end == T0 + 800.0
    snap = await reader.read(seeded, now=T0 + 3300, stale_after_s=STALE, config=CONFIG)
    assert snap.running[0].expected_end == T0 + HOUR
    # The error ratios the intervals come from: 100/3600, then 300/100, 500/200, 1000/400 (alpha's mean).
    assert reader.runtimes.predictor.quantiles((0.0, 1.0)) == (100.0 / HOUR, 3.0)


async def test_a_kept_reader_learns_new_runs_incrementally_at_most_every_refresh_and_keeps_unchanged_views(seeded: Database) -> None:
    await _history(seeded)
    train = await _queued(seeded, "alpha", "train", T0)
    beta = await _queued(seeded, "beta", "bert", T0)
    reader = SnapshotReader(runtimes=LearnedRuntimes(refresh_s=60.0))
    first = await reader.read(seeded, now=T0, stale_after_s=STALE, config=CONFIG)
    assert {j.id: j.expected_runtime_s for j in first.pending} == {train: 400.0, beta: HOUR}
    await _succeeded(seeded, "alpha", "train", 1200.0, T0 + 5)
    # Within the refresh interval: nothing read, every view the very same object.
    second = await reader.read(seeded, now=T0 + 30, stale_after_s=STALE, config=CONFIG)
    assert all(a is b for a, b in zip(first.pending, second.pending, strict=True))
    # After it: the new run (500 and 1200: 850 s); beta's view is kept as it was.
    third = await reader.read(seeded, now=T0 + 61, stale_after_s=STALE, config=CONFIG)
    by_id = {j.id: j for j in third.pending}
    assert by_id[train].expected_runtime_s == 850.0
    assert by_id[beta] is next(j for j in first.pending if j.id == beta)
    assert len(reader.runtimes.predictor) == 5


class _Signals:
    """Accepts every workflow signal."""

    def get_workflow_handle(self, workflow_id: str) -> Any:
        return self

    async def signal(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def start_workflow(self, *args: Any, **kwargs: Any) -> Any:
        return None


def _service(db: Database) -> PlacementService:
    return PlacementService(Settings(database_url=db.url), db, _Signals(), holder="test")  # type: ignore[arg-type]


async def _cycle(service: PlacementService, now: float) -> Snapshot:
    """One cycle of ``service`` as leader; the snapshot it decided on."""
    seen: list[Snapshot] = []
    decide = service.scheduler.run_cycle

    def spy(snapshot: Snapshot, now: float) -> Decisions:
        seen.append(snapshot)
        return decide(snapshot, now)

    service.scheduler.run_cycle = spy  # type: ignore[method-assign]
    assert (await service.cycle(now=now)).leader
    (snap,) = seen
    return snap


async def _one_waiting_behind_two_running(db: Database) -> str:
    """alpha's "train" and "other" hold both H100 nodes; an 8-GPU "train" waits (its id)."""
    await _history(db)
    await _running(db, "alpha", "train", T0, "h1")
    await _running(db, "alpha", "other", T0, "h2")
    waiting = await _queued(db, "alpha", "train", T0 + 1, gpu_count=8)
    # Workflows are started by the API: mark them so, the reconciler has nothing to start.
    async with db.transaction() as session:
        await session.execute(update(Job).values(workflow_started=True))
    return waiting


async def test_the_placement_service_decides_on_the_learned_run_times(seeded: Database) -> None:
    waiting = await _one_waiting_behind_two_running(seeded)
    snap = await _cycle(_service(seeded), T0 + 10)
    assert {j.id: j.expected_runtime_s for j in snap.pending} == {waiting: 400.0}
    # "other" has a single run of its own (1000 s): its name's mean.
    assert sorted(r.expected_end - r.started_at for r in snap.running) == [400.0, 1000.0]


async def test_a_waiting_attempt_keeps_the_run_time_predicted_when_it_was_first_seen(seeded: Database) -> None:
    waiting = await _one_waiting_behind_two_running(seeded)
    placement_service = _service(seeded)
    snap = await _cycle(placement_service, T0 + 10)
    assert {j.id: j.expected_runtime_s for j in snap.pending} == {waiting: 400.0}
    stored = await jobs.get_job(seeded, waiting)
    assert stored is not None and (stored.predicted_attempt, stored.predicted_runtime_s) == (1, 400.0)
    # "train" runs 2,000 s: the predictor now says 1,250 s (500 and 2,000). The running "train" job is told so; the
    # waiting attempt keeps what it was told, in this service and in a restarted one.
    await _succeeded(seeded, "alpha", "train", 2000.0, T0 + 20)
    snap = await _cycle(placement_service, T0 + 100)
    assert sorted(r.expected_end - r.started_at for r in snap.running) == [1000.0, 1250.0]
    assert {j.id: j.expected_runtime_s for j in snap.pending} == {waiting: 400.0}
    snap = await _cycle(_service(seeded), T0 + 200)
    assert {j.id: j.expected_runtime_s for j in snap.pending} == {waiting: 400.0}
    # A new attempt is predicted afresh, and keeps that.
    async with seeded.transaction() as session:
        await session.execute(update(Job).where(Job.id == waiting).values(attempt=2))  # type: ignore[arg-type]
    snap = await _cycle(placement_service, T0 + 300)
    assert {j.id: j.expected_runtime_s for j in snap.pending} == {waiting: 1250.0}
    stored = await jobs.get_job(seeded, waiting)
    assert stored is not None and (stored.predicted_attempt, stored.predicted_runtime_s) == (2, 1250.0)
