"""The ``fairgang`` command: run the platform's processes, and use it as a client."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.table import Table

from fairgang.clikit import ApiUrl, Output, Token, console, err_console
from fairgang.clikit import check as _check
from fairgang.clikit import client as _client
from fairgang.clikit import emit as _emit
from fairgang.clikit import fail as _fail
from fairgang.clikit import ts as _ts
from fairgang.cluster import load_cluster_config
from fairgang.durations import format_duration
from fairgang.settings import Settings
from fairgang.spec import TERMINAL_STATES, SpecError, load_spec_text

app = typer.Typer(help="fairgang: fair gang scheduling for a shared GPU fleet.", no_args_is_help=True)


def _logging() -> None:
    logging.basicConfig(level=os.environ.get("FAIRGANG_LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


# ---------------------------------------------------------------- processes


@app.command()
def api(
    host: str = "127.0.0.1",
    port: int = 8080,
    workers: int = typer.Option(1, min=1, envvar="FAIRGANG_API_WORKERS", help="API processes sharing the port (uvicorn workers)."),
) -> None:
    """Run the REST API."""
    import uvicorn

    _logging()
    if workers > 1:
        # Each worker builds its own app (and its own connection pool) from the environment's settings.
        uvicorn.run("api.app:create_app", factory=True, host=host, port=port, workers=workers, log_level="warning")
        return
    from api.app import create_app

    uvicorn.run(create_app(Settings()), host=host, port=port, log_level="warning")


@app.command()
def worker() -> None:
    """Run the control-plane Temporal worker (job workflows and store activities)."""
    from fairgang.processes import run_worker

    _logging()
    _run_until_signal(run_worker(Settings()))


@app.command()
def scheduler() -> None:
    """Run the placement service."""
    from fairgang.processes import run_scheduler

    _logging()
    _run_until_signal(run_scheduler(Settings()))


@app.command()
def agent(
    node_id: str = typer.Option(..., "--node-id"),
    gpu_type: str = typer.Option(..., "--gpu-type"),
    gpus: int = typer.Option(None, "--gpus", help="Simulated GPU count."),
    label: list[str] = typer.Option([], "--label", help="Topology label, e.g. leaf=l1."),
    simulated: bool = typer.Option(False, "--simulated", help="Simulated GPUs instead of NVML."),
    runtime: str = typer.Option("process", "--runtime", help="process, podman or docker."),
    token: str = typer.Option(..., "--token", envvar="FAIRGANG_NODE_TOKEN"),
) -> None:
    """Run a node agent (a Temporal worker on task queue node-<id>)."""
    from fairgang.processes import run_agent

    if runtime not in ("process", "podman", "docker"):
        _fail(f"--runtime: '{runtime}' is not one of process, podman, docker")
    _logging()
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
    from store import repo
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
            await repo.seed_cluster(db, cluster)
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


@app.command()
def dev(
    config: Path = typer.Option(Path("examples/cluster.yaml"), "--config", "-c", help="Cluster config YAML."),
    data_dir: Path = typer.Option(Path(".fairgang"), "--data-dir", help="Where state is kept across restarts."),
    api_port: int = typer.Option(8080, "--api-port"),
    temporal_port: int = typer.Option(7233, "--temporal-port"),
    ui_port: int = typer.Option(8233, "--ui-port"),
    demo: bool = typer.Option(False, "--demo", help="Submit the example jobs and show them finish."),
) -> None:
    """Run the whole platform locally in the foreground (Ctrl-C stops it)."""
    from fairgang.dev import DevPlatform

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
    _print_jobs(rows)
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


# ---------------------------------------------------------------- client


def _print_jobs(rows: list[dict[str, Any]]) -> None:
    table = Table("ID", "TENANT", "NAME", "STATE", "GPUS", "ATTEMPT", "EXIT", "CREATED", "WHY")
    for r in rows:
        why = r.get("pending_reason") or r.get("end_reason") or ""
        table.add_row(
            r["id"], r["tenant"], r["name"], r["state"], f"{r['gpu_count']}x{r['gpu_type']}", str(r["attempt"]),
            "" if r.get("exit_code") is None else str(r["exit_code"]), _ts(r["created_at"]), why,
        )  # fmt: skip
    console.print(table)


@app.command()
def submit(
    file: Path,
    wait: bool = typer.Option(False, "--wait", help="Wait until the job ends; exit 0 only if it SUCCEEDED."),
    api_url: str = ApiUrl,
    token: str = Token,
    output: str = Output,
) -> None:
    """Submit a job spec (YAML or JSON)."""
    try:
        spec = load_spec_text(file.read_text())
    except OSError as err:
        _fail(f"{file}: {err}")
    except SpecError as err:
        lines = "\n".join(f"  {p.field}: {p.reason}" for p in err.problems)
        _fail(f"{file}: job spec refused:\n{lines}")
    with _client(api_url, token) as http:
        result = _check(http.post("/v1/jobs", json=spec.model_dump(mode="json", exclude_none=True)))
        job = result["job"]
        if output == "json" and not wait:
            _emit(result, output, None)
        else:
            verb = "submitted" if result["created"] else "already submitted"
            err_console.print(f"{verb}: {job['id']}")
        if not wait:
            if output != "json":
                console.print(job["id"])
            return
        terminal = {s.value for s in TERMINAL_STATES}
        while job["state"] not in terminal:
            time.sleep(1.0)
            job = _check(http.get(f"/v1/jobs/{job['id']}"))
        _emit(job, output, lambda j: _print_jobs([j]))
        raise typer.Exit(0 if job["state"] == "SUCCEEDED" else 1)


@app.command()
def jobs(
    tenant: str = typer.Option(None, "--tenant"),
    state: str = typer.Option(None, "--state"),
    api_url: str = ApiUrl,
    token: str = Token,
    output: str = Output,
) -> None:
    """List jobs (yours, or all for an admin)."""
    params = {k: v for k, v in {"tenant": tenant, "state": state}.items() if v}
    with _client(api_url, token) as http:
        _emit(_check(http.get("/v1/jobs", params=params)), output, _print_jobs)


@app.command()
def job(job_id: str, api_url: str = ApiUrl, token: str = Token, output: str = Output) -> None:
    """Show one job: state, attempts, allocation, events, pending reason."""
    with _client(api_url, token) as http:
        data = _check(http.get(f"/v1/jobs/{job_id}"))

    def show(j: dict[str, Any]) -> None:
        _print_jobs([j])
        if j.get("allocation"):
            members = ", ".join(f"{m['node_id']}[{','.join(map(str, m['gpu_indices']))}]" for m in j["allocation"]["members"])
            console.print(f"allocation {j['allocation']['id']} ({j['allocation']['state']}): {members}")
        console.print(f"max runtime {format_duration(j['spec']['max_runtime'])}   temporal {j['temporal_url']}")
        events = Table("TIME", "ATTEMPT", "EVENT", "MESSAGE")
        for e in j["events"]:
            events.add_row(_ts(e["ts"]), str(e["attempt"]), e["kind"], e["message"])
        console.print(events)

    _emit(data, output, show)


@app.command()
def logs(
    job_id: str,
    attempt: int = typer.Option(None, "--attempt"),
    rank: int = typer.Option(0, "--rank"),
    tail: int = typer.Option(None, "--tail"),
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Print a job attempt's log (stdout and stderr)."""
    params = {k: v for k, v in {"attempt": attempt, "rank": rank, "tail": tail}.items() if v is not None}
    with _client(api_url, token) as http:
        resp = http.get(f"/v1/jobs/{job_id}/logs", params=params)
        if resp.status_code >= 400:
            _check(resp)
        sys.stdout.write(resp.text)


