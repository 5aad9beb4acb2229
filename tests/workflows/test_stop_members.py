"""Cancel, preempt and a gang's failure reach the members through the `stop` activity, not a heartbeat.

A real Temporal server, a real store, the real launch and stop activities running real processes under
the shim. The activity heartbeat timeout is 300 s and the node workers' heartbeat throttle 300 s too, so
the SDK sends a launch's first heartbeat when it starts and the next one 240 s later: the launch's own
cancellation (which comes only with a heartbeat answer) cannot reach a member within the 30 s the tests
wait. The members ignore SIGTERM and record when it came and when they were last alive, so the tests
also check that the SIGKILL came no earlier than one grace period after the SIGTERM.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.store import StoreActivities
from cli.platform import temporal_binary
from fairgang.settings import CONTROL_TASK_QUEUE, SEARCH_ATTRIBUTES, Settings
from scheduler.service import PlacementService
from store import jobs
from store.db import Database
from tests.builders import job_spec
from worker_agent.launch import LaunchActivities, pid_alive
from workflows import starter
from workflows.job import JOB_FAILED, JOB_STATE, TrainingJobWorkflow
from workflows.messages import JobOutcome, JobStatus

SEARCH = [SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTES]
HEARTBEAT_S = 300.0
#: How long a test waits for an outcome: far below the 240 s until a launch's second heartbeat.
BOUND_S = 30.0
GRACE_S = 2.0
#: The member's records lag the events they record when it is not scheduled at once (a loaded machine),
#: which only makes the grace checks stricter: this much is allowed for it.
LAG_S = 0.5

#: argv[1]/r<rank>: pid, term (each SIGTERM's wall time; ignored), alive (every 20 ms). With FAIL_RANK=<rank>
#: that rank exits 5 a second after it started.
MEMBER = r"""
import os, signal, sys, time
rank = os.environ["RANK"]
d = os.path.join(sys.argv[1], "r" + rank)
os.makedirs(d, exist_ok=True)
def on_term(*_):
    with open(d + "/term", "a") as f:
        f.write(f"{time.time():.6f}\n")
signal.signal(signal.SIGTERM, on_term)
open(d + "/pid", "w").write(str(os.getpid()))
started = time.monotonic()
while True:
    with open(d + "/alive", "a") as f:
        f.write(f"{time.time():.6f}\n")
    if os.environ.get("FAIL_RANK") == rank and time.monotonic() - started > 1.0:
        sys.exit(5)
    time.sleep(0.02)
