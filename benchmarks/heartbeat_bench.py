"""Heartbeats at full scale: the real API (``fairgang api``) under N simulated node agents.

Builds a store with the SPEC's fleet (750 nodes / 5,000 GPUs by default: 500 H100 nodes of 8,
250 L40S nodes of 4) through the store's own functions (``store.tenants.seed_cluster``, ``store.nodes.register_node``),
fills about a third of the GPUs with live allocations and adds released history, starts the API as its
own process, and drives it over HTTP with one simulated agent per node, each heartbeating every
``--interval`` seconds (the agent's own request: its GPUs' health reports and the allocations it runs).

Prints one table per run: heartbeats/s achieved against the target, latency p50/p99/max, errors,
the API process's CPU seconds over the measured window (utime + stime from /proc, workers included)
and its RSS.

    .venv/bin/python benchmarks/heartbeat_bench.py                       # SQLite and PostgreSQL, 60 s each
    .venv/bin/python benchmarks/heartbeat_bench.py --backend postgres --workers 2 --duration 30
    .venv/bin/python benchmarks/heartbeat_bench.py --url postgresql://root@127.0.0.1:5432/mystore --skip-build
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from rich.console import Console
from rich.table import Table

from benchmarks.ports import free_port
from fairgang.cluster import ClusterConfig, NodeConfig, QuotaConfig, TenantConfig, node_credential
from store import health, tenants
from store import nodes as stored_nodes
from store.db import Database, migrate
from store.models import Allocation, AllocationGpu, Job

PG_ADMIN = os.environ.get("BENCH_PG", "postgresql://root@127.0.0.1:5432/test")
NODE_TOKEN = "bench-node-token"
console = Console(width=170)


# ---------------------------------------------------------------- the store


def fleet(nodes: int) -> list[NodeConfig]:
    """Two in three nodes of 8 H100s, one in three of 4 L40S (750 nodes -> 5,000 GPUs); leaves of 25 nodes."""
    out = []
    for i in range(nodes):
        big = i % 3 != 2
        out.append(
            NodeConfig(
                id=f"n{i:05d}",
                gpu_type="H100-80GB" if big else "L40S",
                gpus=8 if big else 4,
                labels={"leaf": f"l{i // 25}", "spine": f"s{i // 100}"},
            )
        )
    return out


def report(busy: bool) -> dict[str, Any]:
    """What the simulated GPU backend reports (worker_agent/gpus.py)."""
    return {
        "simulated": True,
        "utilization_pct": 97.0 if busy else 0.0,
        "memory_used_mb": 60_000 if busy else 0,
        "memory_total_mb": 81_559,
        "temperature_c": 68 if busy else 35,
        "xid_errors": [],
        "ecc_uncorrectable_volatile": 0,
        "ecc_uncorrectable_aggregate": 0,
        "ecc_correctable_volatile": 0,
        "retired_pages": 0,
        "throttle_reasons": [],
    }


async def build(url: str, nodes: list[NodeConfig], *, busy_fraction: float, history: int) -> dict[str, dict[str, Any]]:
    """Seed and register the fleet, place live allocations and released history; returns each node's agent view."""
    await migrate(url)
    db = Database(url)
    try:
        config = ClusterConfig(
            node_token=NODE_TOKEN,
            tenants=[
                TenantConfig(
                    name="bench",
                    tokens=["bench-token"],
                    quotas={"H100-80GB": QuotaConfig(nominal=10_000), "L40S": QuotaConfig(nominal=10_000)},
                )
            ],
            nodes=nodes,
        )
        await tenants.seed_cluster(db, config)
        view: dict[str, dict[str, Any]] = {}
        rng = random.Random(7)
        for n in nodes:
            boot = f"boot-{uuid.uuid4().hex[:8]}"
            gpus = [{"index": i, "uuid": f"GPU-{n.id}-{i}", "health": report(False)} for i in range(n.gpus)]
            await stored_nodes.register_node(
                db, node_id=n.id, gpu_type=n.gpu_type, gpu_count=n.gpus, labels=n.labels, boot_id=boot, gpus=gpus
            )
            view[n.id] = {"boot_id": boot, "gpus": n.gpus, "running": [], "busy": set()}
        now = time.time()
        jobs: list[Job] = []
        allocs: list[Allocation] = []
        held: list[AllocationGpu] = []
        # Released history: what finished jobs leave behind in allocation_gpu (live = false).
        for h in range(history):
            n = nodes[rng.randrange(len(nodes))]
            job_id, alloc_id = f"job-h{h:06d}", f"alloc-h{h:06d}"
            jobs.append(_job(job_id, n, 1, "SUCCEEDED", now))
            members = [{"node_id": n.id, "gpu_indices": [0], "rank": 0}]
            allocs.append(
                Allocation(
                    id=alloc_id, job_id=job_id, attempt=1, state="RELEASED", created_at=now - 3600, released_at=now - 60, members=members
                )
            )
            held.append(AllocationGpu(allocation_id=alloc_id, node_id=n.id, gpu_index=0, live=False))
        for count, n in enumerate(nodes):
            if rng.random() >= busy_fraction:
                continue
            job_id, alloc_id = f"job-l{count:06d}", f"alloc-l{count:06d}"
            jobs.append(_job(job_id, n, n.gpus, "RUNNING", now))
            members = [{"node_id": n.id, "gpu_indices": list(range(n.gpus)), "rank": 0}]
            allocs.append(Allocation(id=alloc_id, job_id=job_id, attempt=1, state="ACKED", created_at=now, acked_at=now, members=members))
            held += [AllocationGpu(allocation_id=alloc_id, node_id=n.id, gpu_index=i) for i in range(n.gpus)]
            view[n.id]["running"] = [alloc_id]
            view[n.id]["busy"] = set(range(n.gpus))
        for rows in (jobs, allocs, held):
            async with db.transaction() as session:
                session.add_all(rows)
        now = time.time()
        return view
    finally:
        await db.dispose()


