"""Starting and signalling job workflows: the Temporal client helpers of the API, the placement service, the sweeps and the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, CancelledError

from fairgang.members import PlacedMember
from fairgang.settings import CONTROL_TASK_QUEUE, Settings
from fairgang.spec import JobState, stored_spec
from workflows.job import GPU_TYPE, JOB_STATE, TENANT
from workflows.messages import (
    CancelRequest,
    JobInput,
    JobOutcome,
    JobStatus,
    LimitsChange,
    NodeLost,
    Placement,
    PreemptAnswer,
    PreemptRequest,
    ResizeRequest,
)


def job_input(job: Any, settings: Settings) -> JobInput:
    """The workflow's start input, from a job row: its stored spec (:func:`~fairgang.spec.stored_spec`) and the
    control plane's settings."""
    spec = stored_spec(job.spec)
    return JobInput(
        job_id=job.id,
        tenant=job.tenant,
        gpu_type=spec.gpu_type,
        gpu_count=spec.min_gpus,
        argv=list(spec.entrypoint),
        env=dict(spec.env),
        checkpoint_dir=spec.checkpoint_dir,
        max_runtime_s=spec.max_runtime,
        grace_period_s=spec.grace_period,
        image=spec.image,
        retries=spec.retries,
        heartbeat_timeout_s=settings.activity_heartbeat_timeout_s,
        infra_retry_limit=settings.infra_retry_limit,
        infra_retry_backoff_s=settings.infra_retry_backoff_s,
        launch_start_timeout_s=settings.launch_start_timeout_s,
        self_fence_after_s=settings.self_fence_after_s,
    )


async def start_job_workflow(client: Client, job: Any, settings: Settings) -> WorkflowHandle[Any, Any]:
    """Start the job's workflow; a repeat for the same job id is a no-op."""
    return await client.start_workflow(
        "TrainingJob",
        job_input(job, settings),
        id=job.id,
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(TENANT, job.tenant),
                SearchAttributePair(GPU_TYPE, job.gpu_type),
                SearchAttributePair(JOB_STATE, job.state),
            ]
        ),
        execution_timeout=timedelta(days=30),
        result_type=JobOutcome,
    )


async def job_outcome(handle: WorkflowHandle[Any, JobOutcome]) -> JobOutcome:
    """A job workflow's outcome, whatever Temporal's status says: completed (SUCCEEDED, or CANCELLED by the
    platform's signal), failed (FAILED, TIMED_OUT: the outcome is the failure's details) or cancelled through
    Temporal (CANCELLED)."""
    try:
        return await handle.result()
    except WorkflowFailureError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], dict):
            found = cause.details[0]
            return JobOutcome(JobState(found["state"]), found["attempt"], found.get("exit_code"), found.get("reason", ""))
        if isinstance(cause, CancelledError):
            status = await handle.query("status", result_type=JobStatus)
            return JobOutcome(state=JobState.CANCELLED, attempt=status.attempt, reason=str(cause.message))
        raise


async def signal_placement(
    client: Client, *, job_id: str, allocation_id: str, attempt: int, members: Sequence[PlacedMember], master_addr: str = ""
) -> None:
    """Tell the job's workflow of its committed binding (and where its members meet: rank 0's node address)."""
    placement = Placement(allocation_id=allocation_id, attempt=attempt, members=list(members), master_addr=master_addr)
    await client.get_workflow_handle(job_id).signal("place", placement)


async def signal_resize(client: Client, *, job_id: str, request: ResizeRequest) -> None:
    """Ask the elastic job's workflow to resize its running attempt (it drops a stale or duplicate request)."""
    await client.get_workflow_handle(job_id).signal("resize", request)


async def signal_cancel(client: Client, *, job_id: str, reason: str) -> None:
    await client.get_workflow_handle(job_id).signal("cancel", CancelRequest(reason=reason))


async def signal_limits(client: Client, *, job_id: str, max_runtime_s: float) -> None:
    await client.get_workflow_handle(job_id).signal("limits", LimitsChange(max_runtime_s=max_runtime_s))


async def signal_node_lost(client: Client, *, job_id: str, node_id: str) -> None:
    await client.get_workflow_handle(job_id).signal("node_lost", NodeLost(node_id=node_id))


async def preempt(client: Client, *, job_id: str, reason: str, for_job: str | None = None) -> PreemptAnswer:
    """Ask the job's workflow to preempt its running attempt; raises if the workflow refuses."""
    handle = client.get_workflow_handle(job_id)
    return await handle.execute_update("preempt", PreemptRequest(reason=reason, for_job=for_job), result_type=PreemptAnswer)
