"""The sweep workflow's own history, on a real Temporal dev server.

The store activities are replaced by fakes kept in memory and the trials by a stub
``TrainingJob`` workflow (same name, same ``cancel`` signal), so these tests look only at what
the ``Sweep`` workflow does: batching with continue-as-new at scale, every trial started once,
the concurrency cap, and cancellation reaching every trial (adopted ones too, and one whose
job was being created when the cancel landed). Each trial is an ordinary job:
a trial held back by the tenant's concurrent-job cap ("wait") is tried again, never skipped,
and one refused by admission at start time ("refused") ends there while the sweep goes on.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

import workflows.sweep
from cli.platform import temporal_binary
from fairgang.settings import CONTROL_TASK_QUEUE, SEARCH_ATTRIBUTES
from fairgang.spec import JobState
from tests.builders import max_overlap
from workflows.messages import CancelRequest, JobInput, JobOutcome
from workflows.sweep import SweepWorkflow
from workflows.sweep_messages import (
    FinishSweepInput,
    OpenSweepInput,
    OpenSweepResult,
    SweepCancel,
    SweepInput,
    SweepStatus,
    TrialInput,
    TrialStart,
    TrialStates,
    TrialStatesInput,
)

SEARCH = [SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTES]

#: What the stub trials did, by job id (the worker runs unsandboxed, in this process).
CANCELLED: dict[str, str] = {}


@workflow.defn(name="TrainingJob")
class StubTrial:
    """A trial: runs ``hold`` seconds (forever when negative) or until its job's ``cancel`` signal."""

    def __init__(self) -> None:
        self.cancel_reason: str | None = None

    @workflow.signal
    def cancel(self, request: CancelRequest) -> None:
        self.cancel_reason = request.reason
        CANCELLED[workflow.info().workflow_id] = request.reason

    @workflow.run
    async def run(self, job: JobInput) -> JobOutcome:
        hold = float(job.env.get("HOLD", "0"))
        try:
            await workflow.wait_condition(lambda: self.cancel_reason is not None, timeout=hold if hold >= 0 else None)
        except TimeoutError:
            return JobOutcome(state=JobState.SUCCEEDED, attempt=1, exit_code=0)
        return JobOutcome(state=JobState.CANCELLED, attempt=1, reason=self.cancel_reason or "")


class FakeStore:
    """The sweep activities over an in-memory store; ``hold(i)`` says how long trial i runs."""

    def __init__(self, trials: int, cap: int, hold: Any) -> None:
        self.trials, self.cap, self.hold = trials, cap, hold
        self.sweep_id = f"sw-{uuid.uuid4().hex[:8]}"
        self.created: dict[int, int] = {}
        self.finished: list[FinishSweepInput] = []
        #: When set, create_trial of this index waits for ``release`` (and says so in ``entered``).
        self.block_index: int | None = None
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        #: The tenant's concurrent-job cap (like ``store.jobs.create_job``'s): "wait" while this many trials are unfinished.
        self.tenant_cap: int | None = None
        #: Trials that admission refuses at start time (the tenant's policy changed), with the reason.
        self.refuse: dict[int, str] = {}
        #: create_trial answers other than "created", by trial index.
        self.waits: dict[int, int] = {}
        self.refusals: dict[int, int] = {}

    def job_id(self, index: int) -> str:
        return f"{self.sweep_id}-{index:04d}"

    @activity.defn(name="open_sweep")
    async def open_sweep(self, inp: OpenSweepInput) -> OpenSweepResult:
        return OpenSweepResult(sweep_id=self.sweep_id, trial_count=self.trials, max_concurrent=self.cap, state="RUNNING")

    @activity.defn(name="create_trial")
    async def create_trial(self, inp: TrialInput) -> TrialStart:
        if inp.index == self.block_index:
            self.entered.set()
            await self.release.wait()
        if inp.index in self.refuse:
            self.refusals[inp.index] = self.refusals.get(inp.index, 0) + 1
            return TrialStart(status="refused", reason=self.refuse[inp.index])
        if self.tenant_cap is not None and await self._unfinished() >= self.tenant_cap:
            self.waits[inp.index] = self.waits.get(inp.index, 0) + 1
            return TrialStart(status="wait", reason=f"tenant 'alpha' already has {self.tenant_cap} unfinished jobs")
        self.created[inp.index] = self.created.get(inp.index, 0) + 1
        job_id = self.job_id(inp.index)
        job = JobInput(
            job_id=job_id, tenant="alpha", gpu_type="H100-80GB", gpu_count=1, argv=["true"],
            env={"HOLD": str(self.hold(inp.index))}, checkpoint_dir="/ckpt", max_runtime_s=600, grace_period_s=1,
        )  # fmt: skip
        return TrialStart(status="created", job_id=job_id, job=job)

    async def _unfinished(self) -> int:
        """Created trials whose job has not ended (one whose workflow has not started yet counts)."""
        count = 0
        for index in self.created:
            try:
                desc = await activity.client().get_workflow_handle(self.job_id(index)).describe()
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
                count += 1
                continue
            count += desc.status == WorkflowExecutionStatus.RUNNING
        return count

    @activity.defn(name="trial_states")
    async def trial_states(self, inp: TrialStatesInput) -> TrialStates:
        states = {}
        for job_id in inp.job_ids:
            desc = await activity.client().get_workflow_handle(job_id).describe()
            states[job_id] = "RUNNING" if desc.status == WorkflowExecutionStatus.RUNNING else "SUCCEEDED"
        return TrialStates(states=states)

    @activity.defn(name="finish_sweep")
    async def finish_sweep(self, inp: FinishSweepInput) -> dict[str, Any]:
        self.finished.append(inp)
        return {"sweep_id": inp.sweep_id, "state": "CANCELLED" if inp.cancelled else "COMPLETED"}

    def all(self) -> list[Any]:
        return [self.open_sweep, self.create_trial, self.trial_states, self.finish_sweep]


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    environment = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(), search_attributes=SEARCH)
    yield environment
    await environment.shutdown()


