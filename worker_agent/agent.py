"""The node agent: registration, heartbeats, fencing, and the node's Temporal worker.

It never touches the database: it talks to the control plane through the API (with a
node token) and to Temporal through its node task queue ``node-<id>``.

What a restart does: a restart of the agent (kill -9, an upgrade, a restart of the whole platform) is
not a loss of the node. The node's boot id is the machine's, so the store keeps the node's allocations
for the agent's next run; the members run on under their shims, within their leases, and the next run
adopts those whose allocation the store still holds (their launch activities, which stopped
heartbeating, are launched again by their workflows and watch the member instead of starting one) and
stops the others (SIGTERM, grace period, SIGKILL). Only a real loss queues a job again: the machine
rebooted (a new boot id), the lease ran out, or the node was declared LOST.

Fencing: each member holds a lease that only a heartbeat answer still holding its allocation
renews, to the time that heartbeat was sent plus ``self_fence_after_s``; the member's shim
(worker_agent/shim.py) stops it when the lease runs out, so an agent that is frozen, cut off from
the API or told the allocation is gone cannot keep it running, and this agent stops it too when it
can. The workflow, when it cannot confirm a member's end, revokes the
allocation and waits out that lease plus the grace period before it moves on. Every register and
heartbeat also reports what the agent runs; the API answers with those the store no longer holds
(``fence``), which the agent kills at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.worker import Worker

from fairgang.fencing import agent_fences, lease_too_short
from fairgang.settings import Settings, node_task_queue
from worker_agent.gpus import GpuBackend
from worker_agent.isolation import keep_private, run_as_from
from worker_agent.launch import LaunchActivities, stop_member
from worker_agent.shim import lease_clock
from workflows.messages import CheckpointReport

log = logging.getLogger("fairgang.agent")


def machine_boot_id() -> str:
    """The machine's boot id: the same for every run of the agent until the machine reboots."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    except OSError:
        return uuid.uuid4().hex


