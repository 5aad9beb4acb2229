"""A test harness: many simulated node agents in one process (production runs one agent per node).

Each hosted node is a real :class:`~worker_agent.agent.NodeAgent` (its own boot id, registration and
heartbeat loop against the API over HTTP, simulated GPUs) serving its own Temporal task queue
``node-<id>`` with a Worker of its own; the process shares one Temporal client and one HTTP
connection pool among them.

What differs from a real agent is the member: :class:`SimulatedLaunch` is the launch activity with
the process replaced by a timer. A job whose spec's env has ``SIM_RUNTIME_S`` "runs" that
long and exits 0; ``FAIRGANG_SIM_STOP_S`` is how long it takes to stop after SIGTERM (default 0).
Otherwise the activity does what the real one does: the member is in ``running`` (so heartbeats report
it and its GPUs as busy), holds a lease that heartbeat answers renew, signals ``member_started``,
heartbeats every second, ends fenced when the agent fences it or its lease runs out, and on
cancellation stops (the simulated grace) and re-raises. A job without ``SIM_RUNTIME_S`` runs
its real process through :class:`~worker_agent.launch.LaunchActivities`.

The host measures every heartbeat (time to the API's answer, its status) and writes them, with launch
counts, to ``--stats`` (JSON) every few seconds and when it stops::

    .venv/bin/python -m benchmarks.agent_host --config cluster.yaml --shard 0 --shards 4 --stats host-0.json

Settings (API URL, Temporal address, heartbeat interval, ...) come from the FAIRGANG_* environment as for
``fairgang agent``; each node's credential derived from the cluster's node secret (``--token`` or
FAIRGANG_NODE_TOKEN, else the config's ``node_token``), as seeding the store issued it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import resource
import signal
import time
from pathlib import Path
from typing import Any

import httpx
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from cli.processes import connect_temporal_with_retry
from fairgang.cluster import NodeConfig, load_cluster_config, node_credential
from fairgang.settings import Settings
from worker_agent.agent import NodeAgent
from worker_agent.gpus import SimulatedGpus
from worker_agent.launch import HEARTBEAT_EVERY_S, LaunchActivities, RunningMember
from worker_agent.shim import lease_clock
from workflows.job import MEMBER_FENCED
from workflows.messages import LaunchInput, LaunchResult, MemberStarted

log = logging.getLogger("fairgang.agent_host")
RUNTIME_ENV = "SIM_RUNTIME_S"
STOP_ENV = "FAIRGANG_SIM_STOP_S"


class SimulatedLaunch(LaunchActivities):
    """The launch activity with a timer for a member (see the module's docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: allocation id -> set when the agent fences the member (or its lease runs out).
        self._fence_events: dict[str, asyncio.Event] = {}
        self.launched = 0
        self.exited = 0
        self.stopped = 0

    @activity.defn(name="launch")
    async def launch(self, inp: LaunchInput) -> LaunchResult:
        if RUNTIME_ENV not in inp.env:
            return await super().launch(inp)
        runtime_s = float(inp.env[RUNTIME_ENV])
        stop_s = float(inp.env.get(STOP_ENV, "0"))
        launched_at = lease_clock()
        started = activity.info().started_time.timestamp()
        lease_s = math.inf if self.lease_s is None else self.lease_s
        # pid -1: never signalled (kill and expiry are overridden below).
        member = RunningMember(inp.allocation_id, inp.job_id, inp.attempt, inp.rank, -1, inp.grace_period_s)
        member.gpu_indices, member.launched_at = list(inp.gpu_indices), launched_at
        member.lease_until = min(launched_at, lease_clock() - max(0.0, time.time() - started)) + lease_s
        fenced = asyncio.Event()
        self.running[inp.allocation_id] = member
        self._fence_events[inp.allocation_id] = fenced
        self.launched += 1
        loop = asyncio.get_running_loop()
        try:
            await self._signal(inp.job_id, "member_started", MemberStarted(allocation_id=inp.allocation_id, rank=inp.rank, pid=0))
            deadline = loop.time() + runtime_s
            while True:
                activity.heartbeat()
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self.exited += 1
                    return LaunchResult(exit_code=0, how="exited")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_either(fenced, member.stop), min(HEARTBEAT_EVERY_S, remaining))
                if member.stop.is_set() and not fenced.is_set():
                    # A stop activity (cancel, preempt): the simulated member checkpoints and exits within its grace.
                    self.stopped += 1
                    end = loop.time() + min(stop_s, inp.grace_period_s)
                    while loop.time() < end:
                        activity.heartbeat()
                        await asyncio.sleep(min(HEARTBEAT_EVERY_S, max(end - loop.time(), 0.0)))
                    return LaunchResult(exit_code=0, how="terminated")
                if fenced.is_set():
                    raise ApplicationError(
                        "the agent fenced this member (its allocation is no longer held, or its lease ran out)",
                        type=MEMBER_FENCED,
                        non_retryable=True,
                    )
        except asyncio.CancelledError:
            # SIGTERM: the simulated member checkpoints and exits after its stop time (within its grace).
            self.stopped += 1
            end = loop.time() + min(stop_s, inp.grace_period_s)
            while loop.time() < end:
                activity.heartbeat()
                await asyncio.sleep(min(HEARTBEAT_EVERY_S, max(end - loop.time(), 0.0)))
            raise
        finally:
            self.running.pop(inp.allocation_id, None)
            self._fence_events.pop(inp.allocation_id, None)

    def request_stop(self, allocation_id: str) -> str:
        """A stop activity for a simulated member only wakes its timer (there is no process to SIGTERM)."""
        member = self.running.get(allocation_id)
        if member is None or allocation_id not in self._fence_events:
            return super().request_stop(allocation_id)
        if member.stop.is_set():
            return "stopping"
        member.stop.set()
        return "signalled"

    def kill(self, allocation_id: str) -> None:
        if allocation_id not in self._fence_events:
            super().kill(allocation_id)
            return
        self.fenced.add(allocation_id)
        self._fence_events[allocation_id].set()

    def expired(self, now: float) -> list[RunningMember]:
        """Simulated members whose lease ran out are fenced here; real ones are left to the agent."""
        out = []
        for member in super().expired(now):
            if member.allocation_id in self._fence_events:
                log.warning("lease of %s ran out: fencing its simulated member", member.job_id)
                self.kill(member.allocation_id)
            else:
                out.append(member)
        return out


