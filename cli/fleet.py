"""Fleet commands: ``fleet``, ``queue``, ``tenants``, ``top``, and the admin's ``node`` group."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from cli.kit import ApiUrl, Output, OutputFormat, Token, console, flag, start_window
from cli.kit import check as _check
from cli.kit import client as _client
from cli.kit import emit as _emit
from cli.kit import fail as _fail
from cli.kit import ts as _ts
from fairgang.cluster import load_cluster_config, node_credential
from fairgang.durations import format_duration
from fairgang.spec import SpecError

app = typer.Typer()


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
        when = start_window(r.get("estimated_start_low"), eta, r.get("estimated_start_high"), now)
        if eta is not None and eta > now + 1:
            when += f" (in {format_duration(eta - now)})"
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
def fleet(api_url: str = ApiUrl, token: str = Token, output: OutputFormat = Output) -> None:
    """Show GPU types, topology domains and nodes: free, used, unhealthy, fragmentation, utilisation."""
    with _client(api_url, token) as http:
        _emit(_check(http.get("/v1/fleet")), output, lambda data: console.print(*_fleet_tables(data), sep="\n"))


@app.command()
def queue(api_url: str = ApiUrl, token: str = Token, output: OutputFormat = Output) -> None:
    """Show the queue in scheduling order, with each job's pending reason and estimated start."""
    with _client(api_url, token) as http:
        _emit(_check(http.get("/v1/queue")), output, lambda rows: console.print(_queue_table(rows)))


@app.command()
def tenants(api_url: str = ApiUrl, token: str = Token, output: OutputFormat = Output) -> None:
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


node_app = typer.Typer(
    help="Admin: enrol, cordon, drain, uncordon, retire nodes; return GPUs to service; inject simulated faults.", no_args_is_help=True
)
app.add_typer(node_app, name="node")


@node_app.command("enrol")
def node_enrol(
    node_id: str,
    gpu_type: str = typer.Option(..., "--gpu-type"),
    gpus: int = typer.Option(..., "--gpus", min=1, help="GPUs on the node."),
    label: list[str] = typer.Option([], "--label", help="Topology label, e.g. leaf=l1 (repeat)."),
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Admin: enrol a node (again, to change its GPUs or labels) and print its new credential, once."""
    bad = [item for item in label if "=" not in item]
    if bad:
        _fail(f"--label: {bad[0]!r} is not key=value")
    body = {"node_id": node_id, "gpu_type": gpu_type, "gpu_count": gpus, "labels": dict(item.split("=", 1) for item in label)}
    with _client(api_url, token) as http:
        answer = _check(http.post("/v1/nodes", json=body))
    console.print(f"node {node_id} enrolled; its agent's FAIRGANG_NODE_TOKEN (shown once):")
    console.print(answer["token"], markup=False, highlight=False)


@node_app.command("credential")
def node_credential_of(node_id: str, config: Path = typer.Option(..., "--config", "-c", help="Cluster config YAML.")) -> None:
    """Print the credential a node of the cluster config gets from seeding (its agent's FAIRGANG_NODE_TOKEN)."""
    try:
        cluster = load_cluster_config(config)
    except SpecError as err:
        _fail(f"{config}: {err}")
    if node_id not in {n.id for n in cluster.nodes}:
        _fail(f"node {node_id} is not in {config}")
    console.print(node_credential(cluster.node_token, node_id), markup=False, highlight=False)


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
    checkpoint: bool = flag("--checkpoint", help="Checkpoint the jobs off the node now (default: let them finish)."),
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Cordon the node, and let its jobs finish or checkpoint them off it."""
    with _client(api_url, token) as http:
        data = _check(http.post(f"/v1/nodes/{node_id}/drain", params={"checkpoint": checkpoint}))
    console.print(f"{node_id}: {data['state']}; jobs {', '.join(data['jobs']) or '(none)'} {'moving' if checkpoint else 'finishing there'}")


@node_app.command("retire")
def node_retire(node_id: str, api_url: str = ApiUrl, token: str = Token) -> None:
    """Take an empty node out of the fleet for good (drain it first); enrolling it again brings it back."""
    with _client(api_url, token) as http:
        console.print(f"{node_id}: {_check(http.post(f'/v1/nodes/{node_id}/retire'))['state']}")


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
