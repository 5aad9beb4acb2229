"""/v1/jobs: submit, list, show, logs, cancel. A tenant sees and acts on its own jobs only."""

from __future__ import annotations

import base64
import json
import math
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Body, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from temporalio.client import WorkflowUpdateFailedError

from api.deps import Caller, State, log, require_user
from api.schemas import AllocationPublic, EventPublic, JobDetail, JobPublic, JobUpdate, PreemptResult, QueueEntry, RecentEvent, SubmitResult
from api.views import json_list
from fairgang.admission import check_admission
from fairgang.settings import Settings, log_path
from fairgang.spec import JobState, SpecError, SpecProblem, parse_spec
from store import auth, observability, tenants
from store import jobs as stored_jobs
from store.common import LIVE_ALLOCATION_STATES, REVOKED
from store.models import Job
from workflows import starter

router = APIRouter(prefix="/v1", tags=["jobs"])


def spec_refused(problems: list[SpecProblem], status: int = 422) -> HTTPException:
    return HTTPException(status, {"error": "job spec refused", "problems": [p.model_dump() for p in problems]})


async def visible_job(state: State, who: auth.Principal, job_id: str) -> Job:
    """The job, if this caller may see it; 404 otherwise (no hint that it exists)."""
    require_user(who)
    job = await stored_jobs.get_job(state.db, job_id)
    if job is None or (not who.admin and job.tenant != who.tenant):
        raise HTTPException(404, f"no job {job_id}")
    return job


def temporal_url(settings: Settings, job_id: str) -> str:
    """The job's workflow page in the Temporal UI (the workflow id is the job id)."""
    return f"{temporal_workflows_url(settings)}{job_id}"


def temporal_workflows_url(settings: Settings) -> str:
    """The Temporal UI's prefix of a workflow's page: append the workflow id."""
    return f"{settings.temporal_ui_url.rstrip('/')}/namespaces/{settings.temporal_namespace}/workflows/"


@router.post("/jobs", status_code=201, response_model=SubmitResult)
async def submit_job(state: State, who: Caller, body: dict[str, Any] = Body(...)) -> Any:
    """Validate, admit and queue a job; a repeated idempotency key returns the same job."""
    require_user(who)
    try:
        spec = parse_spec(body)
    except SpecError as err:
        raise spec_refused(err.problems) from None
    tenant_name = spec.tenant or who.tenant
    if tenant_name is None:
        raise spec_refused([SpecProblem(field="tenant", reason="an admin must name the tenant")])
    if not who.admin and tenant_name != who.tenant:
        raise spec_refused([SpecProblem(field="tenant", reason=f"your token belongs to tenant '{who.tenant}'")], 403)
    tenant = await tenants.get_tenant(state.db, tenant_name)
    if tenant is None:
        raise spec_refused([SpecProblem(field="tenant", reason=f"unknown tenant '{tenant_name}'")])
    wait = state.submissions.take(tenant.name, tenant.submissions_per_minute, tenant.submission_burst)
    if wait is not None:
        detail = f"tenant '{tenant.name}' is over its submission rate ({tenant.submissions_per_minute:g} a minute): try again in {wait} s"
        raise HTTPException(429, detail, headers={"Retry-After": str(wait)})
    problems = check_admission(spec, tenants.tenant_policy(tenant), await tenants.fleet_shape(state.db))
    if problems:
        raise spec_refused(problems)
    try:
        job, created = await stored_jobs.create_job(state.db, spec=spec, tenant=tenant_name, max_concurrent_jobs=tenant.max_concurrent_jobs)
    except stored_jobs.AdmissionRefused as err:
        raise spec_refused([SpecProblem(field=err.field, reason=err.reason)], 429) from None
    if not job.workflow_started:
        client = await state.temporal()
        if client is not None:
            try:
                await starter.start_job_workflow(client, job, state.settings)
                await stored_jobs.mark_workflow_started(state.db, job.id)
            except Exception as err:  # noqa: BLE001
                # The placement service's reconciler starts it later; the job is safe in the store.
                log.warning("could not start workflow for %s yet: %s", job.id, err)
    result = SubmitResult(created=created, job=JobPublic.of(job))
    return JSONResponse(result.model_dump(mode="json"), status_code=201 if created else 200)


