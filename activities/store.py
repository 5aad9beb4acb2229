"""Store activities, run by the control-plane worker. Each is idempotent."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from fairgang.members import members_of
from fairgang.spec import JobState
from store import jobs, nodes, placement
from store.db import Database
from workflows.messages import (
    CheckpointInput,
    JobRef,
    QueuedInput,
    RequeueInput,
    ResizeInput,
    ResizeResult,
    RevokeInput,
    TransitionInput,
)


class StoreActivities:
    """Job state transitions written to the store (keyed by job id, attempt and event key)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @activity.defn(name="mark_queued")
    async def mark_queued(self, inp: QueuedInput) -> None:
        await jobs.mark_queued(self.db, job_id=inp.job_id, attempt=inp.attempt)

    @activity.defn(name="record_transition")
    async def record_transition(self, inp: TransitionInput) -> str:
        try:
            return await self._record_transition(inp)
        except jobs.StalePlacement as err:
            raise ApplicationError(str(err), type="StalePlacement", non_retryable=True) from None

    async def _record_transition(self, inp: TransitionInput) -> str:
        job = await jobs.record_transition(
            self.db,
            job_id=inp.job_id,
            attempt=inp.attempt,
            state=JobState(inp.state),
            event_key=inp.event_key,
            message=inp.message,
            allocation_id=inp.allocation_id,
            exit_code=inp.exit_code,
            end_reason=inp.end_reason,
        )
        return job.state

    @activity.defn(name="requeue")
    async def requeue(self, inp: RequeueInput) -> int:
        job = await jobs.requeue_job(self.db, job_id=inp.job_id, from_attempt=inp.from_attempt, reason=inp.reason)
        return job.attempt

    @activity.defn(name="revoke_allocation")
    async def revoke_allocation(self, inp: RevokeInput) -> bool:
        return await placement.revoke_allocation(self.db, job_id=inp.job_id, allocation_id=inp.allocation_id, reason=inp.reason)

    @activity.defn(name="record_checkpoint")
    async def record_checkpoint(self, inp: CheckpointInput) -> bool:
        """Record the job's checkpoint, unless a newer one is recorded already (False then)."""
        return await jobs.set_latest_checkpoint(self.db, job_id=inp.job_id, checkpoint=inp.path, attempt=inp.attempt, seq=inp.seq)

    @activity.defn(name="latest_checkpoint")
    async def latest_checkpoint(self, inp: JobRef) -> str:
        """The job's latest checkpoint in the store ("" if none): what its next attempt resumes from."""
        return await jobs.latest_checkpoint(self.db, inp.job_id)

    @activity.defn(name="resize")
    async def resize(self, inp: ResizeInput) -> ResizeResult:
        """An elastic job's resize: the RESIZING event (``begin``), or its allocation replaced by one of ``members``
        (refused, with the reason, when the allocation is no longer live or a GPU it adds is taken)."""
        if inp.begin:
            await placement.begin_resize(
                self.db,
                job_id=inp.job_id,
                attempt=inp.attempt,
                allocation_id=inp.allocation_id,
                from_gpus=inp.from_gpus,
                to_gpus=inp.to_gpus,
                reason=inp.reason,
            )
            return ResizeResult(allocation_id=inp.allocation_id, members=inp.members)
        try:
            alloc = await placement.resize_allocation(
                self.db,
                job_id=inp.job_id,
                attempt=inp.attempt,
                allocation_id=inp.allocation_id,
                members=inp.members,
                reason=inp.reason,
            )
        except placement.ResizeRefused as err:
            return ResizeResult(allocation_id=inp.allocation_id, members=[], refused=str(err))
        members = members_of(alloc.members)
        first = min(members, key=lambda m: m.rank).node_id
        return ResizeResult(allocation_id=alloc.id, members=members, master_addr=await nodes.node_address(self.db, first) or "")

    def all(self) -> list[object]:
        return [
            self.mark_queued,
            self.record_transition,
            self.requeue,
            self.revoke_allocation,
            self.record_checkpoint,
            self.latest_checkpoint,
            self.resize,
        ]
