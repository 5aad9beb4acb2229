"""Record job workflow histories for the replay test (tests/workflows/test_replay.py).

    .venv/bin/python -m tests.workflows.record_histories PREFIX [SCENARIO ...]

runs each scenario (all without names) against a local Temporal dev server, a SQLite store, the real store
activities and the placement service, and writes each job's history to
``tests/workflows/histories/PREFIX-SCENARIO.json`` (a job requeued continues as new: its earlier runs' histories
go to ``PREFIX-SCENARIO-run-N.json``). The real launch activities report checkpoints to the store as the agent
does (the histories before ``with-bounded-history`` were recorded with agents that signalled them). The members
are real processes run by the real launch and stop activities of nodes h1 and h2, except in the scenarios whose
member's end no agent confirms: there a stand-in launch activity fails, or stops heartbeating, on the first attempt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.store import StoreActivities
from cli.platform import temporal_binary
from fairgang.settings import CONTROL_TASK_QUEUE, SEARCH_ATTRIBUTES, Settings
from scheduler.service import PlacementService
from store import jobs, nodes, tenants
from store.db import Database, migrate
from tests.builders import job_spec
from tests.conftest import small_cluster
from worker_agent.launch import CheckpointReporter, LaunchActivities
from workflows import starter
from workflows.job import TrainingJobWorkflow
from workflows.messages import (
    AGENT_RESTARTING,
    MEMBER_GONE,
    CheckpointReport,
    JobOutcome,
    JobStatus,
    LaunchInput,
    LaunchResult,
    MemberStarted,
)

HISTORIES = Path(__file__).parent / "histories"
SEARCH = [SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTES]
BOUND_S = 90.0

SLEEP = "import time\nwhile True:\n    time.sleep(0.1)"
#: Writes a checkpoint and points CHECKPOINT_DIR/LATEST at it (rank 0 only).
MARK = r"""
import os, signal, sys, time
d, rank, attempt = os.environ["CHECKPOINT_DIR"], os.environ["RANK"], os.environ["FAIRGANG_ATTEMPT"]
def mark(name):
    if rank != "0":
        return
    open(os.path.join(d, name), "w").write(name)
    open(os.path.join(d, "LATEST.tmp"), "w").write(name + "\n")
    os.replace(os.path.join(d, "LATEST.tmp"), os.path.join(d, "LATEST"))
"""
CHECKPOINTS = MARK + "for step in (1, 2):\n    mark(f'step-{step}.ckpt')\n    time.sleep(2.5)\n"
#: Attempt 1 checkpoints, runs until SIGTERM and checkpoints again then; attempt 2 (RESUME_FROM set) exits 0.
PREEMPTIBLE = (
    MARK
    + r"""
if os.environ["RESUME_FROM"]:
    print("resumed from", os.environ["RESUME_FROM"])
    sys.exit(0)
def on_term(*_):
    mark("on-term.ckpt")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
mark("step-1.ckpt")
while True:
    time.sleep(0.1)
"""
)
#: Attempt 1 runs (rank FAIL_RANK exits 5 after a second); later attempts exit 0.
FIRST_ATTEMPT_RUNS = r"""
import os, sys, time
if os.environ["FAIRGANG_ATTEMPT"] != "1":
    sys.exit(0)
started = time.monotonic()
while True:
    if os.environ.get("FAIL_RANK") == os.environ["RANK"] and time.monotonic() - started > 1.0:
        sys.exit(5)
    time.sleep(0.1)
