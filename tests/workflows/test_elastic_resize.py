"""Elastic jobs through the real placement service, store and Temporal (SPEC R9.2): a job grows onto an idle node and
shrinks when a fixed job needs the GPUs, without a failure or a new attempt, resuming from its checkpoint each time;
cancel, preemption and a lost node during a resize end the attempt as they do otherwise.

The launch activity is a stand-in that runs until stopped (it holds its end while ``hold`` is set: a member's
grace period, during which the resize is under way).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlmodel import col
from temporalio import activity
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.store import StoreActivities
from cli.platform import temporal_binary
from fairgang.settings import CONTROL_TASK_QUEUE, SEARCH_ATTRIBUTES, Settings
from scheduler.service import PlacementService
from store import health, jobs
from store.db import Database
from store.models import Allocation, Node
from tests.builders import job_spec
from workflows import starter
from workflows.job import TrainingJobWorkflow
from workflows.messages import JobStatus, LaunchInput, LaunchResult, MemberStarted, StopInput, StopResult

SEARCH = [SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTES]
ELASTIC = {"min": 8, "max": 16}


class Fleet:
    """Every node's launch and stop activities."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.launches: list[LaunchInput] = []
        self.stopped: set[tuple[str, int]] = set()
        #: While set, a stopped member does not end yet (its grace period).
        self.hold = asyncio.Event()

    @activity.defn(name="launch")
    async def launch(self, inp: LaunchInput) -> LaunchResult:
        self.launches.append(inp)
        self.stopped.discard((inp.allocation_id, inp.rank))  # a new process: an earlier one's stop is not its
        started = MemberStarted(allocation_id=inp.allocation_id, rank=inp.rank, pid=0)
        await activity.client().get_workflow_handle(inp.job_id).signal("member_started", started)
        while (inp.allocation_id, inp.rank) not in self.stopped or self.hold.is_set():
            activity.heartbeat()
            await asyncio.sleep(0.05)
        return LaunchResult(exit_code=0, how="terminated")

    @activity.defn(name="stop")
    async def stop(self, inp: StopInput) -> StopResult:
        self.stopped.add((inp.allocation_id, inp.rank))
        return StopResult(outcome="signalled")

    def of(self, job_id: str) -> list[LaunchInput]:
        return [launch for launch in self.launches if launch.job_id == job_id]


async def until(what: str, check: Callable[[], Awaitable[Any]], service: PlacementService, timeout: float = 60) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        await service.cycle()
        value = await check()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def live_allocation(db: Database, job_id: str) -> Allocation | None:
    async with db.sessions() as session:
        query = select(Allocation).where(col(Allocation.job_id) == job_id, col(Allocation.state).in_(("BOUND", "ACKED")))
        return (await session.execute(query)).scalars().first()


async def event_kinds(db: Database, job_id: str) -> list[str]:
    return [e.kind for e in await jobs.job_events(db, job_id)]


class Platform:
    def __init__(self, db: Database, env: WorkflowEnvironment) -> None:
        self.db, self.env = db, env
        self.fleet = Fleet(db)
        settings = Settings(
            database_url=db.url,
            node_stale_after_s=1e13,
            scheduler_resignal_after_s=1.0,
            elastic_grow_idle_s=60.0,
            elastic_resize_interval_s=0.0,
        )
        self.settings = settings
        self.service = PlacementService(settings, db, env.client, holder="t")

    async def submit(self, name: str, gpu_count: Any) -> str:
        job, _ = await jobs.create_job(self.db, spec=job_spec(name=name, gpu_count=gpu_count, grace_period="1s"), tenant="alpha")
        await starter.start_job_workflow(self.env.client, job, self.settings)
        await jobs.mark_workflow_started(self.db, job.id)
        return job.id

    async def state(self, job_id: str) -> str:
        job = await jobs.get_job(self.db, job_id)
        assert job is not None
        return job.state

    async def status(self, job_id: str) -> JobStatus:
        return await self.env.client.get_workflow_handle(job_id).query("status", result_type=JobStatus)

    def members(self, job_id: str, world: int) -> Callable[[], Awaitable[list[LaunchInput]]]:
        """The launches of the job's newest allocation once it has ``world`` members, all started."""

        async def check() -> list[LaunchInput]:
            alloc = await live_allocation(self.db, job_id)
            if alloc is None or len(alloc.members) != world:
                return []
            mine = [launch for launch in self.fleet.of(job_id) if launch.allocation_id == alloc.id]
            return mine if len(mine) == world and (await self.status(job_id)).state == "RUNNING" else []

        return check


