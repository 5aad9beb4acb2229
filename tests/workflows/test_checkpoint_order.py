"""The newest checkpoint wins: a report older (a lower ``seq`` of the same attempt) than the one the job workflow
has, that comes late, changes neither what the next attempt resumes from nor the store's latest checkpoint.

A real Temporal server and store; the launch activity is a stand-in that records its inputs and runs until
released (or stopped), so the test sends the checkpoint reports itself, out of order.
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.store import StoreActivities
from cli.platform import temporal_binary
from fairgang.settings import CONTROL_TASK_QUEUE, SEARCH_ATTRIBUTES, Settings
from scheduler.service import PlacementService
from store import jobs
from store.db import Database
from tests.builders import job_spec
from workflows import starter
from workflows.job import TrainingJobWorkflow
from workflows.messages import CheckpointReport, JobOutcome, JobStatus, LaunchInput, LaunchResult, MemberStarted, StopInput, StopResult

SEARCH = [SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTES]


class Node:
    """Launch and stop activities of nodes h1 and h2: a launch runs until stopped (attempt 1) or ends at once."""

    def __init__(self) -> None:
        self.launches: list[LaunchInput] = []
        self.stopped: set[str] = set()

    @activity.defn(name="launch")
    async def launch(self, inp: LaunchInput) -> LaunchResult:
        self.launches.append(inp)
        started = MemberStarted(allocation_id=inp.allocation_id, rank=inp.rank, pid=0)
        await activity.client().get_workflow_handle(inp.job_id).signal("member_started", started)
        while inp.attempt == 1 and inp.allocation_id not in self.stopped:
            activity.heartbeat()
            await asyncio.sleep(0.1)
        return LaunchResult(exit_code=0, how="terminated" if inp.attempt == 1 else "exited")

    @activity.defn(name="stop")
    async def stop(self, inp: StopInput) -> StopResult:
        self.stopped.add(inp.allocation_id)
        return StopResult(outcome="signalled")


async def until_state(handle: WorkflowHandle[TrainingJobWorkflow, JobOutcome], state: str, service: PlacementService) -> JobStatus:
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        await service.cycle()
        status = await handle.query("status", result_type=JobStatus)
        if status.state == state:
            return status
        assert asyncio.get_running_loop().time() < deadline, status
        await asyncio.sleep(0.1)


async def test_an_older_checkpoint_report_that_comes_last_does_not_win(store: Database) -> None:
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(), search_attributes=SEARCH)
    node = Node()
    settings = Settings(database_url=store.url, node_stale_after_s=1e13)
    control = Worker(env.client, task_queue=CONTROL_TASK_QUEUE, workflows=[TrainingJobWorkflow], activities=StoreActivities(store).all())  # type: ignore[arg-type]
    nodes = [Worker(env.client, task_queue=f"node-{n}", activities=[node.launch, node.stop]) for n in ("h1", "h2")]
    service = PlacementService(settings, store, env.client, holder="t")
    try:
        async with control, nodes[0], nodes[1]:
            job, _ = await jobs.create_job(store, spec=job_spec(name="ordered", grace_period="1s"), tenant="alpha")
            handle = await starter.start_job_workflow(env.client, job, settings)
            await jobs.mark_workflow_started(store, job.id)
            status = await until_state(handle, "RUNNING", service)
            assert status.allocation_id is not None

            def report(path: str, seq: int) -> CheckpointReport:
                return CheckpointReport(allocation_id=status.allocation_id or "", attempt=1, path=path, seq=seq)

            await handle.signal("checkpoint", report("/ckpt/alpha/ordered/step-1", 1))
            await handle.signal("checkpoint", report("/ckpt/alpha/ordered/step-3", 3))
            await handle.signal("checkpoint", report("/ckpt/alpha/ordered/step-2", 2))  # older than step-3, and late
            await starter.preempt(env.client, job_id=job.id, reason="to resume")
            outcome = await asyncio.wait_for(asyncio.gather(starter.job_outcome(handle), until_state(handle, "SUCCEEDED", service)), 60)
            assert outcome[0].state == "SUCCEEDED" and outcome[0].attempt == 2
            [second] = [launch for launch in node.launches if launch.attempt == 2]
            assert second.resume_from == "/ckpt/alpha/ordered/step-3"
            stored = await jobs.get_job(store, job.id)
            assert stored is not None and stored.latest_checkpoint == "/ckpt/alpha/ordered/step-3"
    finally:
        await env.shutdown()