@app.command()
def cancel(job_id: str, api_url: str = ApiUrl, token: str = Token) -> None:
    """Cancel a job (its processes get SIGTERM, then SIGKILL after the grace period)."""
    with _client(api_url, token) as http:
        data = _check(http.post(f"/v1/jobs/{job_id}/cancel"))
    console.print(f"cancel requested for {data['id']} (was {data['state']})")


@app.command()
def preempt(job_id: str, reason: str = typer.Option(None, "--reason"), api_url: str = ApiUrl, token: str = Token) -> None:
    """Preempt a running job: it checkpoints (SIGTERM, grace period), then queues again as the next attempt."""
    with _client(api_url, token) as http:
        data = _check(http.post(f"/v1/jobs/{job_id}/preempt", params={"reason": reason} if reason else {}))
    console.print(data["message"])


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _fleet_tables(data: dict[str, Any]) -> list[Table]:
    totals = Table("GPU TYPE", "NODES", "TOTAL", "USED", "FREE", "UNHEALTHY", "STRANDED", "FRAGMENTATION", title="GPU types")
    for gpu_type, t in sorted(data["gpu_types"].items()):
        totals.add_row(
            gpu_type, str(t["nodes"]), str(t["total"]), str(t["used"]), str(t["free"]), str(t["unhealthy"]),
            str(t.get("stranded", 0)), f"{t.get('fragmentation', 0.0):.0%}",
        )  # fmt: skip
    domains = Table("LEVEL", "DOMAIN", "GPU TYPES", "TOTAL", "USED", "FREE", "UNHEALTHY", "WHOLE FREE", "FRAGMENTATION", title="Topology")
    for level, per_domain in data.get("domains", {}).items():
        for name, d in per_domain.items():
            domains.add_row(
                level, name, ",".join(d["gpu_types"]), str(d["total"]), str(d["used"]), str(d["free"]), str(d["unhealthy"]),
                str(d["whole_nodes_free"]), f"{d['fragmentation']:.0%}",
            )  # fmt: skip
    nodes = Table("NODE", "TYPE", "STATE", "TOPOLOGY", "USED", "FREE", "UNHEALTHY", "UTIL", "HEARTBEAT", title="Nodes")
    for n in data["nodes"]:
        topo = " ".join(f"{k}={v}" for k, v in sorted(n["labels"].items()))
        state = n["state"] if n["schedulable"] else f"{n['state']} (not schedulable)"
        nodes.add_row(
            n["id"], n["gpu_type"], state, topo, str(n["gpus"]["used"]), str(n["gpus"]["free"]), str(n["gpus"]["unhealthy"]),
            _pct(n.get("utilization_pct")), _ts(n["last_heartbeat"]),
        )  # fmt: skip
    return [totals, domains, nodes]