async def idle_for_an_hour(db: Database) -> None:
    """The nodes joined an hour ago: their GPUs have been free long enough to grow onto."""
    async with db.transaction() as session:
        await session.execute(update(Node).values(registered_at=time.time() - 3600, freed_at=None))


async def running_platform(store: Database) -> tuple[WorkflowEnvironment, Platform, list[Worker]]:
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(), search_attributes=SEARCH)
    platform = Platform(store, env)
    control = Worker(env.client, task_queue=CONTROL_TASK_QUEUE, workflows=[TrainingJobWorkflow], activities=StoreActivities(store).all())  # type: ignore[arg-type]
    nodes = [Worker(env.client, task_queue=f"node-{n}", activities=[platform.fleet.launch, platform.fleet.stop]) for n in ("h1", "h2")]
    await idle_for_an_hour(store)
    return env, platform, [control, *nodes]


async def test_an_elastic_job_grows_onto_an_idle_node_and_shrinks_for_a_fixed_job_without_a_new_attempt(store: Database) -> None:
    env, p, workers = await running_platform(store)
    try:
        async with workers[0], workers[1], workers[2]:
            p.fleet.hold.set()  # the first resize waits for its stopped member: the checkpoint comes meanwhile
            elastic = await p.submit("elastic", ELASTIC)
            # Started at its minimum, then grown onto the other node, which has been idle for an hour.
            await until("the growth under way", lambda: _has_event(store, elastic, "RESIZING"), p.service)
            (first,) = p.fleet.of(elastic)
            assert first.world_size == 1 and first.gpus_per_member == 8
            checkpoint = "/ckpt/alpha/elastic/step-10"
            assert await jobs.report_checkpoint(store, node_id=first.node_id, allocation_id=first.allocation_id, path=checkpoint, seq=1)
            p.fleet.hold.clear()
            grown = await until("the job grown to two nodes", p.members(elastic, 2), p.service)
            assert sorted((g.rank, g.world_size, g.attempt) for g in grown) == [(0, 2, 1), (1, 2, 1)]
            assert {g.node_id for g in grown} == {"h1", "h2"}
            assert all(g.resume_from == checkpoint for g in grown)  # every member restarts from the checkpoint
            assert (await p.status(elastic)).attempt == 1

            # A fixed job that needs a node: the elastic job gives back its GPUs above its minimum; nobody is preempted.
            fixed = await p.submit("fixed", 8)
            (shrunk,) = await until("the elastic job back at its minimum", p.members(elastic, 1), p.service)
            (placed,) = await until("the fixed job running", p.members(fixed, 1), p.service)
            assert shrunk.attempt == 1 and shrunk.world_size == 1 and shrunk.resume_from == checkpoint
            assert placed.node_id != shrunk.node_id
            kinds = await event_kinds(store, elastic)
            assert kinds.count("RESIZING") == 2 and kinds.count("RESIZED") == 2
            assert "PREEMPTING" not in kinds and "REQUEUED" not in kinds and "FAILED" not in kinds
            resized = [e for e in await jobs.job_events(store, elastic) if e.kind == "RESIZED"]
            assert [(e.data["from_gpus"], e.data["to_gpus"]) for e in resized] == [(8, 16), (16, 8)]
            # Three allocations of attempt 1, one after another, each replacing the one before.
            async with store.sessions() as session:
                allocs = (
                    (
                        await session.execute(
                            select(Allocation).where(col(Allocation.job_id) == elastic).order_by(col(Allocation.created_at))
                        )
                    )
                    .scalars()
                    .all()
                )
            assert [a.attempt for a in allocs] == [1, 1, 1]
            assert [a.resized_from for a in allocs] == [None, allocs[0].id, allocs[1].id]
            assert [a.state for a in allocs] == ["RELEASED", "RELEASED", "ACKED"]
            for job_id in (elastic, fixed):
                await starter.signal_cancel(env.client, job_id=job_id, reason="done")
            for job_id in (elastic, fixed):
                await until(f"{job_id} cancelled", functools.partial(_is, p, job_id, "CANCELLED"), p.service)
    finally:
        await env.shutdown()


