"""The node agent: registration, heartbeats, fencing, and the node's Temporal worker.

It never touches the database: it talks to the control plane through the API (with a
node token) and to Temporal through its node task queue ``node-<id>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
from temporalio.client import Client
from temporalio.worker import Worker

from activities.launch import LaunchActivities
from fairgang.settings import Settings, node_task_queue
from worker_agent.gpus import GpuBackend

log = logging.getLogger("fairgang.agent")


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
    ) -> None:
        self.settings = settings
        self.node_id = node_id
        self.gpu_type = gpu_type
        self.gpus = gpus
        self.labels = labels
        self.boot_id = uuid.uuid4().hex
        self.http = httpx.AsyncClient(base_url=settings.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=10.0)
        self.launcher = LaunchActivities(node_id=node_id, log_dir=log_dir or settings.log_dir)
        self.registered = False

    async def register(self) -> None:
        inventory = self.gpus.inventory()
        body = {
            "node_id": self.node_id,
            "gpu_type": self.gpu_type,
            "gpu_count": len(inventory),
            "labels": self.labels,
            "boot_id": self.boot_id,
            "gpus": [g.as_dict() for g in inventory],
        }
        resp = await self.http.post("/v1/nodes/register", json=body)
        resp.raise_for_status()
        self.fence(resp.json()["live_allocations"])
        self.registered = True
        log.info("node %s registered (boot %s)", self.node_id, self.boot_id)

    def fence(self, live: list[str]) -> None:
        """Kill anything running whose allocation the store no longer holds (invariant 4)."""
        for allocation_id, proc in list(self.launcher.running.items()):
            if allocation_id not in live and proc.returncode is None:
                log.warning("fencing allocation %s: not live in the store, killing pid %s", allocation_id, proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

    async def heartbeat_loop(self) -> None:
        while True:
            try:
                if not self.registered:
                    await self.register()
                resp = await self.http.post(
                    f"/v1/nodes/{self.node_id}/heartbeat",
                    json={"boot_id": self.boot_id, "running": sorted(self.launcher.running)},
                )
                resp.raise_for_status()
                answer = resp.json()
                if answer["accepted"]:
                    self.fence(answer["live_allocations"])
                else:
                    self.registered = False
            except (httpx.HTTPError, OSError) as err:
                log.warning("heartbeat failed: %s", err)
            await asyncio.sleep(self.settings.node_heartbeat_interval_s)

    async def run(self, client: Client) -> None:
        """Heartbeat and serve the node's task queue until cancelled."""
        worker = Worker(
            client,
            task_queue=node_task_queue(self.node_id),
            activities=[self.launcher.launch],
            max_concurrent_activities=64,
            # Let a stopping agent finish stopping its members instead of abandoning them.
            graceful_shutdown_timeout=timedelta(seconds=5),
        )
        beats = asyncio.create_task(self.heartbeat_loop())
        try:
            await worker.run()
        finally:
            beats.cancel()
            await self.http.aclose()
