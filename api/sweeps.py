"""/v1/sweeps and /v1/schedules (SPEC R9.3). A tenant sees and acts on its own only.

A sweep is stored, then its ``Sweep`` workflow (id = sweep id) creates and starts the
trials. A schedule is a Temporal Schedule whose action starts a ``Sweep`` workflow; each
run creates its own sweep.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Body, HTTPException, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleBackfill,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from activities.sweeps import scheduled_workflow_id
from api.deps import Caller, State, log, require_user
from fairgang.admission import check_sweep_admission
from fairgang.settings import CONTROL_TASK_QUEUE
from fairgang.spec import SpecError, SpecProblem
from fairgang.sweeps import OVERLAP_POLICIES, SweepSpec, parse_schedule, parse_sweep
from store import auth, common, tenants
from store import sweeps as stored_sweeps
from store.models import Sweep, SweepTrial, Tenant
from workflows.sweep import TENANT
from workflows.sweep_messages import SweepCancel, SweepInput

router = APIRouter(prefix="/v1", tags=["sweeps"])

OVERLAP = {
    "skip": ScheduleOverlapPolicy.SKIP,
    "buffer_one": ScheduleOverlapPolicy.BUFFER_ONE,
    "cancel_previous": ScheduleOverlapPolicy.CANCEL_OTHER,
}
assert set(OVERLAP) == set(OVERLAP_POLICIES)


def refused(problems: list[SpecProblem], status: int = 422, what: str = "sweep spec refused") -> HTTPException:
    return HTTPException(status, {"error": what, "problems": [p.model_dump() for p in problems]})


class SweepPublic(BaseModel):
    id: str
    tenant: str
    name: str
    state: str
    trial_count: int
    max_concurrent: int
    schedule_id: str | None
    reason: str | None
    summary: dict[str, Any]
    created_at: float
    finished_at: float | None

    @classmethod
    def of(cls, s: Sweep) -> SweepPublic:
        return cls(
            id=s.id, tenant=s.tenant, name=s.name, state=s.state, trial_count=s.trial_count, max_concurrent=s.max_concurrent,
            schedule_id=s.schedule_id, reason=s.reason, summary=s.summary, created_at=s.created_at, finished_at=s.finished_at,
        )  # fmt: skip


class TrialPublic(BaseModel):
    index: int
    params: dict[str, Any]
    #: PENDING (not created yet), REFUSED (admission refused it), else its job's state.
    state: str
    job_id: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    metrics: dict[str, Any] = {}
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None


class SweepDetail(SweepPublic):
    spec: dict[str, Any]
    counts: dict[str, int]
    trials: list[TrialPublic]
    temporal_url: str


class SweepSubmitResult(BaseModel):
    created: bool
    sweep: SweepPublic


async def _tenant_for(state: State, who: auth.Principal, named: str | None) -> Tenant:
    tenant_name = named or who.tenant
    if tenant_name is None:
        raise refused([SpecProblem(field="tenant", reason="an admin must name the tenant")])
    if not who.admin and tenant_name != who.tenant:
        raise refused([SpecProblem(field="tenant", reason=f"your token belongs to tenant '{who.tenant}'")], 403)
    tenant = await tenants.get_tenant(state.db, tenant_name)
    if tenant is None:
        raise refused([SpecProblem(field="tenant", reason=f"unknown tenant '{tenant_name}'")])
    return tenant


async def _admit(state: State, spec: SweepSpec, tenant: Tenant, prefix: str = "") -> None:
    problems = check_sweep_admission(spec, tenants.tenant_policy(tenant), await tenants.fleet_shape(state.db))
    if problems:
        raise refused([SpecProblem(field=f"{prefix}template.{p.field}", reason=p.reason) for p in problems])


async def visible_sweep(state: State, who: auth.Principal, sweep_id: str) -> Sweep:
    """The sweep, if this caller may see it; 404 otherwise (no hint that it exists)."""
    require_user(who)
    sweep = await stored_sweeps.get_sweep(state.db, sweep_id)
    if sweep is None or (not who.admin and sweep.tenant != who.tenant):
        raise HTTPException(404, f"no sweep {sweep_id}")
    return sweep


async def _start_sweep_workflow(client: Client, sweep: Sweep, batch_size: int) -> None:
    await client.start_workflow(
        "Sweep",
        SweepInput(tenant=sweep.tenant, sweep_id=sweep.id, batch_size=batch_size),
        id=sweep.id,
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        search_attributes=TypedSearchAttributes([SearchAttributePair(TENANT, sweep.tenant)]),
    )


@router.post("/sweeps", status_code=201, response_model=SweepSubmitResult)
async def submit_sweep(state: State, who: Caller, body: dict[str, Any] = Body(...)) -> Any:
    """Validate a sweep, admit every trial's job, store it and start its workflow.

    Submitting the same idempotency key (default: the sweep's name) again returns the same sweep.
    """
    require_user(who)
    try:
        spec = parse_sweep(body)
    except SpecError as err:
        raise refused(err.problems) from None
    tenant = await _tenant_for(state, who, spec.tenant)
    await _admit(state, spec, tenant)
    sweep, created = await stored_sweeps.create_sweep(
        state.db,
        sweep_id=common.new_id("sw"),
        tenant=tenant.name,
        name=spec.name,
        idempotency_key=spec.idempotency_key or f"name:{spec.name}",
        spec=spec.model_dump(mode="json", by_alias=True, exclude_none=True) | {"tenant": tenant.name},
        trial_count=len(spec.trial_params()),
        max_concurrent=spec.max_concurrent,
    )
    if sweep.state == "SUBMITTED":
        client = await state.temporal()
        if client is None:
            raise HTTPException(503, f"sweep {sweep.id} is stored but the workflow service is unreachable; submit again to start it")
        await _start_sweep_workflow(client, sweep, state.settings.sweep_batch_size)
    result = SweepSubmitResult(created=created, sweep=SweepPublic.of(sweep))
    return JSONResponse(result.model_dump(mode="json"), status_code=201 if created else 200)


@router.get("/sweeps", response_model=list[SweepPublic])
async def list_sweeps(
    state: State,
    who: Caller,
    tenant: str | None = None,
    schedule_id: str | None = None,
    sweep_state: str | None = Query(default=None, alias="state"),
    limit: int = Query(default=200, ge=1, le=5000),
) -> list[SweepPublic]:
    require_user(who)
    if not who.admin:
        if tenant is not None and tenant != who.tenant:
            raise HTTPException(403, f"tenant: your token belongs to tenant '{who.tenant}'")
        tenant = who.tenant
    rows = await stored_sweeps.list_sweeps(state.db, tenant=tenant, schedule_id=schedule_id, state=sweep_state, limit=limit)
    return [SweepPublic.of(s) for s in rows]


def _trial_view(index: int, params: dict[str, Any], row: SweepTrial | None, job: Any) -> TrialPublic:
    if row is None:
        return TrialPublic(index=index, params=params, state="PENDING")
    if job is None:
        return TrialPublic(index=index, params=row.params, state=row.state, reason=row.reason, created_at=row.created_at)
    return TrialPublic(
        index=index, params=row.params, state=job.state, job_id=job.id, exit_code=job.exit_code,
        reason=job.end_reason or job.pending_reason, metrics=row.metrics, created_at=job.created_at,
        started_at=job.started_at, finished_at=job.finished_at,
    )  # fmt: skip


@router.get("/sweeps/{sweep_id}", response_model=SweepDetail)
async def show_sweep(state: State, who: Caller, sweep_id: str) -> SweepDetail:
    """The sweep with every trial: its parameters, its job and the job's state."""
    sweep = await visible_sweep(state, who, sweep_id)
    recorded = {trial.index: (trial, job) for trial, job in await stored_sweeps.sweep_trials(state.db, sweep.id)}
    all_params = SweepSpec.model_validate(sweep.spec).trial_params() if sweep.trial_count else []
    trials = [_trial_view(i, params, *recorded.get(i, (None, None))) for i, params in enumerate(all_params)]
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state] = counts.get(t.state, 0) + 1
    ui = state.settings.temporal_ui_url.rstrip("/")
    return SweepDetail(
        **SweepPublic.of(sweep).model_dump(),
        spec=sweep.spec,
        counts=counts,
        trials=trials,
        temporal_url=f"{ui}/namespaces/{state.settings.temporal_namespace}/workflows/{sweep.id}",
    )