"""


class StandIn:
    """A launch activity whose first attempt ends unconfirmed ("error": it raises; "silent": it stops
    heartbeating, and its launch again finds no member to adopt) or whose agent restarts ("restarting": the
    first launch says so, the launch again adopts the member, which exits 0); later attempts start and exit 0."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    @activity.defn(name="launch")
    async def launch(self, inp: LaunchInput) -> LaunchResult:
        if inp.adopt:
            if self.mode == "restarting":
                return LaunchResult(exit_code=0)
            raise ApplicationError("no member to adopt", type=MEMBER_GONE, non_retryable=True)
        started = MemberStarted(allocation_id=inp.allocation_id, rank=inp.rank, pid=0)
        await activity.client().get_workflow_handle(inp.job_id).signal("member_started", started)
        if inp.attempt == 1 and self.mode == "restarting":
            await asyncio.sleep(0.5)
            raise ApplicationError("the agent is stopping", type=AGENT_RESTARTING)
        if inp.attempt == 1 and self.mode == "error":
            await asyncio.sleep(0.5)
            raise ApplicationError("the agent could not watch its member")
        if inp.attempt == 1 and self.mode == "silent":
            await asyncio.sleep(6.0)  # past the heartbeat timeout: the server fails it
        return LaunchResult(exit_code=0)


@dataclass
class Platform:
    client: Client
    db: Database
    settings: Settings
    service: PlacementService
    ckpt: Path
    placing: asyncio.Event

    async def start(self, name: str, entrypoint: list[str], settings: Settings | None = None, **spec: Any) -> tuple[str, Handle]:
        fields: dict[str, Any] = {"grace_period": "1s", "max_runtime": "1h", "checkpoint_dir": f"/ckpt/alpha/{name}"} | spec
        job, _ = await jobs.create_job(self.db, spec=job_spec(name=name, entrypoint=entrypoint, **fields), tenant="alpha")
        handle = await starter.start_job_workflow(self.client, job, settings or self.settings)
        await jobs.mark_workflow_started(self.db, job.id)
        return job.id, handle

    async def until(self, predicate: Callable[[], Awaitable[bool]], what: str) -> None:
        deadline = time.monotonic() + BOUND_S
        while not await predicate():
            assert time.monotonic() < deadline, f"not reached: {what}"
            await asyncio.sleep(0.1)

    async def state_is(self, handle: Handle, state: str) -> None:
        async def reached() -> bool:
            return (await handle.query("status", result_type=JobStatus)).state == state

        await self.until(reached, state)

    async def checkpointed(self, job_id: str, path_end: str) -> None:
        async def recorded() -> bool:
            job = await jobs.get_job(self.db, job_id)
            return job is not None and (job.latest_checkpoint or "").endswith(path_end)

        await self.until(recorded, f"checkpoint {path_end}")


Handle = WorkflowHandle[Any, JobOutcome]
Scenario = Callable[[Platform], Awaitable[tuple[Handle, str]]]


async def succeeded(p: Platform) -> tuple[Handle, str]:
    _, handle = await p.start("succeeded", ["python3", "-c", "print('done')"])
    return handle, "SUCCEEDED"


async def cancelled(p: Platform) -> tuple[Handle, str]:
    job_id, handle = await p.start("cancelled", ["python3", "-c", SLEEP])
    await p.state_is(handle, "RUNNING")
    await starter.signal_cancel(p.client, job_id=job_id, reason="by the recorder")
    return handle, "CANCELLED"


async def cancelled_queued(p: Platform) -> tuple[Handle, str]:
    p.placing.clear()
    try:
        job_id, handle = await p.start("cancelled-queued", ["python3", "-c", SLEEP])
        await p.state_is(handle, "QUEUED")
        await starter.signal_cancel(p.client, job_id=job_id, reason="by the recorder, while queued")
        await starter.job_outcome(handle)
    finally:
        p.placing.set()
    return handle, "CANCELLED"


async def cancelled_through_temporal(p: Platform) -> tuple[Handle, str]:
    _, handle = await p.start("cancelled-through-temporal", ["python3", "-c", SLEEP])
    await p.state_is(handle, "RUNNING")
    await handle.cancel()
    return handle, "CANCELLED"


async def checkpoints(p: Platform) -> tuple[Handle, str]:
    job_id, handle = await p.start("checkpoints", ["python3", "-c", CHECKPOINTS])
    await p.checkpointed(job_id, "step-2.ckpt")
    return handle, "SUCCEEDED"


