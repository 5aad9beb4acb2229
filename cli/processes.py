"""Entry points of the long-running processes: API, placement service, workflow worker, agent."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from temporalio.worker import Worker

from activities.store import StoreActivities
from activities.sweeps import SweepActivities
from fairgang import metrics
from fairgang.settings import CONTROL_TASK_QUEUE, Settings
from scheduler.service import PlacementService
from store.db import Database, migrate
from worker_agent.agent import NodeAgent
from worker_agent.gpus import GpuBackend, NvmlGpus, SimulatedGpus
from workflows import starter
from workflows.job import TrainingJobWorkflow
from workflows.sweep import SweepWorkflow

log = logging.getLogger("fairgang")


async def connect_temporal_with_retry(settings: Settings, attempts: int = 60):  # type: ignore[no-untyped-def]
    for attempt in range(attempts):
        try:
            return await starter.connect(settings)
        except Exception as err:
            if attempt == attempts - 1:
                raise
            log.info("waiting for Temporal at %s: %s", settings.temporal_address, err)
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")


async def run_worker(settings: Settings) -> None:
    """The control-plane worker: job and sweep workflows and their store activities."""
    db = Database(settings.database_url)
    client = await connect_temporal_with_retry(settings)
    worker = Worker(
        client,
        task_queue=CONTROL_TASK_QUEUE,
        workflows=[TrainingJobWorkflow, SweepWorkflow],
        activities=[*StoreActivities(db).all(), *SweepActivities(db, settings).all()],  # type: ignore[list-item]
    )
    try:
        await worker.run()
    finally:
        await db.dispose()


async def run_scheduler(settings: Settings) -> None:
    db = Database(settings.database_url)
    await migrate(settings.database_url)
    client = await connect_temporal_with_retry(settings)
    if settings.scheduler_metrics_port is not None:
        metrics.serve(settings.scheduler_metrics_port, settings.metrics_host)
    try:
        await PlacementService(settings, db, client).serve()
    finally:
        await db.dispose()


async def run_agent(
    settings: Settings,
    *,
    node_id: str,
    gpu_type: str,
    gpus: int | None,
    labels: dict[str, str],
    token: str,
    simulated: bool,
    runtime: str = "process",
) -> None:
    backend: GpuBackend = SimulatedGpus(node_id, gpu_type, gpus or 8) if simulated else NvmlGpus()
    client = await connect_temporal_with_retry(settings)
    agent = NodeAgent(
        settings=settings,
        node_id=node_id,
        gpu_type=gpu_type,
        gpus=backend,
        labels=labels,
        token=token,
        log_dir=Path(settings.log_dir),
        runtime=runtime,
        gpu_devices=not simulated,
    )
    await agent.run(client)
