"""``fairgang dev``: the whole platform on one machine, in the foreground, and its demo."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import typer

from cli.jobs import print_jobs
from cli.kit import console, flag
from cli.kit import fail as _fail
from fairgang.cluster import load_cluster_config
from fairgang.spec import TERMINAL_STATES, SpecError, load_spec_text

app = typer.Typer()


@app.command()
def dev(
    config: Path = typer.Option(Path("examples/cluster.yaml"), "--config", "-c", help="Cluster config YAML."),
    data_dir: Path = typer.Option(Path(".fairgang"), "--data-dir", help="Where state is kept across restarts."),
    api_port: int = typer.Option(8080, "--api-port"),
    temporal_port: int = typer.Option(7233, "--temporal-port"),
    ui_port: int = typer.Option(8233, "--ui-port"),
    demo: bool = flag("--demo", help="Submit the example jobs and show them finish."),
) -> None:
    """Run the whole platform locally in the foreground (Ctrl-C stops it)."""
    from cli.platform import DevPlatform

    try:
        cluster = load_cluster_config(config)
    except SpecError as err:
        _fail(f"{config}: {err}")
    platform = DevPlatform(
        config=cluster,
        data_dir=data_dir.resolve(),
        api_port=api_port,
        temporal_port=temporal_port,
        ui_port=ui_port,
        database_url=os.environ.get("DATABASE_URL"),
    )
    stop = False

    def _stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    # Ctrl-C stops the platform even when this process was started with SIGINT ignored (as a shell's
    # background job is): `fairgang dev` is a foreground command, and its parts do not see the signal.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        platform.start(say=lambda line: console.print(line))
        token = (cluster.admin_tokens or [""])[0]
        platform.wait_ready(token)
        console.print(f"[green]ready[/]: {len(cluster.nodes)} nodes registered. Ctrl-C stops everything.")
        if demo:
            _demo(platform, cluster)
        while not stop:
            platform.supervise(say=lambda line: console.print(f"[yellow]{line}[/]"))
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        console.print("stopping ...")
        platform.stop()


def _demo_jobs(cluster: Any, jobs_dir: Path = Path("examples/jobs")) -> list[tuple[Path, dict[str, Any], str | None]]:
    """The example jobs the demo submits: (file, request body, its tenant's token, or None for an unknown tenant)."""
    tokens = {t.name: t.tokens[0] for t in cluster.tenants if t.tokens}
    jobs: list[tuple[Path, dict[str, Any], str | None]] = []
    for path in sorted(jobs_dir.glob("*.yaml")):
        spec = load_spec_text(path.read_text())
        tenant = spec.tenant or next(iter(tokens), "")
        jobs.append((path, spec.model_dump(mode="json", exclude_none=True), tokens.get(tenant)))
    return jobs


def _demo(platform: Any, cluster: Any) -> None:
    """Submit the example jobs (one per tenant file) and follow them to the end.

    An example the platform refuses is a broken demo: it is reported and ``fairgang dev`` exits 1.
    """
    api_url = platform.settings.api_url
    tokens = {t.name: t.tokens[0] for t in cluster.tenants if t.tokens}
    submitted: list[tuple[str, str]] = []
    refused: list[str] = []
    for path, body, token in _demo_jobs(cluster):
        if token is None:
            refused.append(f"{path.name}: no token for tenant '{body.get('tenant')}' in the cluster config")
            continue
        resp = httpx.post(f"{api_url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        if resp.status_code >= 300:
            refused.append(f"{path.name}: {resp.status_code} {resp.text}")
            continue
        job = resp.json()["job"]
        submitted.append((job["id"], token))
        console.print(f"submitted {path.name} as {job['id']} ({job['tenant']})")
    if refused:
        for line in refused:
            console.print(f"[red]example job refused[/]: {line}")
        raise typer.Exit(1)
    admin = (cluster.admin_tokens or [""])[0]
    terminal = {s.value for s in TERMINAL_STATES}
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        rows = [
            httpx.get(f"{api_url}/v1/jobs/{jid}", headers={"Authorization": f"Bearer {admin}"}, timeout=10).json() for jid, _ in submitted
        ]
        if all(r["state"] in terminal for r in rows):
            break
        time.sleep(1.0)
    print_jobs(rows)
    _demo_sweep(api_url, tokens, admin)
    ui = platform.settings.temporal_ui_url
    console.print(f"API {api_url}   docs {api_url}/docs   Temporal UI {ui}")
    console.print(f"try: FAIRGANG_TOKEN={admin} .venv/bin/fairgang jobs")


def _demo_sweep(api_url: str, tokens: dict[str, str], admin: str) -> None:
    """Submit the example sweep (examples/sweeps/lr-features.yaml) and follow it to its summary."""
    from fairgang.sweeps import load_sweep_text

    path = Path("examples/sweeps/lr-features.yaml")
    spec = load_sweep_text(path.read_text())
    token = tokens.get(spec.tenant or "", next(iter(tokens.values()), admin))
    body = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    resp = httpx.post(f"{api_url}/v1/sweeps", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    if resp.status_code >= 300:
        console.print(f"[red]example sweep refused[/]: {path.name}: {resp.status_code} {resp.text}")
        raise typer.Exit(1)
    sweep = resp.json()["sweep"]
    console.print(f"submitted sweep {path.name} as {sweep['id']} ({sweep['trial_count']} trials, {sweep['max_concurrent']} at once)")
    deadline = time.monotonic() + 600
    while sweep["state"] not in ("COMPLETED", "CANCELLED", "FAILED") and time.monotonic() < deadline:
        time.sleep(1.0)
        sweep = httpx.get(f"{api_url}/v1/sweeps/{sweep['id']}", headers={"Authorization": f"Bearer {admin}"}, timeout=10).json()
    best = (sweep.get("summary") or {}).get("best")
    console.print(f"sweep {sweep['id']} {sweep['state']}: {sweep.get('summary')}")
    if best:
        console.print(f"best trial #{best['index']} ({best['job_id']}): {best['metric']}={best['value']} with {best['params']}")
    console.print(f"try: FAIRGANG_TOKEN={token} .venv/bin/fairgang sweep show {sweep['id']}")