async def checkpoints_out_of_order(p: Platform) -> tuple[Handle, str]:
    """Rank 0's reports, sent here as its agent would, the older of the last two coming last; then a preemption."""
    job_id, handle = await p.start("checkpoints-out-of-order", ["python3", "-c", FIRST_ATTEMPT_RUNS])
    await p.state_is(handle, "RUNNING")
    status = await handle.query("status", result_type=JobStatus)
    for seq in (1, 3, 2):
        # As a mapping: the report's fields, whichever version of the workflow code reads it.
        report = {"allocation_id": status.allocation_id, "attempt": 1, "path": f"/ckpt/alpha/checkpoints-out-of-order/{seq}", "seq": seq}
        await handle.signal("checkpoint", report)
    await starter.preempt(p.client, job_id=job_id, reason="by the recorder")
    return handle, "SUCCEEDED"


async def preempted_resumed(p: Platform) -> tuple[Handle, str]:
    job_id, handle = await p.start("preempted-resumed", ["python3", "-c", PREEMPTIBLE], gpu_count=16)
    await p.state_is(handle, "RUNNING")
    await p.checkpointed(job_id, "step-1.ckpt")
    await starter.preempt(p.client, job_id=job_id, reason="by the recorder")
    return handle, "SUCCEEDED"


async def node_lost(p: Platform) -> tuple[Handle, str]:
    job_id, handle = await p.start("node-lost", ["python3", "-c", FIRST_ATTEMPT_RUNS], gpu_count=16)
    await p.state_is(handle, "RUNNING")
    await starter.signal_node_lost(p.client, job_id=job_id, node_id="h2")
    return handle, "SUCCEEDED"


async def failed_retried(p: Platform) -> tuple[Handle, str]:
    _, handle = await p.start("failed-retried", ["python3", "-c", FIRST_ATTEMPT_RUNS], gpu_count=16, retries=1, env={"FAIL_RANK": "1"})
    return handle, "SUCCEEDED"


async def failed(p: Platform) -> tuple[Handle, str]:
    _, handle = await p.start("failed", ["python3", "-c", FIRST_ATTEMPT_RUNS], env={"FAIL_RANK": "0"})
    return handle, "FAILED"


async def start_failed(p: Platform) -> tuple[Handle, str]:
    _, handle = await p.start("start-failed", ["/nonexistent/program"])
    return handle, "FAILED"


async def timed_out(p: Platform) -> tuple[Handle, str]:
    _, handle = await p.start("timed-out", ["python3", "-c", SLEEP], max_runtime="3s")
    return handle, "TIMED_OUT"


async def member_error_fenced(p: Platform) -> tuple[Handle, str]:
    _, handle = await p.start("member-error-fenced", ["python3", "-c", SLEEP])
    return handle, "SUCCEEDED"


async def heartbeat_lost_fenced(p: Platform) -> tuple[Handle, str]:
    quick = Settings(
        database_url=p.db.url, node_stale_after_s=1e13, activity_heartbeat_timeout_s=2.0, self_fence_after_s=1.0, infra_retry_backoff_s=0.5
    )
    _, handle = await p.start("heartbeat-lost-fenced", ["python3", "-c", SLEEP], settings=quick)
    return handle, "SUCCEEDED"


async def agent_restarted(p: Platform) -> tuple[Handle, str]:
    _, handle = await p.start("agent-restarted", ["python3", "-c", SLEEP])
    return handle, "SUCCEEDED"


#: Scenario name -> (how it runs, the launch activity: "real", or a StandIn mode).
SCENARIOS: dict[str, tuple[Scenario, str]] = {
    "succeeded": (succeeded, "real"),
    "cancelled": (cancelled, "real"),
    "cancelled-queued": (cancelled_queued, "real"),
    "cancelled-through-temporal": (cancelled_through_temporal, "real"),
    "checkpoints": (checkpoints, "real"),
    "checkpoints-out-of-order": (checkpoints_out_of_order, "real"),
    "preempted-resumed": (preempted_resumed, "real"),
    "node-lost": (node_lost, "real"),
    "failed-retried": (failed_retried, "real"),
    "failed": (failed, "real"),
    "start-failed": (start_failed, "real"),
    "timed-out": (timed_out, "real"),
    "member-error-fenced": (member_error_fenced, "error"),
    "heartbeat-lost-fenced": (heartbeat_lost_fenced, "silent"),
    "agent-restarted": (agent_restarted, "restarting"),
}