async def _is(p: Platform, job_id: str, state: str) -> bool:
    return await p.state(job_id) == state


@pytest.mark.parametrize("what", ["cancel", "preempt", "node_lost", "fatal_gpu"])
async def test_what_comes_during_a_resize_ends_the_attempt_as_it_does_otherwise(store: Database, what: str) -> None:
    env, p, workers = await running_platform(store)
    try:
        async with workers[0], workers[1], workers[2]:
            p.fleet.hold.set()  # stopped members take their time: the resize stays under way
            elastic = await p.submit("elastic", ELASTIC)
            await until("the resize under way", lambda: _has_event(store, elastic, "RESIZING"), p.service)
            first = p.fleet.of(elastic)[0]
            if what == "cancel":
                await starter.signal_cancel(env.client, job_id=elastic, reason="cancelled during a resize")
            elif what == "preempt":
                await starter.preempt(env.client, job_id=elastic, reason="priority: its GPUs go to urgent")
            elif what == "node_lost":
                await starter.signal_node_lost(env.client, job_id=elastic, node_id=first.node_id)
            else:  # a GPU the growth would take goes bad meanwhile
                target = "h2" if first.node_id == "h1" else "h1"
                await health.set_gpu_health(store, node_id=target, index=3, healthy=False)
            await asyncio.sleep(0.5)
            p.fleet.hold.clear()
            if what == "fatal_gpu":
                # The store refuses the resize; the gang goes on as it was, in the same attempt.
                await until("the gang launched again", lambda: _launched(p, elastic, 2), p.service)
                again = p.fleet.of(elastic)[1]
                assert again.allocation_id == first.allocation_id and again.attempt == 1 and again.node_id == first.node_id
                assert "RESIZED" not in await event_kinds(store, elastic) and "REQUEUED" not in await event_kinds(store, elastic)
                await starter.signal_cancel(env.client, job_id=elastic, reason="done")
                await until("cancelled", lambda: _is(p, elastic, "CANCELLED"), p.service)
                return
            if what == "cancel":
                await until("cancelled", lambda: _is(p, elastic, "CANCELLED"), p.service)
                assert await live_allocation(store, elastic) is None
            else:
                await until("queued again as attempt 2", lambda: _attempt(p, elastic, 2), p.service)
                requeued = [e for e in await jobs.job_events(store, elastic) if e.kind == "REQUEUED"]
                assert len(requeued) == 1
                assert ("preempted" if what == "preempt" else "lost") in requeued[0].message
            assert "RESIZED" not in await event_kinds(store, elastic)
            if what != "cancel":
                await starter.signal_cancel(env.client, job_id=elastic, reason="done")
                await until("cancelled", lambda: _is(p, elastic, "CANCELLED"), p.service)
    finally:
        await env.shutdown()


async def _launched(p: Platform, job_id: str, times: int) -> bool:
    return len(p.fleet.of(job_id)) >= times and (await p.status(job_id)).state == "RUNNING"


async def _has_event(db: Database, job_id: str, kind: str) -> bool:
    return kind in await event_kinds(db, job_id)


async def _attempt(p: Platform, job_id: str, attempt: int) -> bool:
    job = await jobs.get_job(p.db, job_id)
    return job is not None and job.attempt == attempt
