"""Entry points of the long-running processes: API, placement service, workflow worker, agent."""

from __future__ import annotations

import logging
from pathlib import Path

from fairgang.settings import Settings
from fairgang.temporal import connect_with_retry as connect_temporal_with_retry

log = logging.getLogger("fairgang")

# Each part imports what it runs, inside its function: an agent (started once per node, and again on each
# restart) loads neither the store nor the workflows nor the placement service.


async def run_worker(settings: Settings) -> None:
    """The control-plane worker: job and sweep workflows and their store activities."""
    from temporalio.worker import Worker

    from activities.store import StoreActivities
    from activities.sweeps import SweepActivities
    from fairgang.settings import CONTROL_TASK_QUEUE
    from store.db import Database
    from workflows.job import TrainingJobWorkflow
    from workflows.sweep import SweepWorkflow

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
    from fairgang import metrics
    from scheduler.service import PlacementService
    from store.db import Database, migrate

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
    from worker_agent.agent import NodeAgent
    from worker_agent.gpus import GpuBackend, NvmlGpus, SimulatedGpus

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
