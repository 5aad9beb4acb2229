"""A job's workflow history stays bounded however many checkpoints it reports and however often it is requeued.

A real Temporal server and store and the placement service; the launch activity is a stand-in that reports its
checkpoints as the agent's API route does (``store.jobs.report_checkpoint``), 1,250 per attempt, and runs
until stopped (attempts 1 to 4, each preempted) or ends at once (attempt 5). 5,000 checkpoint reports and four
requeues: each requeue continues the workflow as new, and no run's history holds a checkpoint.
"""

from __future__ import annotations

import asyncio
import collections

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
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
from tests.workflows.test_checkpoint_order import until_state
from workflows import starter
from workflows.job import TrainingJobWorkflow
from workflows.messages import JobStatus, LaunchInput, LaunchResult, MemberStarted, StopInput, StopResult

SEARCH = [SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTES]
ATTEMPTS, REPORTS = 5, 1250
#: The stated bound: events in one run of a one-member job's workflow (one attempt: queued, placed, launched,
#: running, preempted or ended: about 80), whatever its runtime and its number of checkpoints.
RUN_EVENTS_BOUND = 100


class Node:
    """A node's launch and stop activities: each attempt but the last reports its checkpoints and runs until stopped."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.launches: list[LaunchInput] = []
        self.stopped: set[str] = set()
        self.reported = asyncio.Event()

    @activity.defn(name="launch")
    async def launch(self, inp: LaunchInput) -> LaunchResult:
        self.launches.append(inp)
        started = MemberStarted(allocation_id=inp.allocation_id, rank=inp.rank, pid=0)
        await activity.client().get_workflow_handle(inp.job_id).signal("member_started", started)
        if inp.attempt == ATTEMPTS:
            return LaunchResult(exit_code=0, how="exited")
        for seq in range(1, REPORTS + 1):
            path = f"/ckpt/alpha/bounded/attempt-{inp.attempt}/step-{seq}"
            await jobs.report_checkpoint(self.db, node_id=inp.node_id, allocation_id=inp.allocation_id, path=path, seq=seq)
            if seq % 50 == 0:
                activity.heartbeat()
        self.reported.set()
        while inp.allocation_id not in self.stopped:
            activity.heartbeat()
            await asyncio.sleep(0.1)
        return LaunchResult(exit_code=0, how="terminated")

    @activity.defn(name="stop")
    async def stop(self, inp: StopInput) -> StopResult:
        self.stopped.add(inp.allocation_id)
        return StopResult(outcome="signalled")


async def test_5000_checkpoints_and_four_requeues_keep_every_runs_history_bounded(store: Database) -> None:
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(), search_attributes=SEARCH)
    node = Node(store)
    settings = Settings(database_url=store.url, node_stale_after_s=1e13, scheduler_resignal_after_s=1.0)
    control = Worker(env.client, task_queue=CONTROL_TASK_QUEUE, workflows=[TrainingJobWorkflow], activities=StoreActivities(store).all())  # type: ignore[arg-type]
    workers = [Worker(env.client, task_queue=f"node-{n}", activities=[node.launch, node.stop]) for n in ("h1", "h2")]
    service = PlacementService(settings, store, env.client, holder="t")
    try:
        async with control, workers[0], workers[1]:
            spec = job_spec(name="bounded", grace_period="1s")
            job, _ = await jobs.create_job(store, spec=spec, tenant="alpha")
            handle = await starter.start_job_workflow(env.client, job, settings)
            await jobs.mark_workflow_started(store, job.id)
            for attempt in range(1, ATTEMPTS):
                node.reported.clear()
                status = await until_state(handle, "RUNNING", service)
                assert status.attempt == attempt
                await asyncio.wait_for(node.reported.wait(), 120)
                await starter.preempt(env.client, job_id=job.id, reason=f"requeue {attempt}")
                deadline = asyncio.get_running_loop().time() + 60
                while (status := await handle.query("status", result_type=JobStatus)).attempt == attempt:
                    assert asyncio.get_running_loop().time() < deadline, status
                    await service.cycle()
                    await asyncio.sleep(0.1)
            done = await asyncio.wait_for(asyncio.gather(starter.job_outcome(handle), until_state(handle, "SUCCEEDED", service)), 60)
            assert done[0].state == "SUCCEEDED" and done[0].attempt == ATTEMPTS

            # Each attempt resumed from the checkpoint its predecessor reported last, read from the store.
            resumed = {launch.attempt: launch.resume_from for launch in node.launches}
            assert resumed == {1: "", **{a: f"/ckpt/alpha/bounded/attempt-{a - 1}/step-{REPORTS}" for a in range(2, ATTEMPTS + 1)}}
            stored = await jobs.get_job(store, job.id)
            assert stored is not None and stored.latest_checkpoint == f"/ckpt/alpha/bounded/attempt-{ATTEMPTS - 1}/step-{REPORTS}"

            # One run per attempt, each continued as new but the last; none holds a checkpoint report.
            runs = [w async for w in env.client.list_workflows(f"WorkflowId = '{job.id}'")]
            assert sorted(r.status for r in runs if r.status is not None) == sorted(
                [WorkflowExecutionStatus.CONTINUED_AS_NEW] * (ATTEMPTS - 1) + [WorkflowExecutionStatus.COMPLETED]
            )
            for run in runs:
                history = await env.client.get_workflow_handle(job.id, run_id=run.run_id).fetch_history()
                kinds = collections.Counter(EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in history.events)
                assert len(history.events) <= RUN_EVENTS_BOUND, (run.run_id, len(history.events), kinds)
                signals = [e.workflow_execution_signaled_event_attributes.signal_name for e in history.events
                           if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]  # fmt: skip
                assert "checkpoint" not in signals
            # The search attributes carried over to the last run.
            [last] = [r for r in runs if r.status == WorkflowExecutionStatus.COMPLETED]
            assert last.typed_search_attributes.get(SearchAttributeKey.for_keyword("JobState")) == "SUCCEEDED"
            assert last.typed_search_attributes.get(SearchAttributeKey.for_keyword("Tenant")) == "alpha"
    finally:
        await env.shutdown()
