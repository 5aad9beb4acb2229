"""The reads behind metrics, estimates and the API's cached views, on both backends."""

from __future__ import annotations

from fairgang.spec import JobState
from store import health, jobs, nodes, observability
from store.db import Database
from tests.builders import job_spec


async def test_the_view_version_moves_with_every_submission_cordon_and_health_event(seeded: Database) -> None:
    start = await observability.view_version(seeded)
    job, _ = await jobs.create_job(seeded, spec=job_spec(name="a"), tenant="alpha")
    submitted = await observability.view_version(seeded)
    assert submitted[1] > start[1] and submitted[0] == start[0]
    await nodes.set_node_state(seeded, node_id="h1", state="CORDONED")
    cordoned = await observability.view_version(seeded)
    assert cordoned[0] > submitted[0]
    for key in ("c-1", "c-2"):
        before = await observability.view_version(seeded)
        await health.add_health_event(seeded, node_id="h1", kind="cordon", key=key)
        assert (await observability.view_version(seeded))[2] > before[2]
    await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.CANCELLED, event_key="cancel")
    assert (await observability.view_version(seeded))[1] > submitted[1]


async def test_recent_events_are_newest_first_per_tenant_and_runtimes_are_the_succeeded_jobs(seeded: Database) -> None:
    a, _ = await jobs.create_job(seeded, spec=job_spec(name="a"), tenant="alpha", now=100.0)
    b, _ = await jobs.create_job(seeded, spec=job_spec(name="b"), tenant="beta", now=100.0)
    for job in (a, b):
        await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.RUNNING, event_key="run", now=110.0)
    await jobs.record_transition(seeded, job_id=a.id, attempt=1, state=JobState.SUCCEEDED, event_key="end", exit_code=0, now=150.0)
    await jobs.record_transition(seeded, job_id=b.id, attempt=1, state=JobState.FAILED, event_key="end", exit_code=1, now=160.0)
    ends = await observability.recent_events(seeded, ["SUCCEEDED", "FAILED"])
    assert [(e.kind, j.id) for e, j in ends] == [("FAILED", b.id), ("SUCCEEDED", a.id)]
    assert [(e.kind, j.tenant) for e, j in await observability.recent_events(seeded, ["RUNNING"], tenant="alpha")] == [("RUNNING", "alpha")]
    runs = await observability.successful_runs(seeded)
    assert [(r.tenant, r.name, r.runtime_s, r.max_runtime_s) for r in runs] == [("alpha", "a", 40.0, 3600.0)]


async def test_successful_runs_are_read_oldest_first_and_after_the_last_event_read(seeded: Database) -> None:
    ended = []
    for i, runtime in enumerate((30.0, 10.0, 20.0)):
        job, _ = await jobs.create_job(seeded, spec=job_spec(name=f"j{i}"), tenant="alpha", now=100.0)
        await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.RUNNING, event_key="run", now=100.0)
        await jobs.record_transition(
            seeded, job_id=job.id, attempt=1, state=JobState.SUCCEEDED, event_key="end", exit_code=0, now=100.0 + runtime
        )
        ended.append(runtime)
    cancelled, _ = await jobs.create_job(seeded, spec=job_spec(name="c"), tenant="alpha", now=100.0)
    await jobs.record_transition(seeded, job_id=cancelled.id, attempt=1, state=JobState.CANCELLED, event_key="end", now=200.0)
    everything = await observability.successful_runs(seeded)
    assert [r.runtime_s for r in everything] == ended
    assert [r.runtime_s for r in await observability.successful_runs(seeded, limit=2)] == ended[1:]
    after = await observability.successful_runs(seeded, after_event=everything[0].event_id)
    assert [r.runtime_s for r in after] == ended[1:]
    assert await observability.successful_runs(seeded, after_event=everything[-1].event_id) == []
