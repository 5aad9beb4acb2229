"""The job workflow: one per job, workflow id = job id (SPEC "Shape").

QUEUED -> (placement signal) -> LAUNCHING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED |
TIMED_OUT, with a REQUEUED loop when a member is lost. Every transition is written to
the store by an idempotent activity; the store stays the fleet's source of truth and
this workflow owns the job's lifecycle.

Its history stays bounded: checkpoints go to the store (the agents report them through the API) and the
workflow reads the latest when it launches an attempt again; each requeue continues the workflow as new,
carrying the attempt, the failure counts and a pending cancel. One run holds one attempt: its events grow
with the gang's size, not with the job's runtime or its checkpoints (tests/workflows/test_bounded_history.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import CancelledError as ActivityCancelledError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError
from temporalio.types import MethodAsyncSingleParam

with workflow.unsafe.imports_passed_through():
    from activities.store import StoreActivities
    from fairgang.fencing import surely_dead_after_s
    from fairgang.members import PlacedMember
    from fairgang.spec import JobState
    from worker_agent.launch import LaunchActivities
    from workflows.messages import (
        AGENT_RESTARTING,
        MEMBER_FENCED,
        CancelRequest,
        CheckpointInput,
        CheckpointReport,
        JobInput,
        JobOutcome,
        JobRef,
        JobStatus,
        LaunchInput,
        LaunchResult,
        LimitsChange,
        MemberStarted,
        NodeLost,
        Placement,
        PreemptAnswer,
        PreemptRequest,
        QueuedInput,
        RequeueInput,
        ResizeInput,
        ResizeRequest,
        RevokeInput,
        StopInput,
        StopResult,
        TransitionInput,
    )

TENANT = SearchAttributeKey.for_keyword("Tenant")
GPU_TYPE = SearchAttributeKey.for_keyword("GpuType")
JOB_STATE = SearchAttributeKey.for_keyword("JobState")

#: Store activities are short and idempotent: retry them until the store answers.
STORE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10))

Arg = TypeVar("Arg")
Result = TypeVar("Result")


async def _store(activity: MethodAsyncSingleParam[StoreActivities, Arg, Result], arg: Arg) -> Result:
    """Run a store activity (by its method: its registered name, its result type) on the control queue."""
    return await workflow.execute_activity_method(activity, arg, start_to_close_timeout=timedelta(seconds=30), retry_policy=STORE_RETRY)


#: Rendezvous ports (``MASTER_PORT``) come from this range, one per allocation: gangs whose rank 0 share a host
#: (single-node jobs on one node, simulated nodes on one machine) do not meet on each other's port.
MASTER_PORTS = (20000, 30000)


def master_port(allocation_id: str) -> int:
    """The allocation's rendezvous port: the same on every member and every replay (a CRC, not Python's hash)."""
    low, high = MASTER_PORTS
    return low + zlib.crc32(allocation_id.encode()) % (high - low)


FENCE_PATCH = "fence-unconfirmed-members"
#: Stopping a gang sends each running member's node a `stop` activity as well as cancelling its launch.
STOP_PATCH = "stop-members-directly"
#: A checkpoint report older than the one the workflow has (a lower ``seq`` of the same attempt) is ignored.
CHECKPOINT_ORDER_PATCH = "newest-checkpoint-wins"
#: A member whose launch activity stopped heartbeating (or whose agent said it is restarting) on a node not
#: declared lost is launched again for the agent's next run to adopt, instead of the gang being stopped.
RELAUNCH_PATCH = "relaunch-after-agent-restart"
#: Temporal's status says the job's outcome: FAILED and TIMED_OUT fail the workflow (non-retryable, with the
#: reason and the outcome as details), a cancel through Temporal ends it cancelled.
OUTCOME_PATCH = "workflow-status-is-the-outcome"
#: Checkpoints live in the store: an attempt after the first resumes from the store's latest checkpoint, and
#: each requeue continues the workflow as new (its history bounded by one attempt's).
BOUNDED_HISTORY_PATCH = "checkpoints-in-store-continue-as-new"
#: The ApplicationError types a failed job's workflow fails with.
JOB_FAILED, JOB_TIMED_OUT = "JobFailed", "JobTimedOut"
#: How often one member may be launched again in one attempt.
MAX_RELAUNCHES = 5
#: The stop activity runs in the agent and returns at once; a retry covers a transient error.
STOP_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=2))


def _record_outcome(results: dict[int, LaunchResult | BaseException], rank: int, handle: asyncio.Future[LaunchResult]) -> None:
    if handle.cancelled():
        results[rank] = asyncio.CancelledError()
    else:
        results[rank] = handle.exception() or handle.result()


class GangOutcome(StrEnum):
    """How one attempt's gang ended, as the workflow judged it."""

    SUCCEEDED = "succeeded"
    #: The job's own failure: a member exited non-zero or could not start (counts against the spec's retries).
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    PREEMPTED = "preempted"
    #: Infrastructure: a node lost, a member that stopped heartbeating or was never picked up, an agent's error.
    LOST = "lost"
    #: Every member stopped for an elastic job's resize: the attempt goes on at the new size.
    RESIZED = "resized"