def _worker(client: Client, fake: FakeStore) -> Worker:
    return Worker(
        client,
        task_queue=CONTROL_TASK_QUEUE,
        workflows=[SweepWorkflow, StubTrial],
        activities=fake.all(),
        workflow_runner=UnsandboxedWorkflowRunner(),
        max_concurrent_workflow_tasks=50,
    )


async def _start(client: Client, fake: FakeStore, batch_size: int, poll_s: float = 0.3) -> WorkflowHandle[Any, Any]:
    return await client.start_workflow(
        "Sweep",
        SweepInput(tenant="alpha", sweep_id=fake.sweep_id, batch_size=batch_size, poll_s=poll_s),
        id=fake.sweep_id,
        task_queue=CONTROL_TASK_QUEUE,
        execution_timeout=timedelta(minutes=10),
    )


async def _until(predicate: Any, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.1)


async def _sweep_runs(client: Client, sweep_id: str) -> list[Any]:
    """Every run of the sweep workflow (the continue-as-new chain), with its history."""
    runs = []
    async for execution in client.list_workflows(f"WorkflowId = '{sweep_id}'"):
        runs.append(await client.get_workflow_handle(sweep_id, run_id=execution.run_id).fetch_history())
    return runs


async def _children_started(client: Client, sweep_id: str) -> list[str]:
    """The child workflow ids the sweep's runs started, in order, over the whole chain."""
    started = []
    for history in await _sweep_runs(client, sweep_id):
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
                started.append(event.start_child_workflow_execution_initiated_event_attributes.workflow_id)
    return started


#: 1,000 trials (batches of 100) take a few minutes on a small machine: the suite runs a tenth
#: of the batches' size by default; FAIRGANG_SWEEP_SCALE_TRIALS=1000 runs the full size.
SCALE_TRIALS = int(os.environ.get("FAIRGANG_SWEEP_SCALE_TRIALS", "200"))