def _queue_table(rows: list[dict[str, Any]], limit: int | None = None) -> Table:
    table = Table("POS", "ID", "TENANT", "NAME", "GPUS", "PRIORITY", "WAITING", "EST. START", "WHY", title="Queue")
    now = time.time()
    for r in rows[:limit]:
        j = r["job"]
        eta = r.get("estimated_start")
        when = "unknown" if eta is None else ("now" if eta <= now + 1 else f"{_ts(eta)} (in {format_duration(eta - now)})")
        table.add_row(
            str(r["position"]), j["id"], j["tenant"], j["name"], f"{j['gpu_count']}x{j['gpu_type']}",
            str(j["priority"]), format_duration(now - j["created_at"]), when, j.get("pending_reason") or "",
        )  # fmt: skip
    return table


def _tenants_table(rows: list[dict[str, Any]]) -> Table:
    table = Table("TENANT", "COHORT", "WEIGHT", "GPU TYPE", "GUARANTEED", "USED", "BORROWED", "SHARE", "RUNNING", "WAITING")
    for t in rows:
        quotas = sorted(t["quotas"].items()) or [("-", {"guaranteed": 0, "used": 0, "borrowed": 0})]
        for i, (gpu_type, q) in enumerate(quotas):
            first = i == 0
            table.add_row(
                t["name"] if first else "", (t["cohort"] or "-") if first else "", f"{t['weight']:g}" if first else "", gpu_type,
                str(q["guaranteed"]), str(q["used"]), str(q["borrowed"]), f"{t['dominant_share']:.1%}" if first else "",
                str(len(t["running_jobs"])) if first else "", str(len(t["waiting_jobs"])) if first else "",
            )  # fmt: skip
    return table


@app.command()
def fleet(api_url: str = ApiUrl, token: str = Token, output: str = Output) -> None:
    """Show GPU types, topology domains and nodes: free, used, unhealthy, fragmentation, utilisation."""
    with _client(api_url, token) as http:
        _emit(_check(http.get("/v1/fleet")), output, lambda data: console.print(*_fleet_tables(data), sep="\n"))


@app.command()
def queue(api_url: str = ApiUrl, token: str = Token, output: str = Output) -> None:
    """Show the queue in scheduling order, with each job's pending reason and estimated start."""
    with _client(api_url, token) as http:
        _emit(_check(http.get("/v1/queue")), output, lambda rows: console.print(_queue_table(rows)))