@dataclass
class GangResult:
    """How one attempt's gang ended."""

    kind: GangOutcome
    exit_code: int | None = None
    reason: str = ""
    #: Ranks whose end no agent confirmed (heartbeat timeout, an agent's error): they may still run.
    unconfirmed: list[int] = field(default_factory=list)


def confirmed_end(result: LaunchResult | BaseException, relaunched: bool = False) -> bool:
    """Whether a member's activity result proves that its processes are gone (or never started).

    A member launched again (``relaunched``) may run from an earlier launch: only its agent's word counts."""
    if isinstance(result, LaunchResult):
        return True  # it exited, and the activity saw it
    if not isinstance(result, ActivityError):
        return False
    cause = result.cause
    if isinstance(cause, ApplicationError) and cause.type == MEMBER_FENCED:
        return True
    if relaunched:
        return False  # cancelled before an agent took it, or never picked up: the earlier launch's member may run
    if isinstance(cause, ActivityCancelledError):
        return True  # the agent stopped it (SIGTERM, grace, SIGKILL) before it confirmed the cancellation
    # Never picked up by its node: no process was started.
    return isinstance(cause, ActivityTimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START


def member_ended_alone(results: dict[int, LaunchResult | BaseException]) -> bool:
    """Whether a member ended on its own (not stopped by the workflow): its end, not a resize, is the gang's news."""
    return any(isinstance(r, LaunchResult) and r.how != "terminated" for r in results.values())


def launch_input(job: JobInput, placement: Placement, member: PlacedMember, *, attempt: int, resume_from: str) -> LaunchInput:
    """The launch activity's input for one member of the placement: the job's process, its rank in the gang, its GPUs,
    the rendezvous (rank 0's node) and the checkpoint the attempt resumes from."""
    first = min(placement.members, key=lambda m: m.rank)
    return LaunchInput(
        job_id=job.job_id,
        attempt=attempt,
        allocation_id=placement.allocation_id,
        node_id=member.node_id,
        rank=member.rank,
        world_size=len(placement.members),
        gpu_indices=list(member.gpu_indices),
        gpus_per_member=len(first.gpu_indices),
        argv=list(job.argv),
        env=dict(job.env),
        checkpoint_dir=job.checkpoint_dir,
        grace_period_s=job.grace_period_s,
        master_addr=placement.master_addr or first.node_id,
        master_port=master_port(placement.allocation_id),
        resume_from=resume_from,
        image=job.image,
        tenant=job.tenant,
    )


@dataclass
class WorkflowState:
    """All of the workflow's state, in one place."""

    state: JobState = JobState.QUEUED
    attempt: int = 1
    placement: Placement | None = None
    cancel: CancelRequest | None = None
    started_members: set[int] = field(default_factory=set)
    own_failures: int = 0
    infra_failures: int = 0
    running_recorded: bool = False
    #: A preemption asked for the current attempt (cleared when the job is queued again).
    preempt: PreemptRequest | None = None
    #: Nodes of the current placement reported lost by the placement service.
    lost_nodes: set[str] = field(default_factory=set)
    #: The job's latest checkpoint, from rank 0's LATEST marker; handed to the next attempt.
    latest_checkpoint: str = ""
    #: The number (``CheckpointReport.seq``) of the current attempt's report that named it.
    checkpoint_seq: int = 0
    #: A cancel came through Temporal itself (its UI or CLI), not the platform's cancel signal.
    cancelled_through_temporal: bool = False
    #: A max runtime lowered while the job waited (the ``limits`` signal); None: the job's own.
    max_runtime_s: float | None = None
    #: A resize asked for the running attempt (cleared once committed or refused).
    resize: ResizeRequest | None = None
    #: When the current attempt must end (its max runtime from its start): a resize does not move it.
    deadline: float | None = None


@workflow.defn(name="TrainingJob")
class TrainingJobWorkflow:
    def __init__(self) -> None:
        self.s = WorkflowState()
        self.job: JobInput | None = None

    # ------------------------------------------------------------ messages

    @workflow.signal
    def place(self, placement: Placement) -> None:
        """Placement from the scheduler; duplicates and stale attempts are dropped."""
        if placement.attempt != self.s.attempt or self.s.state != JobState.QUEUED or self.s.placement is not None:
            return
        self.s.placement = placement

    @workflow.signal
    def cancel(self, request: CancelRequest) -> None:
        if self.s.cancel is None:
            self.s.cancel = request

    @workflow.update(name="preempt")
    async def preempt_update(self, request: PreemptRequest) -> PreemptAnswer:
        """Preempt and answer (from the API, the CLI or `temporal workflow update execute`)."""
        self.s.preempt = request
        return PreemptAnswer(accepted=True, message=f"stopping attempt {self.s.attempt} gracefully: {request.reason}")

    @preempt_update.validator
    def _validate_preempt(self, request: PreemptRequest) -> None:
        if self.s.placement is None or self.s.state not in (JobState.LAUNCHING, JobState.RUNNING):
            raise ValueError(f"job is {self.s.state}: only a launching or running job can be preempted")
        if self.s.preempt is not None:
            raise ValueError("a preemption of this attempt is already under way")

    @workflow.signal(name="preempt")
    def preempt_signal(self, request: PreemptRequest) -> None:
        """Preempt without an answer (signals work even while no worker runs)."""
        if self.s.placement is not None and self.s.state in (JobState.LAUNCHING, JobState.RUNNING) and self.s.preempt is None:
            self.s.preempt = request

    @workflow.signal
    def resize(self, request: ResizeRequest) -> None:
        """Resize the running attempt of an elastic job (from the placement service); a request for another
        allocation, or while the attempt is stopping for any reason, is dropped (the service asks again)."""
        placement = self.s.placement
        if placement is None or request.attempt != self.s.attempt or request.allocation_id != placement.allocation_id:
            return
        if self.s.state not in (JobState.LAUNCHING, JobState.RUNNING) or self.s.resize is not None:
            return
        if self.s.preempt is not None or self.s.cancel is not None or self.s.lost_nodes:
            return
        self.s.resize = request

    @workflow.signal
    def node_lost(self, lost: NodeLost) -> None:
        placement = self.s.placement
        if placement is not None and any(m.node_id == lost.node_id for m in placement.members):
            self.s.lost_nodes.add(lost.node_id)

    @workflow.signal
    async def checkpoint(self, report: CheckpointReport) -> None:
        """Rank 0's agent saw a new checkpoint: the newest wins, here and in the store (whose write, an activity, may
        land after a later report's: it also ignores an older one)."""
        if report.attempt != self.s.attempt or not report.path or report.path == self.s.latest_checkpoint:
            return
        # Histories from before the order rule replay as they ran (the report that came last won).
        if report.seq < self.s.checkpoint_seq and workflow.patched(CHECKPOINT_ORDER_PATCH):
            return
        self.s.latest_checkpoint, self.s.checkpoint_seq = report.path, max(report.seq, self.s.checkpoint_seq)
        assert self.job is not None
        record = CheckpointInput(job_id=self.job.job_id, attempt=report.attempt, path=report.path, seq=report.seq)
        await _store(StoreActivities.record_checkpoint, record)

    @workflow.signal
    def limits(self, change: LimitsChange) -> None:
        """The job's owner lowered its max runtime while it waited (it counts from the next attempt's start)."""
        if change.max_runtime_s is not None and change.max_runtime_s > 0:
            self.s.max_runtime_s = min(change.max_runtime_s, self.s.max_runtime_s or change.max_runtime_s)

    @workflow.signal
    def member_started(self, started: MemberStarted) -> None:
        placement = self.s.placement
        if placement is not None and started.allocation_id == placement.allocation_id:
            self.s.started_members.add(started.rank)

    @workflow.query
    def status(self) -> JobStatus:
        placement = self.s.placement
        return JobStatus(
            state=self.s.state,
            attempt=self.s.attempt,
            allocation_id=placement.allocation_id if placement else None,
            started_members=sorted(self.s.started_members),
        )

    # ------------------------------------------------------------ main loop

    @workflow.run
    async def run(self, job: JobInput) -> JobOutcome:
        self.job = job
        self.s.attempt = job.attempt
        # What an earlier run of this workflow (which continued as new) carried over.
        self.s.own_failures, self.s.infra_failures = job.own_failures, job.infra_failures
        if job.cancel_reason is not None:
            self.s.cancel = CancelRequest(reason=job.cancel_reason)
        try:
            outcome = await self._lifecycle(job)
        except asyncio.CancelledError:
            # Cancelled from Temporal itself (UI or CLI): end the same way as a cancel signal.
            self.s.cancelled_through_temporal = True
            outcome = await self._finish(JobState.CANCELLED, None, "workflow cancelled", "cancel")
        await workflow.wait_condition(workflow.all_handlers_finished)
        if outcome.state in (JobState.FAILED, JobState.TIMED_OUT, JobState.CANCELLED) and workflow.patched(OUTCOME_PATCH):
            # Temporal's own status (and its UI's filters) say what became of the job.
            if outcome.state == JobState.CANCELLED:
                if self.s.cancelled_through_temporal:
                    raise asyncio.CancelledError(outcome.reason)
                return outcome  # a cancel signal: completed, with the JobState search attribute CANCELLED
            kind = JOB_FAILED if outcome.state == JobState.FAILED else JOB_TIMED_OUT
            raise ApplicationError(f"{outcome.state.value}: {outcome.reason}", outcome, type=kind, non_retryable=True)
        return outcome

    async def _lifecycle(self, job: JobInput) -> JobOutcome:
        while True:
            await self._set_state(JobState.QUEUED)
            await _store(StoreActivities.mark_queued, QueuedInput(job_id=job.job_id, attempt=self.s.attempt))
            await self._wait(lambda: self.s.placement is not None or self.s.cancel is not None)
            if self.s.cancel is not None:
                return await self._finish(JobState.CANCELLED, None, self.s.cancel.reason, "cancel")
            placement = self.s.placement
            assert placement is not None
            try:
                await self._transition(JobState.LAUNCHING, f"launching-{self.s.attempt}", "launching", placement.allocation_id)
            except ActivityError as err:
                if isinstance(err.cause, ApplicationError) and err.cause.type == "StalePlacement":
                    workflow.logger.warning("dropping placement %s: %s", placement.allocation_id, err.cause)
                    self.s.placement = None
                    continue
                raise
            # Checkpoints are in the store (histories from before that replay as they ran: from the reports' signals).
            if self.s.attempt > 1 and workflow.patched(BOUNDED_HISTORY_PATCH):
                stored = await _store(StoreActivities.latest_checkpoint, JobRef(job_id=job.job_id))
                self.s.latest_checkpoint = stored or self.s.latest_checkpoint
            result = await self._run_gang(job, placement)
            while result.kind == GangOutcome.RESIZED:
                result, placement = await self._resize(job, placement, result)
            # Histories from before the fence rule replay as they ran (they waited the grace period on a loss).
            fence_rule = workflow.patched(FENCE_PATCH)
            if fence_rule and result.unconfirmed:
                await self._fence(job, placement, result)
            if result.kind == GangOutcome.SUCCEEDED:
                return await self._finish(JobState.SUCCEEDED, 0, "all members exited 0", "end")
            if result.kind == GangOutcome.CANCELLED:
                reason = self.s.cancel.reason if self.s.cancel else "cancelled"
                return await self._finish(JobState.CANCELLED, result.exit_code, reason, "cancel")
            if result.kind == GangOutcome.TIMED_OUT:
                return await self._finish(JobState.TIMED_OUT, result.exit_code, result.reason, "end")
            if result.kind == GangOutcome.PREEMPTED:
                await self._requeue(result.reason)
                continue
            if result.kind == GangOutcome.FAILED:
                self.s.own_failures += 1
                if self.s.own_failures > job.retries:
                    return await self._finish(JobState.FAILED, result.exit_code, result.reason, "end")
                await self._requeue(f"job failed ({result.reason}); retry {self.s.own_failures} of {job.retries}")
                continue
            # Lost: infrastructure, not the job's fault. Back off, then queue again.
            self.s.infra_failures += 1
            if self.s.infra_failures > job.infra_retry_limit:
                return await self._finish(
                    JobState.FAILED, None, f"gave up after {self.s.infra_failures} infrastructure failures: {result.reason}", "end"
                )
            # Every member's end is confirmed by now: by its agent, or by the fence wait above.
            backoff = job.infra_retry_backoff_s * 2 ** (self.s.infra_failures - 1)
            await workflow.sleep(backoff if fence_rule else job.grace_period_s + backoff)
            await self._requeue(result.reason)

    async def _resize(self, job: JobInput, placement: Placement, stopped: GangResult) -> tuple[GangResult, Placement]:
        """Every member has stopped for a resize: replace the allocation in the store and launch the gang again at
        the new size, from the latest checkpoint. A resize the store refuses (a GPU it adds was taken meanwhile)
        launches the gang again as it was. What came meanwhile (cancel, preemption, a node lost) ends the attempt as
        it would have otherwise; so does a member whose end no agent confirmed (it is fenced as a lost one)."""
        request = self.s.resize
        assert request is not None
        self.s.resize = None
        if stopped.unconfirmed:
            return GangResult(GangOutcome.LOST, None, "a member's end was not confirmed while resizing", stopped.unconfirmed), placement
        answer = await _store(StoreActivities.resize, self._resize_input(job, placement, request, begin=False))
        if answer.refused:
            workflow.logger.warning("resize of %s refused: %s; launching it again as it was", job.job_id, answer.refused)
        else:
            placement = Placement(
                allocation_id=answer.allocation_id, attempt=self.s.attempt, members=answer.members, master_addr=answer.master_addr
            )
            self.s.placement = placement
            self.s.lost_nodes &= {m.node_id for m in placement.members}
        if self.s.cancel is not None:
            return GangResult(GangOutcome.CANCELLED, None, "cancelled"), placement
        if self.s.preempt is not None:
            await self._transition(JobState.PREEMPTING, f"preempting-{self.s.attempt}", self.s.preempt.reason, placement.allocation_id)
            return GangResult(GangOutcome.PREEMPTED, None, f"preempted: {self.s.preempt.reason}"), placement
        if self.s.lost_nodes:
            return GangResult(GangOutcome.LOST, None, f"node(s) {', '.join(sorted(self.s.lost_nodes))} lost"), placement
        stored = await _store(StoreActivities.latest_checkpoint, JobRef(job_id=job.job_id))
        self.s.latest_checkpoint = stored or self.s.latest_checkpoint
        self.s.started_members = set()
        return await self._run_gang(job, placement, resumed=True), placement

    async def _fence(self, job: JobInput, placement: Placement, result: GangResult) -> None:
        """Make sure the members whose end is unconfirmed are dead before the GPUs or the job move on.

        Revoking the allocation makes every heartbeat answer after it leave the allocation out, so no
        agent renews those members' leases any more; each member's shim SIGTERMs its group when its lease
        (the send time of the last heartbeat whose answer held the allocation, plus self_fence_after_s)
        runs out and SIGKILLs it one grace period later, whether its agent is dead, frozen or cut off
        (worker_agent/shim.py). So the members are gone once the lease, the grace period and a margin have
        passed since the revocation (:func:`fairgang.fencing.surely_dead_after_s`); the GPUs stay held meanwhile.
        """
        ranks = ", ".join(map(str, result.unconfirmed))
        reason = f"member(s) {ranks} ended unconfirmed ({result.reason}): waiting until they are surely dead"
        revoke = RevokeInput(job_id=job.job_id, allocation_id=placement.allocation_id, reason=reason)
        await _store(StoreActivities.revoke_allocation, revoke)
        await workflow.sleep(surely_dead_after_s(job.self_fence_after_s, job.grace_period_s))

    async def _run_gang(self, job: JobInput, placement: Placement, *, resumed: bool = False) -> GangResult:
        """Launch one activity per member, watch them, stop all if one fails (or for a resize: ``resumed`` launches
        them again after one)."""
        members = sorted(placement.members, key=lambda m: m.rank)
        world = len(members)
        results: dict[int, LaunchResult | BaseException] = {}
        relaunched: dict[int, int] = {}

        def start_launch(member: PlacedMember, adopt: bool = False) -> asyncio.Future[LaunchResult]:
            launch = launch_input(job, placement, member, attempt=self.s.attempt, resume_from=self.s.latest_checkpoint)
            launch.adopt = adopt
            handle = workflow.start_activity_method(
                LaunchActivities.launch,
                launch,
                task_queue=f"node-{member.node_id}",
                start_to_close_timeout=timedelta(seconds=job.max_runtime_s + job.grace_period_s + 300),
                heartbeat_timeout=timedelta(seconds=job.heartbeat_timeout_s),
                # Launched again to adopt: its agent may take as long to come back as the member's lease lasts.
                schedule_to_start_timeout=timedelta(
                    seconds=max(job.launch_start_timeout_s, job.self_fence_after_s) if adopt else job.launch_start_timeout_s
                ),
                # No retry by Temporal: the workflow decides (it launches again for an agent's restart, and
                # re-places the job when the node is lost).
                retry_policy=RetryPolicy(maximum_attempts=1),
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )
            handle.add_done_callback(functools.partial(_record_outcome, results, member.rank))
            return handle

        handles = [start_launch(member) for member in members]

        def member_failed() -> bool:
            return any(isinstance(r, BaseException) or r.exit_code != 0 for r in results.values())

        def agent_restarted(rank: int) -> bool:
            """The member's launch stopped heartbeating, or its agent said it is stopping, on a node not lost."""
            r = results.get(rank)
            if not isinstance(r, ActivityError) or members[rank].node_id in self.s.lost_nodes:
                return False
            if self.s.cancel is not None or self.s.preempt is not None or self.s.resize is not None:
                return False
            if relaunched.get(rank, 0) >= MAX_RELAUNCHES:
                return False
            cause = r.cause
            return (isinstance(cause, ActivityTimeoutError) and cause.type == TimeoutType.HEARTBEAT) or (
                isinstance(cause, ApplicationError) and cause.type == AGENT_RESTARTING
            )

        self.s.running_recorded = False
        if resumed and self.s.deadline is not None:  # launched again after a resize: the limit counts from the attempt's start
            deadline = datetime.fromtimestamp(self.s.deadline, UTC)
        else:
            deadline = workflow.now() + timedelta(seconds=self.s.max_runtime_s or job.max_runtime_s)
            self.s.deadline = deadline.timestamp()
        timed_out = False
        while True:
            remaining = (deadline - workflow.now()).total_seconds()
            try:
                await self._wait(
                    lambda: (
                        len(results) == world
                        or member_failed()
                        or self.s.cancel is not None
                        or self.s.preempt is not None
                        or self.s.resize is not None
                        or bool(self.s.lost_nodes)
                        or (not self.s.running_recorded and len(self.s.started_members) == world)
                    ),
                    timeout=max(remaining, 0.001),
                )
            except TimeoutError:
                timed_out = True
                break
            if not self.s.running_recorded and len(self.s.started_members) == world:
                self.s.running_recorded = True
                await self._transition(JobState.RUNNING, f"running-{self.s.attempt}", f"{world} member(s) running", placement.allocation_id)
                continue
            again = [rank for rank in sorted(results) if agent_restarted(rank)]
            if again and workflow.patched(RELAUNCH_PATCH):
                for rank in again:
                    workflow.logger.info("member %d of %s: its agent restarted; launching it again to adopt it", rank, job.job_id)
                    relaunched[rank] = relaunched.get(rank, 0) + 1
                    del results[rank]
                    handles[rank] = start_launch(members[rank], adopt=True)
                continue
            break
        stopping = len(results) < world
        stops: list[asyncio.Future[StopResult]] = []
        # Histories from before the stop activity replay as they ran (the stop reached members with a heartbeat).
        if stopping and workflow.patched(STOP_PATCH):
            why = self._stop_reason(timed_out)
            for member, handle in zip(members, handles, strict=True):
                if not handle.done():
                    stops.append(self._stop_member(job, placement, member.node_id, member.rank, why))
        if stopping and self.s.preempt is not None and self.s.cancel is None and not timed_out:
            await self._transition(JobState.PREEMPTING, f"preempting-{self.s.attempt}", self.s.preempt.reason, placement.allocation_id)
        elif stopping and self._resizing(timed_out):
            assert self.s.resize is not None
            await _store(StoreActivities.resize, self._resize_input(job, placement, self.s.resize, begin=True))
        if stopping:
            for handle in handles:
                if not handle.done():
                    handle.cancel()
            await asyncio.gather(*handles, return_exceptions=True)
            # A stop still waiting in a dead node's queue is moot once every launch has ended.
            for stop in stops:
                if not stop.done():
                    stop.cancel()
            await asyncio.gather(*stops, return_exceptions=True)
        judged = self._judge(results, timed_out=timed_out, stopping=stopping)
        judged.unconfirmed = [rank for rank, r in sorted(results.items()) if not confirmed_end(r, rank in relaunched)]
        return judged

    def _stop_member(self, job: JobInput, placement: Placement, node_id: str, rank: int, why: str) -> asyncio.Future[StopResult]:
        """The `stop` activity on the member's node: its agent SIGTERMs the member at once (the launch activity's
        own cancellation reaches it only with a heartbeat answer, which the SDK throttles to 0.8 x the heartbeat
        timeout); the launch then waits out the grace period from that SIGTERM, SIGKILLs and ends "terminated"."""
        stop = StopInput(job_id=job.job_id, allocation_id=placement.allocation_id, attempt=self.s.attempt, rank=rank, reason=why)
        return workflow.start_activity_method(
            LaunchActivities.stop,
            stop,
            task_queue=f"node-{node_id}",
            # A node that does not answer in this time is handled as lost (its launch's heartbeat times out).
            schedule_to_close_timeout=timedelta(seconds=max(job.heartbeat_timeout_s, 10.0)),
            retry_policy=STOP_RETRY,
        )

    def _stop_reason(self, timed_out: bool) -> str:
        if self.s.cancel is not None:
            return f"cancel: {self.s.cancel.reason}"
        if timed_out:
            return "max runtime reached"
        if self.s.preempt is not None:
            return f"preempt: {self.s.preempt.reason}"
        if self.s.lost_nodes:
            return f"node(s) {', '.join(sorted(self.s.lost_nodes))} lost"
        if self.s.resize is not None:
            return f"resize from {self.s.resize.from_gpus} to {self.s.resize.to_gpus} GPUs"
        return "another member of the gang ended"

    def _resize_input(self, job: JobInput, placement: Placement, request: ResizeRequest, *, begin: bool) -> ResizeInput:
        """The store's resize activity's input: its RESIZING event (``begin``), or the allocation's replacement."""
        return ResizeInput(
            job_id=job.job_id,
            attempt=self.s.attempt,
            allocation_id=placement.allocation_id,
            members=request.members,
            from_gpus=request.from_gpus,
            to_gpus=request.to_gpus,
            reason=request.reason,
            begin=begin,
        )

    def _resizing(self, timed_out: bool) -> bool:
        """Whether the gang stops for a resize alone (nothing that ends the attempt came too)."""
        s = self.s
        return s.resize is not None and s.cancel is None and s.preempt is None and not s.lost_nodes and not timed_out

    def _judge(self, results: dict[int, LaunchResult | BaseException], *, timed_out: bool, stopping: bool) -> GangResult:
        """How the attempt ended. What the platform asked for comes first, then what happened."""
        if self.s.cancel is not None and stopping:
            return GangResult(GangOutcome.CANCELLED, None, "cancelled")
        if timed_out:
            return GangResult(GangOutcome.TIMED_OUT, None, "max runtime reached")
        if self.s.preempt is not None and stopping:
            return GangResult(GangOutcome.PREEMPTED, None, f"preempted: {self.s.preempt.reason}")
        if self.s.lost_nodes and stopping:
            return GangResult(GangOutcome.LOST, None, f"node(s) {', '.join(sorted(self.s.lost_nodes))} lost")
        if self._resizing(timed_out) and stopping and not member_ended_alone(results):
            return GangResult(GangOutcome.RESIZED, None, "resizing")
        for rank in sorted(results):
            r = results[rank]
            if isinstance(r, ActivityError) and isinstance(r.cause, ActivityTimeoutError):
                if r.cause.type == TimeoutType.HEARTBEAT:
                    return GangResult(GangOutcome.LOST, None, f"member {rank} lost (no heartbeat)")
                if r.cause.type == TimeoutType.SCHEDULE_TO_START:
                    return GangResult(GangOutcome.LOST, None, f"member {rank} lost (its node did not pick it up)")
        # The job's own failures first: the members the workflow stopped because of them are not news.
        for rank in sorted(results):
            r = results[rank]
            if isinstance(r, LaunchResult) and r.how == "start_failed":
                return GangResult(GangOutcome.FAILED, r.exit_code, f"member {rank} could not start: {r.error}")
            if isinstance(r, LaunchResult) and r.exit_code != 0 and r.how != "terminated":
                return GangResult(GangOutcome.FAILED, r.exit_code, f"member {rank} exited with code {r.exit_code}")
        for rank in sorted(results):
            r = results[rank]
            if isinstance(r, BaseException):
                cause = r.cause if isinstance(r, ActivityError) and r.cause is not None else r
                return GangResult(GangOutcome.LOST, None, f"member {rank} failed: {cause}")
        if results and all(isinstance(r, LaunchResult) and r.exit_code == 0 for r in results.values()):
            return GangResult(GangOutcome.SUCCEEDED, 0)
        return GangResult(GangOutcome.LOST, None, "gang ended without a result")

    async def _wait(self, condition: Callable[[], bool], timeout: float | None = None) -> None:
        """wait_condition that turns a Temporal cancel of the workflow into a cancel request."""
        try:
            await workflow.wait_condition(condition, timeout=timeout)
        except asyncio.CancelledError:
            self.s.cancelled_through_temporal = True
            if self.s.cancel is None:
                self.s.cancel = CancelRequest(reason="workflow cancelled through Temporal")

    # ------------------------------------------------------------ store writes

    async def _set_state(self, state: JobState) -> None:
        self.s.state = state
        workflow.upsert_search_attributes([JOB_STATE.value_set(state.value)])

    async def _transition(self, state: JobState, key: str, message: str, allocation_id: str | None = None) -> None:
        assert self.job is not None
        await _store(
            StoreActivities.record_transition,
            TransitionInput(
                job_id=self.job.job_id, attempt=self.s.attempt, state=state, event_key=key, message=message, allocation_id=allocation_id
            ),
        )
        await self._set_state(state)

    async def _requeue(self, reason: str) -> None:
        assert self.job is not None
        await workflow.wait_condition(workflow.all_handlers_finished)
        await _store(StoreActivities.requeue, RequeueInput(job_id=self.job.job_id, from_attempt=self.s.attempt, reason=reason))
        self.s.attempt += 1
        self.s.checkpoint_seq = 0
        self.s.placement = None
        self.s.started_members = set()
        self.s.preempt = None
        self.s.lost_nodes = set()
        if workflow.patched(BOUNDED_HISTORY_PATCH):
            # The next attempt in a run of its own (search attributes carry over; a placement signalled to this
            # run meanwhile is signalled again by the placement service's reconciler).
            s = self.s
            cancel = s.cancel.reason if s.cancel is not None else None
            carried = dataclasses.replace(self.job, attempt=s.attempt, own_failures=s.own_failures, infra_failures=s.infra_failures)
            carried.max_runtime_s = s.max_runtime_s or carried.max_runtime_s
            workflow.continue_as_new(dataclasses.replace(carried, cancel_reason=cancel))

    async def _finish(self, state: JobState, exit_code: int | None, reason: str, key: str) -> JobOutcome:
        assert self.job is not None
        # A checkpoint reported as the members stopped is recorded before the job's end is.
        await workflow.wait_condition(workflow.all_handlers_finished)
        await _store(
            StoreActivities.record_transition,
            TransitionInput(
                job_id=self.job.job_id,
                attempt=self.s.attempt,
                state=state,
                event_key=f"{key}-{self.s.attempt}",
                message=reason,
                exit_code=exit_code,
                end_reason=reason,
            ),
        )
        await self._set_state(state)
        return JobOutcome(state=state, attempt=self.s.attempt, exit_code=exit_code, reason=reason)