def _job(job_id: str, node: NodeConfig, gpus: int, state: str, now: float) -> Job:
    spec = {"name": job_id, "command": ["sleep", "1"], "resources": {"gpu_type": node.gpu_type, "gpus": gpus}}
    return Job(
        id=job_id,
        tenant="bench",
        name=job_id,
        idempotency_key=job_id,
        spec=spec,
        gpu_type=node.gpu_type,
        gpu_count=gpus,
        state=state,
        created_at=now,
        updated_at=now,
        queued_at=now,
        started_at=now,
    )


async def create_pg_database() -> str:
    name = f"fg_hb_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"


async def drop_pg_database(url: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
    finally:
        await conn.close()


# ---------------------------------------------------------------- the API process


def start_api(url: str, port: int, workers: int, log_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FAIRGANG_DATABASE_URL": url, "FAIRGANG_TEMPORAL_ADDRESS": "127.0.0.1:1", "FAIRGANG_LOG_DIR": str(log_dir)}
    cmd = [sys.executable, "-m", "cli", "api", "--host", "127.0.0.1", "--port", str(port)]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the API exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the API did not come up within 60 s")


def process_tree(pid: int) -> list[int]:
    """The process and its children (uvicorn's workers)."""
    pids = [pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            continue
    return total / os.sysconf("SC_CLK_TCK")


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total / 1024


# ---------------------------------------------------------------- the agents


class Wire:
    """One agent's keep-alive HTTP/1.1 connection, written by hand: a general client (httpx) costs more CPU
    per request than the heartbeat costs the API, and on a small machine it would starve the API it measures."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        try:
            return await asyncio.wait_for(self._post(path, body), timeout)
        except BaseException:
            self.close()
            raise

    async def _post(self, path: str, body: bytes) -> tuple[int, bytes]:
        node_id = path.split("/")[3]  # /v1/nodes/<id>/heartbeat: each node speaks with its own credential
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {node_credential(NODE_TOKEN, node_id)}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readuntil(b"\r\n")
        length = 0
        while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return int(status_line.split()[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def agents(
    base: str, nodes: dict[str, dict[str, Any]], interval: float, start: float, measure_from: float, end: float
) -> dict[str, Any]:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    host, port = base.removeprefix("http://").split(":")

    async def agent(node_id: str, view: dict[str, Any], offset: float) -> None:
        body = {
            "boot_id": view["boot_id"],
            "running": view["running"],
            "gpus": [{"index": i, "health": report(i in view["busy"])} for i in range(view["gpus"])],
        }
        wire, path, payload = Wire(host, int(port)), f"/v1/nodes/{node_id}/heartbeat", json.dumps(body).encode()
        tick = start + offset
        while tick < end:
            await asyncio.sleep(max(0.0, tick - time.time()))
            sent = time.time()
            problem = None
            try:
                status, answer = await wire.post(path, payload, timeout=10.0)
                if status != 200:
                    problem = f"HTTP {status}"
                elif not json.loads(answer)["accepted"]:
                    problem = "refused"
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as err:
                problem = type(err).__name__
            except TimeoutError:
                problem = "timeout (10 s)"
            if sent >= measure_from:
                latencies.append(time.time() - sent)
                if problem:
                    errors[problem] = errors.get(problem, 0) + 1
            tick += interval
            while tick < time.time():  # a beat that could not be sent in time is skipped, as a late agent would
                tick += interval
        wire.close()

    rng = random.Random(len(nodes))
    await asyncio.gather(*(agent(n, v, rng.random() * interval) for n, v in nodes.items()))
    return {"latencies": latencies, "errors": errors}


def agent_process(
    base: str, nodes: dict[str, dict[str, Any]], interval: float, start: float, measure_from: float, end: float, out: Any
) -> None:
    out.put(asyncio.run(agents(base, nodes, interval, start, measure_from, end)))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---------------------------------------------------------------- one run


def run(label: str, url: str, view: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory() as logs:
        api = start_api(url, port, args.workers, Path(logs))
        try:
            pids = process_tree(api.pid)
            warmup = 2 * args.interval
            start = time.time() + 1.0
            measure_from = start + warmup
            end = measure_from + args.duration
            names = sorted(view)[: args.agents]
            shards = [names[i :: args.client_procs] for i in range(args.client_procs)]
            queue: Any = multiprocessing.get_context("fork").Queue()
            procs = [
                multiprocessing.get_context("fork").Process(
                    target=agent_process,
                    args=(f"http://127.0.0.1:{port}", {n: view[n] for n in shard}, args.interval, start, measure_from, end, queue),
                )
                for shard in shards
                if shard
            ]
            for p in procs:
                p.start()
            time.sleep(max(0.0, measure_from - time.time()))
            pids = process_tree(api.pid)
            cpu0 = cpu_seconds(pids)
            time.sleep(max(0.0, end - time.time()))
            cpu1 = cpu_seconds(pids)
            rss = rss_mb(pids)
            results = [queue.get(timeout=60) for _ in procs]
            for p in procs:
                p.join(timeout=30)
        finally:
            os.killpg(api.pid, signal.SIGTERM)
            try:
                api.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(api.pid, signal.SIGKILL)
    latencies = [x for r in results for x in r["latencies"]]
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    ok = len(latencies) - sum(errors.values())
    cpu = cpu1 - cpu0
    return {
        "label": label,
        "workers": args.workers,
        "agents": len(names),
        "target": len(names) / args.interval,
        "achieved": ok / args.duration,
        "p50": pct(latencies, 0.50) * 1000,
        "p99": pct(latencies, 0.99) * 1000,
        "max": max(latencies, default=float("nan")) * 1000,
        "mean": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
        "errors": ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "0",
        "cpu": cpu,
        "cpu_per_beat": cpu / max(1, len(latencies)) * 1000,
        "rss": rss,
    }


async def prepare(backend: str, args: argparse.Namespace, tmp: Path) -> tuple[str, dict[str, dict[str, Any]], str | None]:
    """The store's URL, the agents' view, and a PostgreSQL database to drop afterwards."""
    nodes = fleet(args.nodes)
    if args.url:
        url, dropme = args.url, None
    elif backend == "sqlite":
        url, dropme = f"sqlite+aiosqlite:///{tmp / 'heartbeat.db'}", None
    else:
        url = await create_pg_database()
        dropme = url
    t0 = time.perf_counter()
    if args.skip_build:
        view = await agent_view(url, nodes)
    else:
        view = await build(url, nodes, busy_fraction=args.busy, history=args.history)
    console.print(
        f"[dim]{backend}: store ready in {time.perf_counter() - t0:.0f} s ({len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs)[/dim]"
    )
    return url, view, dropme


async def agent_view(url: str, nodes: list[NodeConfig]) -> dict[str, dict[str, Any]]:
    """For a store built before: each node's boot id and the live allocations it holds."""
    db = Database(url)
    try:
        view = {}
        for n in await stored_nodes.list_nodes(db):
            accepted, live = await stored_nodes.node_heartbeat(db, node_id=n.id, boot_id=n.boot_id or "")
            if accepted:
                busy = {i for i, _, _ in await health.gpu_jobs(db, n.id)}
                view[n.id] = {"boot_id": n.boot_id, "gpus": n.gpu_count, "running": live, "busy": busy}
        del nodes
        return view
    finally:
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--url", help="use this store (built here unless --skip-build)")
    parser.add_argument("--skip-build", action="store_true", help="the store at --url is already built (by this script)")
    parser.add_argument("--nodes", type=int, default=750)
    parser.add_argument("--agents", type=int, default=0, help="simulated agents (default: one per node)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between an agent's heartbeats")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds (after a warm-up of two intervals)")
    parser.add_argument("--workers", type=int, default=1, help="API worker processes (fairgang api --workers)")
    parser.add_argument("--client-procs", type=int, default=1, help="processes hosting the simulated agents")
    parser.add_argument("--busy", type=float, default=0.35, help="fraction of nodes running a live allocation")
    parser.add_argument("--history", type=int, default=20_000, help="released allocations in the store")
    args = parser.parse_args()
    args.agents = args.agents or args.nodes
    backends = (
        [("postgres" if args.url.startswith("postgres") else "sqlite")]
        if args.url
        else (["sqlite", "postgres"] if args.backend == "both" else [args.backend])
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            url, view, dropme = asyncio.run(prepare(backend, args, Path(tmp)))
            try:
                rows.append(run(backend, url, view, args))
            finally:
                if dropme:
                    asyncio.run(drop_pg_database(dropme))
    table = Table(title=f"Heartbeats: {args.nodes} nodes, one agent each every {args.interval:g} s, {args.duration:g} s measured")
    for name in (
        "store",
        "API workers",
        "agents",
        "target/s",
        "achieved/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "errors",
        "API CPU s",
        "CPU ms/beat",
        "API RSS MB",
    ):
        table.add_column(name, justify="left" if name in ("store", "errors") else "right")
    for r in rows:
        table.add_row(
            r["label"],
            str(r["workers"]),
            str(r["agents"]),
            f"{r['target']:.0f}",
            f"{r['achieved']:.0f}",
            f"{r['p50']:.1f}",
            f"{r['p99']:.1f}",
            f"{r['max']:.0f}",
            r["errors"],
            f"{r['cpu']:.1f}",
            f"{r['cpu_per_beat']:.2f}",
            f"{r['rss']:.0f}",
        )
    console.print(table)


if __name__ == "__main__":
    main()
