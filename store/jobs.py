"""Jobs: submission, reads, and every state change of a job, each logged once in its event log.

A terminal transition or a requeue releases the job's live allocations in the same transaction
(:func:`store.placement.release_live`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import func, not_, select, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import col

from fairgang.admission import job_cap_problem
from fairgang.spec import PRIORITY_CLASSES, JobSpec, JobState
from store.common import LIVE_ALLOCATION_STATES, TERMINAL, add_event_once, new_event, new_id
from store.db import Database, bump_change_feed
from store.models import Allocation, Job, JobEvent
from store.placement import release_live


async def create_job(
    db: Database,
    *,
    spec: JobSpec,
    tenant: str,
    max_concurrent_jobs: int | None = None,
    now: float | None = None,
    job_id: str | None = None,
) -> tuple[Job, bool]:
    """Insert a queued job, or return the one already submitted with the same key.

    The idempotency key is the client's, else the job name (SPEC R1.3). The concurrent
    job cap is checked in the same transaction as the insert. ``job_id`` gives the job a
    caller-chosen id (a sweep's trials: sweep id + trial index) instead of a random one.

    Returns:
        (job, created): created is False when the key was already used.

    Raises:
        AdmissionRefused: when the tenant is at its concurrent-job cap.
    """
    now = time.time() if now is None else now
    key = spec.idempotency_key or f"name:{spec.name}"
    existing = await find_job_by_key(db, tenant=tenant, key=key)
    if existing is not None:
        return existing, False
    job = Job(
        id=job_id or new_id("j"),
        tenant=tenant,
        name=spec.name,
        idempotency_key=key,
        spec=spec.stored(tenant),
        gpu_type=spec.gpu_type,
        gpu_count=spec.min_gpus,
        gpu_max=spec.max_gpus if spec.elastic else None,
        priority=spec.priority,
        state=JobState.QUEUED.value,
        attempt=1,
        pending_reason="waiting for its workflow to start",
        created_at=now,
        updated_at=now,
        queued_at=now,
    )
    try:
        async with db.transaction() as session:
            if max_concurrent_jobs is not None:
                active = (
                    await session.execute(
                        select(func.count()).select_from(Job).where(col(Job.tenant) == tenant, col(Job.state).not_in(TERMINAL))
                    )
                ).scalar_one()
                refused = job_cap_problem(tenant, active, max_concurrent_jobs)
                if refused is not None:
                    raise AdmissionRefused(refused.field, refused.reason)
            session.add(job)
            await session.flush()
            session.add(new_event(job.id, 1, "SUBMITTED", f"submitted by tenant {tenant}", "submitted", now))
    except IntegrityError:
        # A concurrent submit with the same key won the race: return its job.
        existing = await find_job_by_key(db, tenant=tenant, key=key)
        if existing is None:
            raise
        return existing, False
    return job, True


class StalePlacement(Exception):
    """A placement names an allocation the store does not hold for that job and attempt."""


class AdmissionRefused(Exception):
    """The job is valid but this tenant may not run it (SPEC R2.1)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


async def find_job_by_key(db: Database, *, tenant: str, key: str) -> Job | None:
    async with db.sessions() as session:
        return (await session.execute(select(Job).where(col(Job.tenant) == tenant, col(Job.idempotency_key) == key))).scalar_one_or_none()


async def get_job(db: Database, job_id: str) -> Job | None:
    async with db.sessions() as session:
        return await session.get(Job, job_id)


async def list_jobs(
    db: Database,
    *,
    tenant: str | None = None,
    state: str | None = None,
    limit: int = 200,
    labels: dict[str, str] | None = None,
    since: float | None = None,
    until: float | None = None,
    search: str | None = None,
    after: tuple[float, str] | None = None,
) -> Sequence[Job]:
    """Jobs, newest submission first (then by id): of ``tenant``, in ``state``, carrying every one of ``labels``,
    submitted in [``since``, ``until``), whose id is ``search`` or whose name holds it (any case), and (a page
    after another) after ``after``, the (created_at, id) of the last job of the page before."""
    query = select(Job).order_by(col(Job.created_at).desc(), col(Job.id)).limit(limit)
    if tenant is not None:
        query = query.where(col(Job.tenant) == tenant)
    if state is not None:
        query = query.where(col(Job.state) == state)
    for key, value in sorted((labels or {}).items()):
        query = query.where(col(Job.spec)[("labels", key)].as_string() == value)
    if since is not None:
        query = query.where(col(Job.created_at) >= since)
    if until is not None:
        query = query.where(col(Job.created_at) < until)
    if search is not None:
        query = query.where((col(Job.id) == search) | col(Job.name).icontains(search, autoescape=True))
    if after is not None:
        created, job_id = after
        query = query.where((col(Job.created_at) < created) | ((col(Job.created_at) == created) & (col(Job.id) > job_id)))
    async with db.sessions() as session:
        return (await session.execute(query)).scalars().all()


async def job_events(db: Database, job_id: str) -> Sequence[JobEvent]:
    async with db.sessions() as session:
        query = select(JobEvent).where(col(JobEvent.job_id) == job_id).order_by(col(JobEvent.id))
        return (await session.execute(query)).scalars().all()


async def job_allocations(db: Database, job_id: str) -> Sequence[Allocation]:
    async with db.sessions() as session:
        query = select(Allocation).where(col(Allocation.job_id) == job_id).order_by(col(Allocation.attempt), col(Allocation.created_at))
        return (await session.execute(query)).scalars().all()


async def jobs_without_workflow(db: Database, *, older_than: float, limit: int | None = None) -> Sequence[Job]:
    """Jobs whose workflow start may have been lost (the API died in between), oldest first (at most ``limit``)."""
    async with db.sessions() as session:
        query = (
            select(Job)
            .where(
                not_(col(Job.workflow_started)),  # matches the partial index ix_job_without_workflow
                col(Job.state).not_in(TERMINAL),
                col(Job.created_at) < older_than,
            )
            .order_by(col(Job.created_at), col(Job.id))
            .limit(limit)
        )
        return (await session.execute(query)).scalars().all()


async def mark_workflow_started(db: Database, job_id: str) -> None:
    await mark_workflows_started(db, [job_id])


async def mark_workflows_started(db: Database, job_ids: Sequence[str]) -> None:
    """Record that these jobs' workflows exist (one statement)."""
    if not job_ids:
        return
    async with db.transaction() as session:
        await session.execute(update(Job).where(col(Job.id).in_(list(job_ids))).values(workflow_started=True))


async def record_transition(
    db: Database,
    *,
    job_id: str,
    attempt: int,
    state: JobState,
    event_key: str,
    message: str = "",
    allocation_id: str | None = None,
    exit_code: int | None = None,
    end_reason: str | None = None,
    pending_reason: str | None = None,
    now: float | None = None,
) -> Job:
    """Move a job to ``state`` for ``attempt`` and log it, once.

    Idempotent by ``event_key``: a repeat returns the job unchanged. A terminal job, or
    a transition for an older attempt, changes nothing. Moving to a terminal state
    releases the job's live allocations in the same transaction; moving to LAUNCHING
    acknowledges ``allocation_id``.
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        job = await session.get(Job, job_id)
        if job is None:
            raise LookupError(f"job {job_id} does not exist")
        if job.state in TERMINAL or attempt < job.attempt:
            return job
        if not await add_event_once(
            session,
            new_event(job_id, attempt, state.value, message, event_key, now, allocation_id=allocation_id, exit_code=exit_code),
        ):
            return job
        job.state, job.updated_at = state.value, now
        if state is JobState.LAUNCHING and allocation_id is not None:
            alloc = await session.get(Allocation, allocation_id)
            if alloc is None or alloc.job_id != job_id or alloc.attempt != attempt or alloc.state not in LIVE_ALLOCATION_STATES:
                raise StalePlacement(f"allocation {allocation_id} is not a live binding of {job_id} attempt {attempt}")
            job.pending_reason = job.pending_code = None
            if alloc.state == "BOUND":
                alloc.state, alloc.acked_at = "ACKED", now
        if state is JobState.RUNNING and job.started_at is None:
            job.started_at = now
        if pending_reason is not None:
            job.pending_reason, job.pending_code = pending_reason, None
        if state.terminal:
            job.finished_at, job.exit_code, job.end_reason = now, exit_code, end_reason or message
            job.pending_reason = job.pending_code = None
            await release_live(session, job_id, now)
        return job


async def requeue_job(db: Database, *, job_id: str, from_attempt: int, reason: str, now: float | None = None) -> Job:
    """Release the attempt's GPUs and queue the job again as attempt + 1 (idempotent)."""
    now = time.time() if now is None else now
    async with db.transaction() as session:
        job = await session.get(Job, job_id)
        if job is None:
            raise LookupError(f"job {job_id} does not exist")
        if job.state in TERMINAL or job.attempt != from_attempt:
            return job
        await release_live(session, job_id, now)
        job.attempt = from_attempt + 1
        job.state, job.updated_at, job.queued_at = JobState.QUEUED.value, now, now
        job.pending_reason, job.pending_code = f"requeued: {reason}", None
        session.add(new_event(job_id, job.attempt, "REQUEUED", reason, f"requeue-{from_attempt}", now))
        await bump_change_feed(session)
        return job


async def mark_queued(db: Database, *, job_id: str, attempt: int, now: float | None = None) -> Job:
    """The workflow is waiting for placement: make the job visible to the scheduler."""
    now = time.time() if now is None else now
    async with db.transaction() as session:
        job = await session.get(Job, job_id)
        if job is None:
            raise LookupError(f"job {job_id} does not exist")
        changed = False
        if not job.workflow_started:
            job.workflow_started, changed = True, True
        if job.state == JobState.QUEUED.value and job.pending_reason == "waiting for its workflow to start":
            job.pending_reason, job.pending_code, changed = "waiting for placement", None, True
        if changed:
            job.updated_at = now
            await bump_change_feed(session)
        return job


async def set_latest_checkpoint(
    db: Database,
    *,
    job_id: str,
    checkpoint: str,
    attempt: int | None = None,
    seq: int = 0,
    generation: float = 0.0,
    now: float | None = None,
) -> bool:
    """Record the job's newest checkpoint (idempotent per path); True if it is the job's latest checkpoint now.

    Reports are ordered by attempt, then ``generation`` (when the allocation it came from was made: an elastic
    job's resize makes a new one in the same attempt, whose launch numbers its reports from 1 again), then ``seq``
    (the report's number within its launch, 0 when its agent does not number them); both are kept in the
    ``CHECKPOINT`` event's data, one event per numbered report. One older than the newest recorded was reported
    before it and comes late (a write retried, or slower than the next one's), and is ignored.
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        job = await session.get(Job, job_id, with_for_update=True)  # one checkpoint write of a job at a time
        if job is None:
            return False
        attempt = attempt or job.attempt
        newest = (
            await session.execute(
                select(col(JobEvent.attempt), col(JobEvent.data))
                .where(col(JobEvent.job_id) == job_id, col(JobEvent.kind) == "CHECKPOINT")
                .order_by(col(JobEvent.id).desc())
                .limit(1)
            )
        ).first()
        if newest is not None and (attempt, generation, seq) < (
            newest[0],
            float(newest[1].get("generation", 0.0)),
            int(newest[1].get("seq", 0)),
        ):
            return False
        if job.latest_checkpoint == checkpoint:
            return True
        job.latest_checkpoint, job.latest_checkpoint_at = checkpoint, now
        # A numbered report is an event of its own (a job that reuses checkpoint names reports a path again).
        key = (f"checkpoint:{attempt}:{generation:.6f}:{seq}:{checkpoint}" if seq else f"checkpoint:{checkpoint}")[:160]
        await add_event_once(session, new_event(job_id, attempt, "CHECKPOINT", checkpoint, key, now, seq=seq, generation=generation))
        return True


class NotQueued(Exception):
    """The job is not waiting for placement (held, or queued): it cannot be held, released or changed."""


HELD_REASON = "held: it waits for `fairgang release` (POST /v1/jobs/{id}/release)"


async def _move_waiting(db: Database, job_id: str, *, to: JobState, verb: str, reason: str, by: str, now: float | None) -> Job:
    """Move a waiting job between QUEUED and HELD under its row lock (a binding's compare-and-set needs QUEUED);
    one already there is answered as it is."""
    source = JobState.HELD if to is JobState.QUEUED else JobState.QUEUED
    now = time.time() if now is None else now
    async with db.transaction() as session:
        job = await session.get(Job, job_id, with_for_update=True)
        if job is None:
            raise LookupError(f"no job {job_id}")
        if job.state == to.value:
            return job
        if job.state != source.value:
            raise NotQueued(f"job {job_id} is {job.state}: only a {source.value.lower()} job can be {verb}")
        job.state, job.updated_at = to.value, now
        job.pending_reason, job.pending_code = reason, None
        kind = "HELD" if to is JobState.HELD else "RELEASED"
        session.add(new_event(job_id, job.attempt, kind, f"{verb} by {by}", f"{kind.lower()}-{now}", now))
        await bump_change_feed(session)
        return job


async def hold_job(db: Database, job_id: str, *, by: str, now: float | None = None) -> Job:
    """Keep a queued job from placement (state HELD) until it is released; holding a held job changes nothing.

    Raises:
        LookupError: no such job. NotQueued: the job is placed, running or ended.
    """
    reason = HELD_REASON.replace("{id}", job_id)
    return await _move_waiting(db, job_id, to=JobState.HELD, verb="held", reason=reason, by=by, now=now)


async def release_job(db: Database, job_id: str, *, by: str, now: float | None = None) -> Job:
    """Let a held job be placed again (state QUEUED, in its place in the queue); releasing a queued job changes nothing.

    Raises:
        LookupError: no such job. NotQueued: the job is placed, running or ended.
    """
    return await _move_waiting(db, job_id, to=JobState.QUEUED, verb="released", reason="waiting for placement", by=by, now=now)


async def update_waiting_job(
    db: Database, job_id: str, *, by: str, priority_class: str | None = None, max_runtime: float | None = None, now: float | None = None
) -> Job:
    """Lower a queued or held job's priority class or shorten its max runtime (never the other way: that would
    be a new job's claim, subject to admission).

    Raises:
        LookupError: no such job. NotQueued: placed, running or ended. ValueError: a raise, or nothing to change.
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        job = await session.get(Job, job_id, with_for_update=True)
        if job is None:
            raise LookupError(f"no job {job_id}")
        if job.state not in (JobState.QUEUED.value, JobState.HELD.value):
            raise NotQueued(f"job {job_id} is {job.state}: only a queued or held job can be changed")
        spec = dict(job.spec)
        changes = []
        if priority_class is not None:
            if priority_class not in PRIORITY_CLASSES:
                raise ValueError(f"priority_class: unknown class '{priority_class}' (one of {', '.join(PRIORITY_CLASSES)})")
            if PRIORITY_CLASSES[priority_class] > job.priority:
                raise ValueError(
                    f"priority_class: '{priority_class}' is above the job's ('{spec.get('priority_class')}'): it can only go down"
                )
            job.priority, spec["priority_class"] = PRIORITY_CLASSES[priority_class], priority_class
            changes.append(f"priority class {priority_class}")
        if max_runtime is not None:
            if not 0 < max_runtime <= float(spec["max_runtime"]):
                raise ValueError(f"max_runtime: {max_runtime:g}s is not above 0 and at most the job's {float(spec['max_runtime']):g}s")
            spec["max_runtime"] = max_runtime
            changes.append(f"max runtime {max_runtime:g}s")
        if not changes:
            raise ValueError("nothing to change: give priority_class or max_runtime")
        job.spec, job.updated_at = spec, now
        session.add(new_event(job_id, job.attempt, "UPDATED", f"{', '.join(changes)} (by {by})", f"updated-{now}", now))
        await bump_change_feed(session)
        return job


class NotOnThisNode(Exception):
    """A node reported for an allocation whose rank 0 it does not run."""


async def report_checkpoint(db: Database, *, node_id: str, allocation_id: str, path: str, seq: int, now: float | None = None) -> bool:
    """A node's agent reports the newest checkpoint of the rank 0 member it runs (the job's LATEST marker).

    Checkpoints reach the store this way, not through the job's workflow, whose history would grow with every
    one; the workflow reads the latest when it launches an attempt again. Only the node running rank 0 of the
    allocation may report for it. True if the path is the job's latest checkpoint now (as
    :func:`set_latest_checkpoint`).

    Raises:
        LookupError: the allocation does not exist.
        NotOnThisNode: rank 0 of the allocation runs elsewhere.
    """
    async with db.sessions() as session:
        alloc = await session.get(Allocation, allocation_id)
    if alloc is None:
        raise LookupError(f"allocation {allocation_id} does not exist")
    if not any(m["rank"] == 0 and m["node_id"] == node_id for m in alloc.members):
        raise NotOnThisNode(f"rank 0 of allocation {allocation_id} does not run on node {node_id}")
    return await set_latest_checkpoint(
        db, job_id=alloc.job_id, checkpoint=path, attempt=alloc.attempt, seq=seq, generation=alloc.created_at, now=now
    )


async def latest_checkpoint(db: Database, job_id: str) -> str:
    """The job's latest recorded checkpoint ("" if none)."""
    async with db.sessions() as session:
        found = (await session.execute(select(col(Job.latest_checkpoint)).where(col(Job.id) == job_id))).scalar_one_or_none()
    return found or ""


async def queued_jobs(db: Database) -> Sequence[Job]:
    async with db.sessions() as session:
        query = (
            select(Job)
            .where(col(Job.state) == JobState.QUEUED.value, col(Job.workflow_started) == True)  # noqa: E712
            .order_by(col(Job.queued_at), col(Job.id))
        )
        return (await session.execute(query)).scalars().all()


async def job_states(db: Database, job_ids: Sequence[str]) -> dict[str, str]:
    """Job id -> state, for the ids that exist."""
    if not job_ids:
        return {}
    async with db.sessions() as session:
        rows = (await session.execute(select(col(Job.id), col(Job.state)).where(col(Job.id).in_(list(job_ids))))).all()
    return {job_id: state for job_id, state in rows}


async def job_names(db: Database, job_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Job id -> (tenant, name), plain columns."""
    out: dict[str, tuple[str, str]] = {}
    ids = list(job_ids)
    async with db.sessions() as session:
        for start in range(0, len(ids), 5000):
            query = select(col(Job.id), col(Job.tenant), col(Job.name)).where(col(Job.id).in_(ids[start : start + 5000]))
            out.update({i: (t, n) for i, t, n in (await session.execute(query)).all()})
    return out
