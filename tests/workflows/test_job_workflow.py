"""The job workflow against a real Temporal server and a real store, with a fake launch activity.

Only the launch activity is replaced (registered under its real name on the node's queue),
so these tests drive the workflow's message handling and retry rules directly.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.store import StoreActivities
from cli.platform import temporal_binary
from fairgang.fencing import FENCE_MARGIN_S
from fairgang.members import PlacedMember, members_of
from fairgang.settings import CONTROL_TASK_QUEUE, SEARCH_ATTRIBUTES, Settings
from scheduler.service import PlacementService
from store import jobs, placement
from store.db import Database
from tests.builders import job_spec
from workflows import starter
from workflows.job import TrainingJobWorkflow
from workflows.messages import JobOutcome, JobStatus, LaunchInput, LaunchResult, MemberStarted, Placement

SEARCH = [SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTES]


class FakeNode:
    """The launch activity of nodes h1 and h2, controlled by the test."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls: list[LaunchInput] = []
        #: When each launch came (monotonic).
        self.times: list[float] = []
        self.release = asyncio.Event()

    @activity.defn(name="launch")
    async def launch(self, inp: LaunchInput) -> LaunchResult:
        self.calls.append(inp)
        self.times.append(time.monotonic())
        if self.mode == "crash":
            raise ApplicationError("simulated infrastructure failure")
        started = MemberStarted(allocation_id=inp.allocation_id, rank=inp.rank, pid=0)
        await activity.client().get_workflow_handle(inp.job_id).signal("member_started", started)
        while not self.release.is_set():
            activity.heartbeat()
            await asyncio.sleep(0.2)
        return LaunchResult(exit_code=0)


async def _platform(client: Client, db: Database, node: FakeNode, stack: list[Worker]) -> None:
    control = Worker(client, task_queue=CONTROL_TASK_QUEUE, workflows=[TrainingJobWorkflow], activities=StoreActivities(db).all())  # type: ignore[arg-type]
    nodes = [Worker(client, task_queue=f"node-{n}", activities=[node.launch]) for n in ("h1", "h2")]
    stack.extend([control, *nodes])


Handle = WorkflowHandle[TrainingJobWorkflow, JobOutcome]


async def _start(client: Client, db: Database, settings: Settings, name: str) -> tuple[str, Handle]:
    job, _ = await jobs.create_job(db, spec=job_spec(name=name, max_runtime="3h", grace_period="1s"), tenant="alpha")
    handle = await starter.start_job_workflow(client, job, settings)
    return job.id, handle


async def _until(predicate, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.1)


async def test_stale_bogus_and_duplicate_placements_are_dropped(store: Database) -> None:
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(), search_attributes=SEARCH)
    node = FakeNode("wait")
    workers: list[Worker] = []
    await _platform(env.client, store, node, workers)
    settings = Settings(database_url=store.url, node_stale_after_s=1e13)
    try:
        async with workers[0], workers[1], workers[2]:
            job_id, handle = await _start(env.client, store, settings, f"p-{uuid.uuid4().hex[:6]}")

            async def queued() -> bool:
                job = await jobs.get_job(store, job_id)
                return job is not None and job.workflow_started

            await _until(queued)
            member = [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)]
            await handle.signal("place", Placement(allocation_id="a-stale", attempt=99, members=member))
            await handle.signal("place", Placement(allocation_id="a-bogus", attempt=1, members=member))
            await asyncio.sleep(1.5)
            status = await handle.query("status", result_type=JobStatus)
            assert status.state == "QUEUED" and status.allocation_id is None
            assert node.calls == []
            # The real binding, signalled three times: one launch.
            report = await PlacementService(settings, store, env.client, holder="t").cycle()
            assert report.bound == 1
            [alloc] = await jobs.job_allocations(store, job_id)
            for _ in range(2):
                await starter.signal_placement(
                    env.client, job_id=job_id, allocation_id=alloc.id, attempt=1, members=members_of(alloc.members)
                )

            async def running() -> bool:
                return (await handle.query("status", result_type=JobStatus)).state == "RUNNING"

            await _until(running)
            await asyncio.sleep(1.0)
            assert [c.allocation_id for c in node.calls] == [alloc.id]
            node.release.set()
            outcome = await starter.job_outcome(handle)
            assert outcome.state == "SUCCEEDED"
    finally:
        await env.shutdown()


async def test_infrastructure_failures_back_off_then_end_failed_with_the_reason(store: Database) -> None:
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(), search_attributes=SEARCH)
    node = FakeNode("crash")
    workers: list[Worker] = []
    await _platform(env.client, store, node, workers)
    settings = Settings(
        database_url=store.url, node_stale_after_s=1e13, infra_retry_limit=2, infra_retry_backoff_s=1.0, self_fence_after_s=1.0
    )
    service = PlacementService(settings, store, env.client, holder="t")

    async def schedule_forever() -> None:
        while True:
            await service.cycle()
            await asyncio.sleep(0.2)

    try:
        async with workers[0], workers[1], workers[2]:
            scheduler = asyncio.create_task(schedule_forever())
            try:
                job_id, handle = await _start(env.client, store, settings, "crashy")
                outcome = await asyncio.wait_for(starter.job_outcome(handle), 120)
            finally:
                scheduler.cancel()
            assert outcome.state == "FAILED"
            assert "gave up after 3 infrastructure failures" in outcome.reason
            assert len(node.calls) == 3 and [c.attempt for c in node.calls] == [1, 2, 3]
            # A crashed launch does not prove its member dead: the allocation is revoked and the workflow waits
            # out the member lease (1 s), the grace period (1 s) and the margin (FENCE_MARGIN_S), then a backoff that
            # doubles (1 s, then 2 s), before each new attempt.
            first_gap, second_gap = node.times[1] - node.times[0], node.times[2] - node.times[1]
            assert first_gap >= 1.0 + 1.0 + FENCE_MARGIN_S + 1.0 and second_gap >= 1.0 + 1.0 + FENCE_MARGIN_S + 2.0, (first_gap, second_gap)
            revoked = [e for e in await jobs.job_events(store, job_id) if e.kind == "REVOKED"]
            assert [e.attempt for e in revoked] == [1, 2, 3], revoked
            job = await jobs.get_job(store, job_id)
            assert job is not None and job.state == "FAILED" and job.end_reason == outcome.reason
            assert await placement.live_allocation_gpus(store) == []
    finally:
        await env.shutdown()