@app.command()
def tenants(api_url: str = ApiUrl, token: str = Token, output: str = Output) -> None:
    """Show each tenant's quota against usage (a tenant's token shows its own tenant)."""
    with _client(api_url, token) as http:
        _emit(_check(http.get("/v1/tenants")), output, lambda rows: console.print(_tenants_table(rows)))


@app.command()
def top(
    api_url: str = ApiUrl,
    token: str = Token,
    interval: float = typer.Option(0.0, "--interval", "-n", help="Refresh every N seconds until Ctrl-C (0: once)."),
) -> None:
    """Fleet, tenants and the head of the queue on one screen."""
    from rich.console import Group
    from rich.live import Live

    with _client(api_url, token) as http:

        def screen() -> Group:
            fleet_tables = _fleet_tables(_check(http.get("/v1/fleet")))
            parts = [fleet_tables[0], fleet_tables[1], _tenants_table(_check(http.get("/v1/tenants")))]
            return Group(*parts, _queue_table(_check(http.get("/v1/queue")), limit=15))

        if interval <= 0:
            console.print(screen())
            return
        with Live(screen(), console=console, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(screen())


node_app = typer.Typer(help="Admin: cordon, drain, uncordon nodes; return GPUs to service; inject simulated faults.", no_args_is_help=True)
app.add_typer(node_app, name="node")


@node_app.command("cordon")
def node_cordon(node_id: str, api_url: str = ApiUrl, token: str = Token) -> None:
    """No new work on the node."""
    with _client(api_url, token) as http:
        console.print(f"{node_id}: {_check(http.post(f'/v1/nodes/{node_id}/cordon'))['state']}")


@node_app.command("uncordon")
def node_uncordon(node_id: str, api_url: str = ApiUrl, token: str = Token) -> None:
    with _client(api_url, token) as http:
        console.print(f"{node_id}: {_check(http.post(f'/v1/nodes/{node_id}/uncordon'))['state']}")


@node_app.command("drain")
def node_drain(
    node_id: str,
    checkpoint: bool = typer.Option(False, "--checkpoint", help="Checkpoint the jobs off the node now (default: let them finish)."),
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Cordon the node, and let its jobs finish or checkpoint them off it."""
    with _client(api_url, token) as http:
        data = _check(http.post(f"/v1/nodes/{node_id}/drain", params={"checkpoint": checkpoint}))
    console.print(f"{node_id}: {data['state']}; jobs {', '.join(data['jobs']) or '(none)'} {'moving' if checkpoint else 'finishing there'}")


@node_app.command("return-gpu")
def node_return_gpu(node_id: str, index: int, api_url: str = ApiUrl, token: str = Token) -> None:
    """Put a GPU taken out of service back in service."""
    with _client(api_url, token) as http:
        _check(http.post(f"/v1/nodes/{node_id}/gpus/{index}/return"))
    console.print(f"GPU {node_id}/{index} back in service")


@node_app.command("inject-fault")
def node_inject_fault(
    node_id: str,
    index: int,
    kind: str = typer.Argument(..., help="xid, ecc_uncorrectable, ecc_correctable, retired_pages, thermal or power."),
    xid: int = typer.Option(None, "--xid", help="The Xid for kind xid (default 79)."),
    count: int = typer.Option(1, "--count"),
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Simulated GPUs only: make the node's agent report a fault on a GPU."""
    body: dict[str, Any] = {"kind": kind, "count": count} | ({"xid": xid} if xid is not None else {})
    with _client(api_url, token) as http:
        _check(http.post(f"/v1/nodes/{node_id}/gpus/{index}/faults", json=body))
    console.print(f"GPU {node_id}/{index}: {kind} injected")


from simulator.cli import sim as _sim  # noqa: E402

app.command(name="sim")(_sim)


from fairgang.cli_sweeps import schedule_app, sweep_app  # noqa: E402

app.add_typer(sweep_app, name="sweep")
app.add_typer(schedule_app, name="schedule")


def main() -> None:
    """The `fairgang` command: the Typer app, with an unreachable or silent API reported in one line."""
    try:
        app()
    except httpx.TimeoutException as err:
        err_console.print(f"[red]error:[/] the API at {err.request.url.host}:{err.request.url.port} did not answer in time ({err!r})")
        raise SystemExit(1) from None
    except httpx.TransportError as err:
        err_console.print(f"[red]error:[/] cannot reach the API: {err}")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