@router.post("/sweeps/{sweep_id}/cancel", response_model=SweepPublic)
async def cancel_sweep(state: State, who: Caller, sweep_id: str) -> SweepPublic:
    """Start no more trials; the running ones get their job's graceful cancel (SIGTERM, grace, SIGKILL)."""
    sweep = await visible_sweep(state, who, sweep_id)
    if sweep.state in stored_sweeps.SWEEP_TERMINAL:
        return SweepPublic.of(sweep)
    reason = "cancelled by admin" if who.admin else f"cancelled by tenant {who.tenant}"
    sweep = await stored_sweeps.set_sweep_state(state.db, sweep_id=sweep.id, state="CANCELLING") or sweep
    client = await state.temporal()
    if client is None:
        raise HTTPException(503, "the workflow service is unreachable; try again")
    # A scheduled run's workflow id is the schedule's action id plus its time, kept in the sweep's key.
    # The sweep is not over, so its workflow is the one running under that id.
    workflow_id = scheduled_workflow_id(sweep.idempotency_key) or sweep.id
    try:
        await client.get_workflow_handle(workflow_id).signal("cancel", SweepCancel(reason=reason))
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        log.info("sweep %s has no workflow: %s", sweep.id, err)
    return SweepPublic.of(sweep)


# ---------------------------------------------------------------- schedules