def to_store(db: Database, node_id: str) -> CheckpointReporter:
    """The agent's checkpoint reports, written to the store as its API route does."""

    async def report(r: CheckpointReport) -> bool:
        await jobs.report_checkpoint(db, node_id=node_id, allocation_id=r.allocation_id, path=r.path, seq=r.seq)
        return True

    return report


async def runs(client: Client, handle: Handle) -> list[WorkflowHistory]:
    """The histories of every run of the handle's workflow, first to last (it continues as new on each requeue)."""
    found, run_id = [], handle.result_run_id
    while run_id:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        found.append(history)
        last = history.events[-1]
        run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if last.HasField("workflow_execution_continued_as_new_event_attributes")
            else ""
        )
    return found


@contextlib.asynccontextmanager
async def node_workers(client: Client, db: Database, launcher: str, tmp: Path) -> AsyncIterator[None]:
    workers = []
    for n in ("h1", "h2"):
        if launcher == "real":
            node = LaunchActivities(
                node_id=n,
                log_dir=tmp / "logs",
                checkpoint_root=tmp / "ckpt",
                state_dir=tmp / f"state-{n}",
                report_checkpoint=to_store(db, n),
            )
            workers.append(Worker(client, task_queue=f"node-{n}", activities=[node.launch, node.stop]))
        else:
            workers.append(Worker(client, task_queue=f"node-{n}", activities=[StandIn(launcher).launch]))
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield


async def record(prefix: str, names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        url = f"sqlite+aiosqlite:///{tmp / 'store.db'}"
        await migrate(url)
        db = Database(url)
        await tenants.seed_cluster(db, small_cluster())
        for node_id in ("h1", "h2"):
            await nodes.register_node(
                db, node_id=node_id, gpu_type="H100-80GB", gpu_count=8, labels={"leaf": "l1", "spine": "s1"}, boot_id="b", gpus=[], now=1e12
            )
        env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(), search_attributes=SEARCH)
        settings = Settings(database_url=url, node_stale_after_s=1e13, self_fence_after_s=1.0, infra_retry_backoff_s=0.5)
        service = PlacementService(settings, db, env.client, holder="recorder")
        placing = asyncio.Event()
        placing.set()

        async def place_forever() -> None:
            while True:
                await placing.wait()
                await service.cycle()
                await asyncio.sleep(0.2)

        platform = Platform(env.client, db, settings, service, tmp / "ckpt", placing)
        control = Worker(env.client, task_queue=CONTROL_TASK_QUEUE, workflows=[TrainingJobWorkflow], activities=StoreActivities(db).all())  # type: ignore[arg-type]
        placer = asyncio.create_task(place_forever())
        try:
            async with control:
                for name in names:
                    run, launcher = SCENARIOS[name]
                    async with node_workers(env.client, db, launcher, tmp):
                        handle, expected = await run(platform)
                        outcome = await asyncio.wait_for(starter.job_outcome(handle), BOUND_S)
                        assert outcome.state == expected, (name, outcome)
                    histories = await runs(env.client, handle)
                    for i, history in enumerate(histories, 1):
                        # The last run under the scenario's name, the runs that continued as new before it numbered.
                        path = HISTORIES / (f"{prefix}-{name}.json" if i == len(histories) else f"{prefix}-{name}-run-{i}.json")
                        path.write_text(history.to_json())
                        print(f"{path.name}: {outcome.state} after {outcome.attempt} attempt(s), {len(history.events)} events")
        finally:
            placer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await placer
            await env.shutdown()
            await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefix", help="file name prefix: which workflow code recorded them")
    parser.add_argument("scenarios", nargs="*", help=f"default: all of {', '.join(SCENARIOS)}")
    args = parser.parse_args()
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    asyncio.run(record(args.prefix, args.scenarios or list(SCENARIOS)))


if __name__ == "__main__":
    main()