"""


def times(path: Path) -> list[float]:
    return [float(line) for line in path.read_text().split()] if path.exists() else []


class Harness:
    def __init__(self, client: Client, db: Database, tmp_path: Path) -> None:
        self.client, self.db, self.tmp = client, db, tmp_path
        self.settings = Settings(database_url=db.url, node_stale_after_s=1e13, activity_heartbeat_timeout_s=HEARTBEAT_S)
        self.service = PlacementService(self.settings, db, client, holder="t")
        self.nodes = {
            n: LaunchActivities(node_id=n, log_dir=tmp_path / "logs", checkpoint_root=tmp_path / "ckpt", state_dir=tmp_path / f"state-{n}")
            for n in ("h1", "h2")
        }
        throttle = timedelta(seconds=HEARTBEAT_S)
        control = Worker(client, task_queue=CONTROL_TASK_QUEUE, workflows=[TrainingJobWorkflow], activities=StoreActivities(db).all())  # type: ignore[arg-type]
        self.workers = [control]
        for n, node in self.nodes.items():
            self.workers.append(
                Worker(
                    client,
                    task_queue=f"node-{n}",
                    activities=[node.launch, node.stop],
                    max_heartbeat_throttle_interval=throttle,
                    default_heartbeat_throttle_interval=throttle,
                )
            )

    async def running_job(self, name: str, gpus: int = 1, **env: str) -> tuple[str, Any, Path]:
        """A job whose members run MEMBER (grace 2 s), placed and RUNNING, every member recording itself alive."""
        d = self.tmp / name
        d.mkdir()
        spec = job_spec(
            name=name, entrypoint=[sys.executable, "-c", MEMBER, str(d)], gpu_count=gpus, grace_period=f"{GRACE_S:g}s",
            checkpoint_dir=f"/ckpt/alpha/{name}", env=env,
        )  # fmt: skip
        job, _ = await jobs.create_job(self.db, spec=spec, tenant="alpha")
        handle = await starter.start_job_workflow(self.client, job, self.settings)
        deadline = asyncio.get_running_loop().time() + BOUND_S
        while True:
            await self.service.cycle()
            status = await handle.query("status", result_type=JobStatus)
            ranks = range(max(1, gpus // 8))
            if status.state == "RUNNING" and all((d / f"r{r}" / "alive").exists() for r in ranks):
                return job.id, handle, d
            assert asyncio.get_running_loop().time() < deadline, status
            await asyncio.sleep(0.1)


@pytest.fixture
async def harness(store: Database, tmp_path: Path) -> AsyncIterator[Harness]:
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(), search_attributes=SEARCH)
    h = Harness(env.client, store, tmp_path)
    try:
        async with h.workers[0], h.workers[1], h.workers[2]:
            yield h
    finally:
        await env.shutdown()


def assert_stopped_after_a_whole_grace(d: Path) -> float:
    """The member got exactly one SIGTERM, lived through the grace period counted from it, and is gone."""
    [term] = times(d / "term")
    assert max(times(d / "alive")) >= term + GRACE_S - LAG_S, "SIGKILLed before the grace period after the SIGTERM ran out"
    pid, deadline = int((d / "pid").read_text()), time.monotonic() + 30
    while pid_alive(pid):  # SIGKILLed; gone once it has been reaped
        assert time.monotonic() < deadline, "the member still runs"
        time.sleep(0.02)
    return term


async def test_cancel_reaches_the_member_without_a_heartbeat_and_the_grace_counts_from_the_sigterm(harness: Harness) -> None:
    job_id, handle, d = await harness.running_job("cancel-me")
    await starter.signal_cancel(harness.client, job_id=job_id, reason="by the test")
    outcome: JobOutcome = await asyncio.wait_for(starter.job_outcome(handle), BOUND_S)
    assert outcome.state == "CANCELLED" and outcome.reason == "by the test", outcome
    # The platform's cancel (a signal) completes the workflow; its JobState search attribute says CANCELLED.
    described = await handle.describe()
    assert described.status == WorkflowExecutionStatus.COMPLETED
    assert described.typed_search_attributes.get(JOB_STATE) == "CANCELLED"
    term = assert_stopped_after_a_whole_grace(d / "r0")
    # The end was recorded after the member was gone, so after SIGTERM + grace.
    ended = next(e for e in await jobs.job_events(harness.db, job_id) if e.kind == "CANCELLED")
    assert ended.ts >= term + GRACE_S - LAG_S


async def test_a_cancel_through_temporal_stops_the_member_and_ends_the_workflow_cancelled(harness: Harness) -> None:
    """Temporal's own cancel (its UI, `temporal workflow cancel`): the same graceful stop, and the workflow ends
    Canceled in Temporal, so the UI's status filter finds it."""
    job_id, handle, d = await harness.running_job("cancel-in-temporal")
    await handle.cancel()
    outcome: JobOutcome = await asyncio.wait_for(starter.job_outcome(handle), BOUND_S)
    assert outcome.state == "CANCELLED" and outcome.attempt == 1, outcome
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    assert_stopped_after_a_whole_grace(d / "r0")
    assert (await jobs.get_job(harness.db, job_id)).state == "CANCELLED"  # type: ignore[union-attr]


async def test_preempt_reaches_the_member_without_a_heartbeat_and_requeues_after_the_grace(harness: Harness) -> None:
    job_id, handle, d = await harness.running_job("preempt-me")
    answer = await starter.preempt(harness.client, job_id=job_id, reason="by the test")
    assert answer.accepted
    deadline = asyncio.get_running_loop().time() + BOUND_S
    while (job := await jobs.get_job(harness.db, job_id)) is None or job.attempt < 2:
        assert asyncio.get_running_loop().time() < deadline, job
        await asyncio.sleep(0.1)
    term = assert_stopped_after_a_whole_grace(d / "r0")
    events = await jobs.job_events(harness.db, job_id)
    requeued = next(e for e in events if e.kind == "REQUEUED")
    assert requeued.message == "preempted: by the test" and requeued.ts >= term + GRACE_S - LAG_S
    # Attempt 2 waits in the queue (no placement cycle runs now): a cancel ends it.
    await starter.signal_cancel(harness.client, job_id=job_id, reason="done")
    assert (await asyncio.wait_for(starter.job_outcome(handle), BOUND_S)).state == "CANCELLED"


async def test_a_failed_gang_member_stops_the_other_without_a_heartbeat_and_its_exit_code_is_the_jobs(harness: Harness) -> None:
    """Rank 1 exits 5; rank 0 ignores SIGTERM. The stopped rank's own end (SIGKILL) is not the job's failure."""
    _, handle, d = await harness.running_job("gang-fails", gpus=16, FAIL_RANK="1")
    outcome: JobOutcome = await asyncio.wait_for(starter.job_outcome(handle), BOUND_S)
    assert outcome.state == "FAILED" and outcome.exit_code == 5, outcome
    assert outcome.reason == "member 1 exited with code 5"
    # Temporal's own status says it: the workflow failed, non-retryable, with the job's reason.
    assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == JOB_FAILED and cause.non_retryable
    assert cause.message == "FAILED: member 1 exited with code 5"
    assert_stopped_after_a_whole_grace(d / "r0")
    assert times(d / "r1" / "term") == []  # it ended on its own