class ScheduleRun(BaseModel):
    workflow_id: str
    scheduled_at: float
    started_at: float


class SchedulePublic(BaseModel):
    id: str
    tenant: str
    name: str
    paused: bool
    note: str | None
    cron: list[str]
    interval_s: list[float]
    overlap: str
    actions_taken: int
    skipped_for_overlap: int
    next_runs: list[float]
    recent_runs: list[ScheduleRun]
    running: list[str]
    temporal_url: str


def schedule_id_for(tenant: str, name: str) -> str:
    return f"sched-{tenant}-{name}"


def _ts(value: datetime) -> float:
    return value.timestamp()


async def _schedule_view(state: State, desc: ScheduleDescription) -> SchedulePublic:
    sched = desc.schedule
    overlap = next((k for k, v in OVERLAP.items() if v == sched.policy.overlap), sched.policy.overlap.name.lower())
    ui = state.settings.temporal_ui_url.rstrip("/")
    return SchedulePublic(
        id=desc.id,
        tenant=desc.typed_search_attributes.get(TENANT) or "",
        name=str(await desc.memo_value("name", desc.id)),
        paused=sched.state.paused,
        note=sched.state.note or None,
        cron=list(sched.spec.cron_expressions),
        interval_s=[i.every.total_seconds() for i in sched.spec.intervals],
        overlap=overlap,
        actions_taken=desc.info.num_actions,
        skipped_for_overlap=desc.info.num_actions_skipped_overlap,
        next_runs=[_ts(t) for t in desc.info.next_action_times],
        recent_runs=[
            ScheduleRun(workflow_id=getattr(a.action, "workflow_id", ""), scheduled_at=_ts(a.scheduled_at), started_at=_ts(a.started_at))
            for a in desc.info.recent_actions
        ],
        running=[getattr(a, "workflow_id", "") for a in desc.info.running_actions],
        temporal_url=f"{ui}/namespaces/{state.settings.temporal_namespace}/schedules/{desc.id}",
    )


async def _client(state: State) -> Client:
    client = await state.temporal()
    if client is None:
        raise HTTPException(503, "the workflow service is unreachable; try again")
    return client


async def visible_schedule(state: State, who: auth.Principal, schedule_id: str) -> tuple[ScheduleHandle, ScheduleDescription]:
    """The schedule, if this caller may see it; 404 otherwise."""
    require_user(who)
    handle = (await _client(state)).get_schedule_handle(schedule_id)
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise HTTPException(404, f"no schedule {schedule_id}") from None
        raise
    if not who.admin and desc.typed_search_attributes.get(TENANT) != who.tenant:
        raise HTTPException(404, f"no schedule {schedule_id}")
    return handle, desc


@router.post("/schedules", status_code=201, response_model=SchedulePublic)
async def create_schedule(state: State, who: Caller, body: dict[str, Any] = Body(...)) -> SchedulePublic:
    """Create a Temporal Schedule that starts a sweep on a cron expression or an interval."""
    require_user(who)
    try:
        schedule, sweep = parse_schedule(body)
    except SpecError as err:
        raise refused(err.problems, what="schedule refused") from None
    tenant = await _tenant_for(state, who, schedule.tenant)
    if sweep.tenant is not None and sweep.tenant != tenant.name:
        raise refused([SpecProblem(field="sweep.tenant", reason=f"must be the schedule's tenant '{tenant.name}'")], what="schedule refused")
    await _admit(state, sweep, tenant, prefix="sweep.")
    schedule_id = schedule_id_for(tenant.name, schedule.name)
    timing = schedule.schedule
    spec = ScheduleSpec(
        cron_expressions=[timing.cron] if timing.cron else [],
        intervals=[
            ScheduleIntervalSpec(
                every=timedelta(seconds=timing.interval), offset=timedelta(seconds=timing.offset) if timing.offset else None
            )
        ]
        if timing.interval
        else [],
        time_zone_name=timing.timezone,
    )
    sweep_doc = sweep.model_dump(mode="json", by_alias=True, exclude_none=True) | {"tenant": tenant.name}
    attributes = TypedSearchAttributes([SearchAttributePair(TENANT, tenant.name)])
    client = await _client(state)
    try:
        handle = await client.create_schedule(
            schedule_id,
            Schedule(
                action=ScheduleActionStartWorkflow(
                    "Sweep",
                    SweepInput(tenant=tenant.name, spec=sweep_doc, schedule_id=schedule_id, batch_size=state.settings.sweep_batch_size),
                    id=schedule_id,
                    task_queue=CONTROL_TASK_QUEUE,
                    typed_search_attributes=attributes,
                ),
                spec=spec,
                policy=SchedulePolicy(overlap=OVERLAP[schedule.overlap], catchup_window=timedelta(seconds=schedule.catchup_window)),
                state=ScheduleState(paused=schedule.paused, note=f"created by {'admin' if who.admin else 'tenant ' + tenant.name}"),
            ),
            memo={"tenant": tenant.name, "name": schedule.name},
            search_attributes=attributes,
        )
    except ScheduleAlreadyRunningError:
        raise HTTPException(409, f"schedule {schedule_id} exists already; delete it first") from None
    except RPCError as err:
        if err.status == RPCStatusCode.INVALID_ARGUMENT:
            raise refused([SpecProblem(field="schedule", reason=err.message)], what="schedule refused") from None
        raise
    return await _schedule_view(state, await handle.describe())