@router.get("/jobs", response_model=list[JobPublic])
async def list_jobs(
    state: State,
    who: Caller,
    request: Request,
    response: Response,
    tenant: str | None = None,
    job_state: str | None = Query(default=None, alias="state"),
    label: list[str] = Query(default=[], description="key=value; repeat for several (a job must carry all)"),
    since: str | None = Query(default=None, description="submitted at or after: epoch seconds or ISO 8601 (UTC unless it says)"),
    until: str | None = Query(default=None, description="submitted before: epoch seconds or ISO 8601"),
    search: str | None = Query(default=None, max_length=64, description="a job id, or a part of the job's name (any case)"),
    cursor: str | None = Query(default=None, description="the X-Next-Cursor of the page before"),
    limit: int = Query(default=200, ge=1, le=5000),
) -> list[JobPublic]:
    """Jobs, newest submission first. A page holds at most ``limit``; when more follow, the answer's
    ``X-Next-Cursor`` header (and its ``Link: <...>; rel="next"``) gives the next page's ``cursor``."""
    require_user(who)
    if job_state is not None and job_state not in JobState.__members__:
        raise HTTPException(422, f"state: unknown job state '{job_state}' (one of {', '.join(JobState.__members__)})")
    if not who.admin:
        if tenant is not None and tenant != who.tenant:
            raise HTTPException(403, f"tenant: your token belongs to tenant '{who.tenant}'")
        tenant = who.tenant
    labels = {}
    for item in label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise HTTPException(422, f"label: '{item}' is not key=value")
        labels[key] = value
    window = {name: parse_time(value, name) for name, value in (("since", since), ("until", until)) if value is not None}
    after = decode_cursor(cursor) if cursor is not None else None
    rows = await stored_jobs.list_jobs(
        state.db, tenant=tenant, state=job_state, limit=limit + 1, labels=labels, search=search or None, after=after, **window
    )
    if len(rows) > limit:
        rows = rows[:limit]
        next_cursor = encode_cursor(rows[-1].created_at, rows[-1].id)
        response.headers["X-Next-Cursor"] = next_cursor
        response.headers["Link"] = f'<{request.url.include_query_params(cursor=next_cursor)}>; rel="next"'
    return [JobPublic.of(j) for j in rows]