async def _either(a: asyncio.Event, b: asyncio.Event) -> None:
    """Wait until either event is set."""
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


class Timings(httpx.AsyncBaseTransport):
    """An HTTP transport that records each heartbeat's time to the answer's headers."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        #: (wall time sent, seconds to answer, status: HTTP code, or 0 for a transport error)
        self.heartbeats: list[tuple[float, float, int]] = []
        self.registers: list[tuple[float, float, int]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        sent, t0 = time.time(), time.perf_counter()
        path = request.url.path
        log_to = self.heartbeats if path.endswith("/heartbeat") else self.registers if path.endswith("/register") else None
        try:
            response = await self.inner.handle_async_request(request)
        except Exception:
            if log_to is not None:
                log_to.append((sent, time.perf_counter() - t0, 0))
            raise
        if log_to is not None:
            log_to.append((sent, time.perf_counter() - t0, response.status_code))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class AgentHost:
    """Runs the agents of ``nodes`` in this process."""

    def __init__(self, settings: Settings, nodes: list[NodeConfig], token: str, stats: Path | None, *, polls: int = 1) -> None:
        self.settings, self.nodes, self.token, self.stats, self.polls = settings, nodes, token, stats, polls
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        self.timings = Timings(httpx.AsyncHTTPTransport(limits=limits))
        #: One connection pool for all: each node's client (its own credential) shares this transport.
        self.http = httpx.AsyncClient(base_url=settings.api_url, timeout=10.0, transport=self.timings)
        self.agents: list[NodeAgent] = []
        self._unused: list[httpx.AsyncClient] = []
        self.started = time.time()

    def _agent(self, node: NodeConfig) -> NodeAgent:
        agent = NodeAgent(
            settings=self.settings,
            node_id=node.id,
            gpu_type=node.gpu_type,
            gpus=SimulatedGpus(node.id, node.gpu_type, node.gpus),
            labels=dict(node.labels),
            token=node_credential(self.token, node.id),
            log_dir=Path(self.settings.log_dir),
        )
        own = agent.http
        headers = {"Authorization": f"Bearer {node_credential(self.token, node.id)}"}
        agent.http = httpx.AsyncClient(base_url=self.settings.api_url, headers=headers, timeout=10.0, transport=self.timings)
        agent.launcher = SimulatedLaunch(
            node_id=node.id,
            log_dir=Path(self.settings.log_dir),
            checkpoint_root=self.settings.checkpoint_root,
            state_dir=None,
            lease_s=self.settings.self_fence_after_s,
        )
        self._unused.append(own)
        return agent

    async def _serve(self, agent: NodeAgent, client: Client, delay: float) -> None:
        await asyncio.sleep(delay)
        worker = agent.worker(client, max_concurrent_activity_task_polls=self.polls)
        beats = asyncio.create_task(agent.heartbeat_loop())
        try:
            await worker.run()
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats

    def snapshot(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        launchers = [a.launcher for a in self.agents if isinstance(a.launcher, SimulatedLaunch)]
        return {
            "pid": os.getpid(),
            "nodes": [n.id for n in self.nodes],
            "started": self.started,
            "written": time.time(),
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "max_rss_mb": usage.ru_maxrss / 1024.0,
            "heartbeat_interval_s": self.settings.node_heartbeat_interval_s,
            "heartbeats": self.timings.heartbeats,
            "registers": self.timings.registers,
            "launched": sum(x.launched for x in launchers),
            "exited": sum(x.exited for x in launchers),
            "stopped": sum(x.stopped for x in launchers),
            "running": sum(len(x.running) for x in launchers),
        }

    def write_stats(self) -> None:
        if self.stats is None:
            return
        tmp = self.stats.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot()))
        tmp.replace(self.stats)

    async def run(self) -> None:
        client = await connect_temporal_with_retry(self.settings)
        self.agents = [self._agent(n) for n in self.nodes]
        for own in self._unused:
            await own.aclose()
        spread = self.settings.node_heartbeat_interval_s
        rng = random.Random(os.getpid())
        tasks = [asyncio.create_task(self._serve(a, client, rng.uniform(0, spread))) for a in self.agents]
        log.info("hosting %d simulated agents", len(self.agents))
        try:
            while True:
                await asyncio.sleep(5.0)
                await asyncio.to_thread(self.write_stats)
                for task in tasks:
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.write_stats()
            await self.http.aclose()


def shard(nodes: list[NodeConfig], index: int, count: int) -> list[NodeConfig]:
    """Every ``count``-th node from ``index``: each host gets a mix of types and leaves."""
    return nodes[index::count]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run many simulated node agents in one process (a test harness).")
    parser.add_argument("--config", type=Path, required=True, help="cluster config YAML (its nodes)")
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--token", default=os.environ.get("FAIRGANG_NODE_TOKEN"))
    parser.add_argument("--stats", type=Path, default=None, help="write heartbeat timings and counts here (JSON)")
    parser.add_argument("--polls", type=int, default=1, help="activity task pollers per node worker")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("FAIRGANG_LOG_LEVEL", "WARNING"), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = load_cluster_config(args.config)
    token = args.token or config.node_token
    host = AgentHost(Settings(), shard(config.nodes, args.shard, args.shards), token, args.stats, polls=args.polls)

    async def run() -> None:
        task = asyncio.ensure_future(host.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())


if __name__ == "__main__":
    main()