async def test_a_large_sweep_runs_in_batches_each_trial_started_once_under_the_cap(env: WorkflowEnvironment) -> None:
    trials = SCALE_TRIALS
    batch, cap = trials // 10, trials // 20
    fake = FakeStore(trials, cap, hold=lambda i: 0.5 if i % 10 == 0 else 0)  # some trials run on into the next batch
    async with _worker(env.client, fake):
        handle = await _start(env.client, fake, batch_size=batch)
        result = await asyncio.wait_for(handle.result(), 60 + trials)
    assert result["state"] == "COMPLETED"
    assert [f.cancelled for f in fake.finished] == [False]
    # Each trial's job was created once and its workflow started once, with its own id.
    assert fake.created == dict.fromkeys(range(trials), 1)
    started = await _children_started(env.client, fake.sweep_id)
    assert sorted(started) == [fake.job_id(i) for i in range(trials)]
    # Continue-as-new after each batch: about ten runs, each history bounded by the batch, not by
    # the sweep (Temporal's limits are 51,200 events and 50 MB per run; it warns at 10,240 events).
    runs = await _sweep_runs(env.client, fake.sweep_id)
    assert 10 <= len(runs) <= 12, len(runs)
    sizes = [len(history.events) for history in runs]
    assert max(sizes) < 16 * batch + 200, sizes
    assert max(len(history.to_json()) for history in runs) < 2_000_000
    # The cap: never more than `cap` trials open at once.
    intervals = []
    async for execution in env.client.list_workflows(f"WorkflowId STARTS_WITH '{fake.sweep_id}-'"):
        assert execution.status == WorkflowExecutionStatus.COMPLETED
        assert execution.close_time is not None
        intervals.append((execution.start_time.timestamp(), execution.close_time.timestamp()))
    assert len(intervals) == trials
    assert max_overlap(intervals) <= cap


@pytest.mark.parametrize("how", ["signal", "temporal"])
async def test_cancel_reaches_the_trials_adopted_after_continue_as_new(env: WorkflowEnvironment, how: str) -> None:
    """Batches of 2 and a cap of 3: trials 0 and 1 run on in the second run, which only adopted them."""
    fake = FakeStore(trials=6, cap=3, hold=lambda i: -1)  # every trial runs until cancelled
    async with _worker(env.client, fake):
        handle = await _start(env.client, fake, batch_size=2)

        async def three_running() -> bool:
            status = await handle.query("status", result_type=SweepStatus)
            return status.running == [0, 1, 2]

        await _until(three_running)
        assert len(await _sweep_runs(env.client, fake.sweep_id)) == 2
        if how == "signal":
            await handle.signal("cancel", SweepCancel(reason="stop"))
        else:  # the UI, the CLI, or a schedule's cancel_previous overlap policy
            await handle.cancel()
        result = await asyncio.wait_for(handle.result(), 120)
    assert result["state"] == "CANCELLED"
    assert [f.cancelled for f in fake.finished] == [True]
    ids = [fake.job_id(i) for i in range(3)]
    assert sorted(k for k in CANCELLED if k.startswith(fake.sweep_id)) == ids
    for job_id in ids:
        outcome = await env.client.get_workflow_handle(job_id, result_type=JobOutcome).result()
        assert outcome.state == "CANCELLED"
    assert sorted(fake.created) == [0, 1, 2], "a cancelled sweep started more trials"


async def test_a_temporal_cancel_during_create_trial_still_starts_and_cancels_that_trial(env: WorkflowEnvironment) -> None:
    """The cancel lands while trial 1's job is being created: that job must not be left created but never started."""
    fake = FakeStore(trials=4, cap=2, hold=lambda i: -1)
    fake.block_index = 1
    async with _worker(env.client, fake):
        handle = await _start(env.client, fake, batch_size=100)
        await asyncio.wait_for(fake.entered.wait(), 60)

        async def cancel_seen() -> bool:
            # The workflow ran a task after the cancel request: it has reacted to it.
            kinds = [e.event_type for e in (await handle.fetch_history()).events]
            if EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED not in kinds:
                return False
            after = kinds[kinds.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED) :]
            return EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in after

        await handle.cancel()
        await _until(cancel_seen)
        fake.release.set()
        result = await asyncio.wait_for(handle.result(), 120)
    assert result["state"] == "CANCELLED"
    # Every trial whose job was created was started, and got its job's cancel signal.
    assert sorted(fake.created) == [0, 1]
    for index in fake.created:
        outcome = await env.client.get_workflow_handle(fake.job_id(index), result_type=JobOutcome).result()
        assert outcome.state == "CANCELLED"
        assert fake.job_id(index) in CANCELLED