@router.get("/schedules", response_model=list[SchedulePublic])
async def list_schedules(state: State, who: Caller) -> list[SchedulePublic]:
    require_user(who)
    client = await _client(state)
    out = []
    async for entry in await client.list_schedules():
        owner = entry.typed_search_attributes.get(TENANT)
        if not who.admin and owner != who.tenant:
            continue
        try:
            desc = await client.get_schedule_handle(entry.id).describe()
        except RPCError:
            continue  # deleted meanwhile (listing lags behind)
        out.append(await _schedule_view(state, desc))
    return sorted(out, key=lambda s: s.id)


@router.get("/schedules/{schedule_id}", response_model=SchedulePublic)
async def show_schedule(state: State, who: Caller, schedule_id: str) -> SchedulePublic:
    _, desc = await visible_schedule(state, who, schedule_id)
    return await _schedule_view(state, desc)


@router.post("/schedules/{schedule_id}/pause", response_model=SchedulePublic)
async def pause_schedule(state: State, who: Caller, schedule_id: str, note: str | None = None) -> SchedulePublic:
    """Stop the schedule firing (a running sweep goes on)."""
    handle, _ = await visible_schedule(state, who, schedule_id)
    await handle.pause(note=note or "paused through the API")
    return await _schedule_view(state, await handle.describe())


@router.post("/schedules/{schedule_id}/resume", response_model=SchedulePublic)
async def resume_schedule(state: State, who: Caller, schedule_id: str, note: str | None = None) -> SchedulePublic:
    handle, _ = await visible_schedule(state, who, schedule_id)
    await handle.unpause(note=note or "resumed through the API")
    return await _schedule_view(state, await handle.describe())


@router.post("/schedules/{schedule_id}/trigger", response_model=SchedulePublic)
async def trigger_schedule(state: State, who: Caller, schedule_id: str) -> SchedulePublic:
    """Run the sweep now (the schedule's overlap policy applies)."""
    handle, _ = await visible_schedule(state, who, schedule_id)
    await handle.trigger()
    return await _schedule_view(state, await handle.describe())


class BackfillRequest(BaseModel):
    #: UNIX seconds; the runs the schedule would have started in (start, end] are started now.
    start: float
    end: float
    overlap: str | None = None


@router.post("/schedules/{schedule_id}/backfill", response_model=SchedulePublic)
async def backfill_schedule(state: State, who: Caller, schedule_id: str, request: BackfillRequest) -> SchedulePublic:
    """Start the runs missed between start and end (e.g. while the schedule was paused)."""
    handle, _ = await visible_schedule(state, who, schedule_id)
    if request.end <= request.start:
        raise refused([SpecProblem(field="end", reason="must be after start")], what="backfill refused")
    if request.overlap is not None and request.overlap not in OVERLAP:
        raise refused([SpecProblem(field="overlap", reason=f"one of {', '.join(OVERLAP)}")], what="backfill refused")
    await handle.backfill(
        ScheduleBackfill(
            start_at=datetime.fromtimestamp(request.start, UTC),
            end_at=datetime.fromtimestamp(request.end, UTC),
            overlap=OVERLAP[request.overlap] if request.overlap else ScheduleOverlapPolicy.BUFFER_ALL,
        )
    )
    return await _schedule_view(state, await handle.describe())


@router.delete("/schedules/{schedule_id}", status_code=204)
async def delete_schedule(state: State, who: Caller, schedule_id: str) -> None:
    """Delete the schedule; sweeps it started go on (cancel them with POST /v1/sweeps/{id}/cancel)."""
    handle, _ = await visible_schedule(state, who, schedule_id)
    await handle.delete()