class NodeAgent:
    def __init__(
        self,
        *,
        settings: Settings,
        node_id: str,
        gpu_type: str,
        gpus: GpuBackend,
        labels: dict[str, str],
        token: str,
        log_dir: Path | None = None,
        runtime: str = "process",
        gpu_devices: bool = False,
    ) -> None:
        self.settings = settings
        self.node_id = node_id
        self.gpu_type = gpu_type
        self.gpus = gpus
        self.labels = labels
        self.boot_id = machine_boot_id()
        self.http = httpx.AsyncClient(base_url=settings.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=10.0)
        run_as = run_as_from(settings)
        if run_as is not None:
            keep_private(settings.agent_state_dir)  # what the agent remembers of its members is not theirs to read
        self.launcher = LaunchActivities(
            node_id=node_id,
            log_dir=log_dir or settings.log_dir,
            checkpoint_root=settings.checkpoint_root,
            state_dir=settings.agent_state_dir / node_id,
            runtime=runtime,
            gpu_devices=gpu_devices,
            lease_s=settings.self_fence_after_s,
            run_as=run_as,
            report_checkpoint=self.report_checkpoint,
        )
        if lease_too_short(settings.self_fence_after_s, settings.node_heartbeat_interval_s):
            log.warning(
                "FAIRGANG_SELF_FENCE_AFTER_S (%.1fs) is under 3 heartbeat intervals (%.1fs): members may be fenced "
                "after a single slow heartbeat",
                settings.self_fence_after_s,
                settings.node_heartbeat_interval_s,
            )
        self.registered = False
        #: Where the other members of a gang whose rank 0 runs here reach it.
        self.address = settings.node_address or socket.gethostname()
        self.last_contact = time.monotonic()
        self._background: set[asyncio.Task[object]] = set()

    async def register(self) -> list[str]:
        inventory = self.gpus.inventory()
        body = {
            "node_id": self.node_id,
            "gpu_type": self.gpu_type,
            "gpu_count": len(inventory),
            "labels": self.labels,
            "boot_id": self.boot_id,
            "gpus": [g.as_dict() for g in inventory],
            "running": sorted(self.launcher.running),
            "address": self.address,
        }
        asked_at = lease_clock()
        resp = await self.http.post("/v1/nodes/register", json=body)
        resp.raise_for_status()
        answer = resp.json()
        self.fence(answer["live_allocations"], asked_at, answer.get("fence", []))
        self.launcher.renew(answer["live_allocations"], asked_at)
        self.last_contact = time.monotonic()
        self.registered = True
        log.info("node %s registered (boot %s)", self.node_id, self.boot_id)
        return list(answer["live_allocations"])

    async def report_checkpoint(self, report: CheckpointReport) -> bool:
        """Record a rank 0 member's newest checkpoint in the store, through the API; False if it did not get there
        (the launch tries again at its next look; a report the store finds stale counts as recorded)."""
        body = {"allocation_id": report.allocation_id, "path": report.path, "seq": report.seq}
        try:
            resp = await self.http.post(f"/v1/nodes/{self.node_id}/checkpoints", json=body)
        except (httpx.HTTPError, OSError) as err:
            log.warning("checkpoint report of allocation %s failed: %s", report.allocation_id, err)
            return False
        if resp.status_code >= 500 or resp.status_code == 429:
            log.warning("checkpoint report of allocation %s: %s", report.allocation_id, resp.status_code)
            return False
        if resp.status_code != 200:  # refused for good (the allocation is gone, or not this node's): not retried
            log.warning("checkpoint report of allocation %s refused: %s %s", report.allocation_id, resp.status_code, resp.text[:200])
        return True

    def fence(self, live: list[str], asked_at: float, stale: list[str] | None = None) -> None:
        """Kill anything running whose allocation the store no longer holds (invariant 4).

        ``live`` is the store's answer to a request sent at ``asked_at`` (lease_clock()): members whose
        launch began after that cannot be in it yet and are left alone. ``stale`` is the API's own
        verdict on what the request reported running (the answer's ``fence``). The rule is
        :func:`fairgang.fencing.agent_fences`.
        """
        launched = {a: m.launched_at for a, m in self.launcher.running.items()}
        named, unheld = agent_fences(launched, live, asked_at, stale or ())
        for allocation_id in named:
            log.warning("fencing allocation %s: the control plane says the store no longer holds it", allocation_id)
            self._fence_one(allocation_id)
        for allocation_id in unheld:
            log.warning("fencing allocation %s: the store no longer holds it", allocation_id)
            self._fence_one(allocation_id)

    def _fence_one(self, allocation_id: str) -> None:
        member = self.launcher.running.get(allocation_id)
        self.launcher.kill(allocation_id)
        if member is not None and member.watchers == 0:
            # Nothing watches it (adopted, and its workflow gave it up): forget it once it is gone.
            self._spawn(self.launcher.release_unwatched(member))

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def heartbeat_loop(self) -> None:
        while True:
            try:
                if not self.registered:
                    await self.register()
                busy = frozenset(i for m in self.launcher.running.values() for i in m.gpu_indices)
                health = self.gpus.health(busy)
                asked_at = lease_clock()
                resp = await self.http.post(
                    f"/v1/nodes/{self.node_id}/heartbeat",
                    json={
                        "boot_id": self.boot_id,
                        "running": sorted(self.launcher.running),
                        "gpus": [{"index": i, "health": h} for i, h in sorted(health.items())],
                    },
                )
                resp.raise_for_status()
                answer = resp.json()
                self.last_contact = time.monotonic()
                # Simulated faults the control plane asks for (tests, demos); NVML ignores them.
                self.gpus.inject({int(i): f for i, f in (answer.get("faults") or {}).items()})
                if answer["accepted"]:
                    self.fence(answer["live_allocations"], asked_at, answer.get("fence", []))
                    self.launcher.renew(answer["live_allocations"], asked_at)
                else:
                    # A late heartbeat of a node declared lost renews nothing: what it runs is killed.
                    log.warning("heartbeat refused (node declared lost or restarted): registering again")
                    self.fence([], asked_at, answer.get("fence", []))
                    self.registered = False
            except (httpx.HTTPError, OSError) as err:
                log.warning("heartbeat failed: %s", err)
            self._self_fence()
            await asyncio.sleep(self.settings.node_heartbeat_interval_s)

    def _self_fence(self) -> None:
        """Stop the members whose lease ran out (their shims do the same)."""
        silent = time.monotonic() - self.last_contact
        for member in self.launcher.expired(lease_clock()):
            log.warning("lease of %s ran out (%.0fs since the last answer holding it): stopping it", member.job_id, silent)
            self.launcher.fenced.add(member.allocation_id)
            self._spawn(self.launcher.release_unwatched(member) if member.watchers == 0 else stop_member(member))

    def worker(self, client: Client, **options: Any) -> Worker:
        """The Temporal worker of the node's task queue: its launch and stop activities."""
        return Worker(
            client,
            task_queue=node_task_queue(self.node_id),
            # `stop` is how a cancel or preemption reaches a member at once: the launch activity's own
            # cancellation arrives only with a heartbeat answer, and heartbeats are throttled.
            activities=[self.launcher.launch, self.launcher.stop],
            max_concurrent_activities=64,
            # No graceful timeout: a stopping agent cancels its launch activities at once, and each
            # stops its member (SIGTERM, grace, SIGKILL) before the worker finishes shutting down.
            **options,
        )

    async def take_over(self) -> None:
        """Register, then adopt the members a previous run left whose allocation the store still holds, and stop
        the others (before this run's worker takes any launch)."""
        orphans = self.launcher.orphans()
        live: set[str] = set()
        if orphans:
            while not self.registered:
                try:
                    live = set(await self.register())
                except (httpx.HTTPError, OSError) as err:
                    log.warning("registration failed (members of the previous run wait within their lease): %s", err)
                    await asyncio.sleep(1.0)
        keep = [m for m in orphans if m.allocation_id in live]
        for member in keep:
            self.launcher.adopt(member)
        await asyncio.gather(*(self.launcher.stop_orphan(m) for m in orphans if m.allocation_id not in live))

    async def run(self, client: Client) -> None:
        """Adopt or stop what a previous run left, then heartbeat and serve the node's task queue until cancelled."""
        await self.take_over()
        worker = self.worker(client)
        beats = asyncio.create_task(self.heartbeat_loop())
        try:
            await worker.run()
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
            await self.http.aclose()