def encode_cursor(created_at: float, job_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at, job_id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        created_at, job_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return float(created_at), str(job_id)
    except (ValueError, TypeError) as err:
        raise HTTPException(422, f"cursor: not a cursor this API handed out ({err})") from None


def parse_time(value: str, name: str) -> float:
    """Epoch seconds, or an ISO 8601 time (UTC unless it names its offset)."""
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise HTTPException(422, f"{name}: '{value}' is not a time")
        return seconds
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise HTTPException(422, f"{name}: '{value}' is neither epoch seconds nor an ISO 8601 time") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


@router.get("/jobs/{job_id}", response_model=JobDetail)
async def show_job(state: State, who: Caller, job_id: str) -> JobDetail:
    job = await visible_job(state, who, job_id)
    allocations = [AllocationPublic.of(a) for a in await stored_jobs.job_allocations(state.db, job_id)]
    current = next((a for a in reversed(allocations) if a.attempt == job.attempt), None)
    events = [EventPublic.of(e) for e in await stored_jobs.job_events(state.db, job_id)]
    position = estimated = low = high = None
    if job.state == JobState.QUEUED.value and job.workflow_started:
        queue = (await state.views.get("queue", state.db)).value.view
        position, estimated = queue.position.get(job.id), queue.estimated_start.get(job.id)
        low, high = queue.estimated_start_low.get(job.id), queue.estimated_start_high.get(job.id)
    return JobDetail(
        **JobPublic.of(job).model_dump(),
        allocation=current,
        allocations=allocations,
        events=events,
        temporal_url=temporal_url(state.settings, job.id),
        queue_position=position,
        estimated_start=estimated,
        estimated_start_low=low,
        estimated_start_high=high,
        gpus_now=sum(len(m["gpu_indices"]) for m in current.members)
        if current and current.state in (*LIVE_ALLOCATION_STATES, REVOKED)
        else None,
    )


@router.get("/jobs/{job_id}/logs", response_class=PlainTextResponse)
async def job_logs(
    state: State,
    who: Caller,
    job_id: str,
    attempt: int | None = Query(default=None, ge=1),
    rank: int = Query(default=0, ge=0),
    tail: int | None = Query(default=None, ge=1, description="Only the last N lines."),
    offset: int | None = Query(default=None, ge=0, description="From this byte on (the X-Log-Size of an earlier answer)."),
) -> PlainTextResponse:
    """The attempt's log (stdout and stderr of the rank's member). ``X-Log-Size`` says how many bytes it has: a
    follower asks again from that ``offset``."""
    job = await visible_job(state, who, job_id)
    attempt = attempt or job.attempt
    if attempt > job.attempt:
        raise HTTPException(404, f"job {job.id} has no attempt {attempt} (its latest is {job.attempt})")
    if rank > 0:
        placed = [a for a in await stored_jobs.job_allocations(state.db, job.id) if a.attempt == attempt]
        ranks = max((len(a.members) for a in placed), default=1)
        if rank >= ranks:
            raise HTTPException(404, f"attempt {attempt} of job {job.id} has no rank {rank} (ranks 0-{ranks - 1})")
    if tail is not None and offset is not None:
        raise HTTPException(422, "tail: give tail or offset, not both")
    path = log_path(state.settings.log_dir, job.id, attempt, rank)
    if not path.exists():
        return PlainTextResponse("", headers={"X-Log-Size": "0"})  # not started yet, or nothing written
    with path.open("rb") as f:
        f.seek(offset or 0)
        data = f.read()
    size = (offset or 0) + len(data)
    text = data.decode(errors="replace")
    if tail is not None:
        text = "".join(text.splitlines(keepends=True)[-tail:])
    return PlainTextResponse(text, headers={"X-Log-Size": str(size)})


@router.post("/jobs/{job_id}/cancel", response_model=JobPublic)
async def cancel_job(state: State, who: Caller, job_id: str) -> JobPublic:
    """Ask the job's workflow to stop it (processes get SIGTERM, then SIGKILL after the grace period).

    Cancelling a cancelled job again answers it as it is; a job that ended otherwise is 409: nothing to cancel."""
    job = await visible_job(state, who, job_id)
    if job.state == JobState.CANCELLED.value:
        return JobPublic.of(job)
    if JobState(job.state).terminal:
        raise HTTPException(409, f"job {job.id} has already ended ({job.state}): nothing to cancel")
    reason = "cancelled by admin" if who.admin else f"cancelled by tenant {who.tenant}"
    if not job.workflow_started:
        # No workflow yet: nothing runs, so the store alone can end it.
        job = await stored_jobs.record_transition(
            state.db, job_id=job.id, attempt=job.attempt, state=JobState.CANCELLED, event_key=f"cancel-{job.attempt}", message=reason
        )
        return JobPublic.of(job)
    client = await state.temporal()
    if client is None:
        raise HTTPException(503, "the workflow service is unreachable; try again")
    await starter.signal_cancel(client, job_id=job.id, reason=reason)
    return JobPublic.of(job)


def _caller(who: auth.Principal) -> str:
    return "admin" if who.admin else f"tenant {who.tenant}"


@router.post("/jobs/{job_id}/hold", response_model=JobPublic)
async def hold_job(state: State, who: Caller, job_id: str) -> JobPublic:
    """Keep a queued job from placement (state HELD) until it is released. Holding a held job answers it as it is;
    a job placed, running or ended is 409."""
    job = await visible_job(state, who, job_id)
    try:
        return JobPublic.of(await stored_jobs.hold_job(state.db, job.id, by=_caller(who)))
    except stored_jobs.NotQueued as err:
        raise HTTPException(409, str(err)) from None


@router.post("/jobs/{job_id}/release", response_model=JobPublic)
async def release_job(state: State, who: Caller, job_id: str) -> JobPublic:
    """Let a held job be placed again, in its place in the queue. Releasing a queued job answers it as it is."""
    job = await visible_job(state, who, job_id)
    try:
        return JobPublic.of(await stored_jobs.release_job(state.db, job.id, by=_caller(who)))
    except stored_jobs.NotQueued as err:
        raise HTTPException(409, str(err)) from None


@router.patch("/jobs/{job_id}", response_model=JobPublic)
async def update_job(state: State, who: Caller, job_id: str, body: JobUpdate) -> JobPublic:
    """Lower a queued or held job's priority class or shorten its max runtime (never raise them: 422); a job
    placed, running or ended is 409. A shorter max runtime reaches the job's workflow before the store."""
    job = await visible_job(state, who, job_id)
    if job.state not in (JobState.QUEUED.value, JobState.HELD.value):
        raise HTTPException(409, f"job {job.id} is {job.state}: only a queued or held job can be changed")
    if body.max_runtime is not None and not 0 < body.max_runtime <= float(job.spec["max_runtime"]):
        raise HTTPException(
            422, f"max_runtime: {body.max_runtime:g}s is not above 0 and at most the job's {float(job.spec['max_runtime']):g}s"
        )
    if body.max_runtime is not None and job.workflow_started:
        client = await state.temporal()
        if client is None:
            raise HTTPException(503, "the workflow service is unreachable; try again")
        await starter.signal_limits(client, job_id=job.id, max_runtime_s=body.max_runtime)
    try:
        updated = await stored_jobs.update_waiting_job(
            state.db, job.id, by=_caller(who), priority_class=body.priority_class, max_runtime=body.max_runtime
        )
    except stored_jobs.NotQueued as err:
        raise HTTPException(409, str(err)) from None
    except ValueError as err:
        raise HTTPException(422, str(err)) from None
    return JobPublic.of(updated)


@router.post("/jobs/{job_id}/preempt", response_model=PreemptResult)
async def preempt_job(state: State, who: Caller, job_id: str, reason: str | None = None) -> PreemptResult:
    """Preempt the running attempt: SIGTERM, the grace period to checkpoint, SIGKILL; then the job queues again."""
    job = await visible_job(state, who, job_id)
    if job.state not in (JobState.LAUNCHING.value, JobState.RUNNING.value):
        raise HTTPException(409, f"job is {job.state}: only a launching or running job can be preempted")
    client = await state.temporal()
    if client is None:
        raise HTTPException(503, "the workflow service is unreachable; try again")
    why = reason or ("preempted by admin" if who.admin else f"preempted by tenant {who.tenant}")
    try:
        answer = await starter.preempt(client, job_id=job.id, reason=why)
    except WorkflowUpdateFailedError as err:
        raise HTTPException(409, str(err.cause or err)) from None
    return PreemptResult(accepted=answer.accepted, message=answer.message)


@router.get("/queue", response_model=list[QueueEntry])
async def queue(state: State, who: Caller) -> Any:
    """Queued jobs in the scheduler's own order (fair share, then priority and age), with why each waits and when each should start.

    A tenant sees its own jobs with their global positions. From the view cache (``api.views``):
    ``X-Computed-At`` says when it was computed.
    """
    require_user(who)
    view = await state.views.get("queue", state.db)
    body = view.body if who.admin else json_list(view.parts.get(who.tenant or "", []))
    return Response(body, media_type="application/json", headers=view.headers())


#: Job event kinds /v1/events/recent serves by default: preemptions and requeues.
RECENT_EVENT_KINDS = ("PREEMPTING", "REQUEUED")


@router.get("/events/recent", response_model=list[RecentEvent])
async def recent_events(
    state: State,
    who: Caller,
    kinds: str = Query(default=",".join(RECENT_EVENT_KINDS), description="Comma-separated job event kinds, e.g. PREEMPTING,REQUEUED."),
    limit: int = Query(default=50, ge=1, le=1000),
) -> list[RecentEvent]:
    """The latest job events of these kinds, newest first, with their jobs (a tenant sees its own jobs' events)."""
    require_user(who)
    wanted = [k.strip().upper() for k in kinds.split(",") if k.strip()]
    if not wanted:
        raise HTTPException(422, "kinds: name at least one job event kind")
    rows = await observability.recent_events(state.db, wanted, tenant=None if who.admin else who.tenant, limit=limit)
    return [
        RecentEvent(
            **EventPublic.of(event).model_dump(),
            job_id=job.id,
            tenant=job.tenant,
            name=job.name,
            temporal_url=temporal_url(state.settings, job.id),
        )
        for event, job in rows
    ]
