"""The reads behind metrics, estimates and the API's cached views, each counted or cut down in SQL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, literal, select
from sqlmodel import col

from fairgang.spec import JobState
from store.db import Database
from store.models import ChangeFeed, HealthEvent, Job, JobEvent


@dataclass(frozen=True)
class StartedWaits:
    """Jobs of one (tenant, GPU type, GPU count) whose current attempt started: how long those attempts waited in the queue."""

    tenant: str
    gpu_type: str
    gpu_count: int
    count: int
    sum_s: float
    #: How many waited at most each of the given bounds (cumulative, as a histogram's buckets).
    at_most: tuple[int, ...]


async def started_attempt_waits(db: Database, bounds: Sequence[float]) -> list[StartedWaits]:
    """The queue waits of every job whose current attempt started (RUNNING or ended after running), counted in SQL."""
    wait = col(Job.started_at) - col(Job.queued_at)
    buckets = [func.sum(case((wait <= bound, 1), else_=0)) for bound in bounds]
    async with db.sessions() as session:
        query = (
            select(col(Job.tenant), col(Job.gpu_type), col(Job.gpu_count), func.count(), func.sum(wait), *buckets)
            .where(col(Job.started_at).is_not(None), col(Job.started_at) >= col(Job.queued_at))
            .group_by(col(Job.tenant), col(Job.gpu_type), col(Job.gpu_count))
        )
        rows = (await session.execute(query)).all()
    return [
        StartedWaits(tenant=t, gpu_type=g, gpu_count=n, count=int(c), sum_s=float(total or 0.0), at_most=tuple(int(b or 0) for b in rest))
        for t, g, n, c, total, *rest in rows
    ]


def _before_colon(db: Database, text_: Any) -> Any:
    """SQL for Python's ``text.split(":", 1)[0]``."""
    if db.sqlite:
        at = func.instr(text_, ":")
        return case((at > 0, func.substr(text_, 1, at - 1)), else_=text_)
    return func.split_part(text_, ":", 1)


async def event_message_heads(db: Database, kinds: Sequence[str]) -> list[tuple[str, str, int]]:
    """(kind, head, count) of the job events of these kinds, counted in SQL.

    The head is the part of the message that names its reason: for PREEMPTING and RESIZED the text
    before the first ``:`` (a resize's direction and reason: ``grow (idle)``); for other kinds
    ``"preempted: "`` and the text up to the next ``:`` after it, else ``"job failed"``, else ``""``.
    ``api.metrics.preemption_reason`` and ``requeue_reason`` give the same answer for the head as for
    the whole message.
    """
    message = col(JobEvent.message)
    prefix = "preempted: "
    head = case(
        (col(JobEvent.kind).in_(("PREEMPTING", "RESIZED")), _before_colon(db, message)),
        (func.substr(message, 1, len(prefix)) == prefix, literal(prefix) + _before_colon(db, func.substr(message, len(prefix) + 1))),
        (func.substr(message, 1, len("job failed")) == "job failed", literal("job failed")),
        else_=literal(""),
    ).label("head")
    async with db.sessions() as session:
        query = select(col(JobEvent.kind), head, func.count()).where(col(JobEvent.kind).in_(list(kinds))).group_by(col(JobEvent.kind), head)
        return [(k, h, int(n)) for k, h, n in (await session.execute(query)).all()]


async def view_version(db: Database) -> tuple[int, int, int]:
    """What the API's cached views are keyed on: the change feed's version and the newest job and health event ids.

    Every one only grows, and one of them moves with every submission, state change, binding, cordon
    or health event (heartbeats' measurements and timestamps move none; views also expire by age).
    """
    async with db.sessions() as session:
        version = select(col(ChangeFeed.version)).where(col(ChangeFeed.id) == 1).scalar_subquery()
        events = select(func.max(col(JobEvent.id))).scalar_subquery()
        health = select(func.max(col(HealthEvent.id))).scalar_subquery()
        row = (await session.execute(select(version, events, health))).one()
    return int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)


async def recent_events(db: Database, kinds: Sequence[str], *, tenant: str | None = None, limit: int = 50) -> list[tuple[JobEvent, Job]]:
    """The latest job events of these kinds with their jobs, newest first (one tenant's, if given)."""
    async with db.sessions() as session:
        query = select(JobEvent, Job).join(Job, col(Job.id) == col(JobEvent.job_id)).where(col(JobEvent.kind).in_(list(kinds)))
        if tenant is not None:
            query = query.where(col(Job.tenant) == tenant)
        rows = (await session.execute(query.order_by(col(JobEvent.id).desc()).limit(limit))).all()
    return [(e, j) for e, j in rows]


@dataclass(frozen=True)
class SuccessfulRun:
    """A job that SUCCEEDED: its (tenant, name), run time (started to finished), limit, and its event's id."""

    event_id: int
    tenant: str
    name: str
    runtime_s: float
    max_runtime_s: float


async def successful_runs(db: Database, *, after_event: int | None = None, limit: int = 5000) -> list[SuccessfulRun]:
    """Jobs that SUCCEEDED, oldest first, by the id of their SUCCEEDED event: those after ``after_event`` (the
    first ``limit`` of them), or with None the latest ``limit``. Read by the event's primary key, so a caller
    that keeps the last id reads only what is new."""
    max_runtime = col(Job.spec)["max_runtime"].as_float()
    query = (
        select(col(JobEvent.id), col(Job.tenant), col(Job.name), col(Job.started_at), col(Job.finished_at), max_runtime)
        .join(Job, col(Job.id) == col(JobEvent.job_id))
        # Not filtered on the job's state: its SUCCEEDED event is written with that terminal state, which never changes,
        # and a filter there would have the planner read every successful job instead of the newest events.
        .where(col(JobEvent.kind) == JobState.SUCCEEDED.value, col(Job.started_at).is_not(None), col(Job.finished_at).is_not(None))
    )
    if after_event is None:
        query = query.order_by(col(JobEvent.id).desc())
    else:
        query = query.where(col(JobEvent.id) > after_event).order_by(col(JobEvent.id))
    async with db.sessions() as session:
        rows = (await session.execute(query.limit(limit))).all()
    runs = [
        SuccessfulRun(
            event_id=int(i),
            tenant=t,
            name=n,
            runtime_s=max(0.0, float(f or 0.0) - float(s or 0.0)),
            max_runtime_s=float(m) if m is not None else max(0.0, float(f or 0.0) - float(s or 0.0)),
        )
        for i, t, n, s, f, m in rows
    ]
    return runs[::-1] if after_event is None else runs