async def _trial_intervals(client: Client, sweep_id: str, count: int) -> dict[str, tuple[float, float]]:
    """Each trial workflow's (start, close) time, by job id, once ``count`` have closed (visibility may lag)."""
    intervals: dict[str, tuple[float, float]] = {}

    async def all_closed() -> bool:
        intervals.clear()
        async for execution in client.list_workflows(f"WorkflowId STARTS_WITH '{sweep_id}-'"):
            if execution.close_time is None:
                return False
            intervals[execution.id] = (execution.start_time.timestamp(), execution.close_time.timestamp())
        return len(intervals) >= count

    await _until(all_closed)
    return intervals


async def test_trials_held_back_by_the_tenants_job_cap_wait_and_run_one_at_a_time(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep allows 3 trials at once, the tenant 1 job: each trial's create_trial answers "wait" while
    another trial runs; the workflow tries that same trial again later (it neither skips it nor counts it
    finished), so all 4 run, one at a time, and the sweep completes."""
    monkeypatch.setattr(workflows.sweep, "AT_CAP_RETRY_S", 0.3)
    fake = FakeStore(trials=4, cap=3, hold=lambda i: 0.5)
    fake.tenant_cap = 1
    async with _worker(env.client, fake):
        handle = await _start(env.client, fake, batch_size=100)
        result = await asyncio.wait_for(handle.result(), 120)
        status = await handle.query("status", result_type=SweepStatus)
    assert result["state"] == "COMPLETED"
    assert [f.cancelled for f in fake.finished] == [False]
    assert (status.started, status.finished, status.running) == (4, 4, [])
    # Every trial was created once and started once, in order, after having been held back.
    assert fake.created == dict.fromkeys(range(4), 1)
    assert sorted(fake.waits) == [1, 2, 3], fake.waits
    assert await _children_started(env.client, fake.sweep_id) == [fake.job_id(i) for i in range(4)]
    intervals = await _trial_intervals(env.client, fake.sweep_id, 4)
    assert sorted(intervals) == [fake.job_id(i) for i in range(4)]
    assert max_overlap(list(intervals.values())) == 1


async def test_a_trial_refused_at_start_time_ends_there_and_the_sweep_goes_on(env: WorkflowEnvironment) -> None:
    """Admission refuses trials 1 and 2 when they are due (the tenant's policy changed since the submit): they
    are asked once, never started, count as finished, and trial 3 still runs; the sweep completes."""
    fake = FakeStore(trials=4, cap=2, hold=lambda i: 0.2)
    fake.refuse = {1: "max_runtime: 10m is over tenant 'alpha' limit of 5m", 2: "gpu_type: tenant 'alpha' may not use H100-80GB"}
    async with _worker(env.client, fake):
        handle = await _start(env.client, fake, batch_size=100)
        result = await asyncio.wait_for(handle.result(), 120)
        status = await handle.query("status", result_type=SweepStatus)
    assert result["state"] == "COMPLETED"
    assert [f.cancelled for f in fake.finished] == [False]
    assert (status.started, status.finished, status.running) == (4, 4, [])
    assert fake.refusals == {1: 1, 2: 1}, "a refused trial was asked again"
    assert fake.created == {0: 1, 3: 1}
    assert await _children_started(env.client, fake.sweep_id) == [fake.job_id(0), fake.job_id(3)]


async def test_a_cancel_while_a_trial_waits_at_the_tenants_job_cap_creates_no_more_trials(env: WorkflowEnvironment) -> None:
    """Trial 0 runs until cancelled and holds the tenant's only job slot, so trial 1 waits: a cancel then stops
    trial 0 gracefully, and trial 1 is never created (not even once trial 0's slot is free)."""
    fake = FakeStore(trials=3, cap=3, hold=lambda i: -1)
    fake.tenant_cap = 1
    async with _worker(env.client, fake):
        handle = await _start(env.client, fake, batch_size=100)

        async def trial_1_waited() -> bool:
            return fake.waits.get(1, 0) >= 1

        await _until(trial_1_waited)
        await handle.signal("cancel", SweepCancel(reason="stop"))
        result = await asyncio.wait_for(handle.result(), 120)
    assert result["state"] == "CANCELLED"
    assert [f.cancelled for f in fake.finished] == [True]
    assert fake.created == {0: 1}
    outcome = await env.client.get_workflow_handle(fake.job_id(0), result_type=JobOutcome).result()
    assert outcome.state == "CANCELLED"
    assert await _children_started(env.client, fake.sweep_id) == [fake.job_id(0)]
