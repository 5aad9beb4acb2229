"""The platform's processes: ``fairgang api``, ``worker``, ``scheduler``, ``agent``, ``migrate``, ``seed``."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import typer

from cli.kit import console, flag, setup_logging
from cli.kit import fail as _fail
from fairgang.cluster import load_cluster_config
from fairgang.settings import Settings
from fairgang.spec import SpecError

app = typer.Typer()


@app.command()
def api(
    host: str = "127.0.0.1",
    port: int = 8080,
    workers: int = typer.Option(1, min=1, envvar="FAIRGANG_API_WORKERS", help="API processes sharing the port (uvicorn workers)."),
) -> None:
    """Run the REST API."""
    import uvicorn

    setup_logging()
    if workers > 1:
        # Each worker builds its own app (and its own connection pool) from the environment's settings.
        uvicorn.run("api.app:create_app", factory=True, host=host, port=port, workers=workers, log_level="warning")
        return
    from api.app import create_app

    uvicorn.run(create_app(Settings()), host=host, port=port, log_level="warning")


@app.command()
def worker() -> None:
    """Run the control-plane Temporal worker (job workflows and store activities)."""
    from cli.processes import run_worker

    setup_logging()
    _run_until_signal(run_worker(Settings()))


@app.command()
def scheduler() -> None:
    """Run the placement service."""
    from cli.processes import run_scheduler

    setup_logging()
    _run_until_signal(run_scheduler(Settings()))


@app.command()
def agent(
    node_id: str = typer.Option(..., "--node-id"),
    gpu_type: str = typer.Option(..., "--gpu-type"),
    gpus: int = typer.Option(None, "--gpus", help="Simulated GPU count."),
    label: list[str] = typer.Option([], "--label", help="Topology label, e.g. leaf=l1."),
    simulated: bool = flag("--simulated", help="Simulated GPUs instead of NVML."),
    runtime: str = typer.Option("process", "--runtime", help="process, podman or docker."),
    token: str = typer.Option(
        "", "--token", envvar="FAIRGANG_NODE_TOKEN", help="The node's credential (prefer --token-file: an environment is readable)."
    ),
    token_file: Path = typer.Option(
        None, "--token-file", envvar="FAIRGANG_NODE_TOKEN_FILE", help="A file (mode 0600) holding the node's credential."
    ),
) -> None:
    """Run a node agent (a Temporal worker on task queue node-<id>)."""
    from cli.processes import run_agent
    from worker_agent.isolation import read_token_file

    if runtime not in ("process", "podman", "docker"):
        _fail(f"--runtime: '{runtime}' is not one of process, podman, docker")
    if token_file is not None:
        try:
            token = read_token_file(token_file)
        except ValueError as err:
            _fail(f"--token-file: {err}")
    if not token:
        _fail("the node's credential is missing: give --token-file (or FAIRGANG_NODE_TOKEN_FILE)")
    setup_logging()
    labels = dict(item.split("=", 1) for item in label)
    _run_until_signal(
        run_agent(
            Settings(), node_id=node_id, gpu_type=gpu_type, gpus=gpus, labels=labels, token=token, simulated=simulated, runtime=runtime
        )
    )


@app.command()
def migrate() -> None:
    """Bring the store's schema to the newest migration."""
    from store.db import migrate_sync

    migrate_sync(Settings().database_url)
    console.print("store migrated")


@app.command()
def seed(config: Path = typer.Argument(..., help="Cluster config YAML.")) -> None:
    """Load tenants, quotas, tokens (stored hashed) and nodes from a cluster config; safe to repeat."""
    from store import tenants
    from store.db import Database, migrate

    try:
        cluster = load_cluster_config(config)
    except SpecError as err:
        _fail(f"{config}: {err}")

    async def run() -> None:
        url = Settings().database_url
        await migrate(url)
        db = Database(url)
        try:
            await tenants.seed_cluster(db, cluster)
        finally:
            await db.dispose()

    asyncio.run(run())
    console.print(f"store seeded: {len(cluster.tenants)} tenants, {len(cluster.nodes)} nodes")


def _run_until_signal(coro: Any) -> None:
    async def main() -> None:
        task = asyncio.ensure_future(coro)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
