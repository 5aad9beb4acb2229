"""The live platform at full scale: every real part, 750 simulated nodes, a week of history, a replayed workload.

It builds a store with :mod:`benchmarks.scale_store` (``--live``: the fleet, 50 tenants, about 96,000
finished jobs of history, and 2,000 + 2,000 jobs just submitted, for the platform to place), then
starts the real platform the way ``fairgang dev`` does (cli/platform.py): Temporal's dev server, the
API, the placement service and the workflow worker, on PostgreSQL (``--store postgres``) or on the
embedded SQLite default, plus the 750 node agents hosted in a few :mod:`benchmarks.agent_host`
processes (each node its own task queue, registration and heartbeat loop; members are timers).

Once the nodes are registered and the first placements have filled the fleet (warm-up), it measures
for ``--duration`` seconds: a burst of ``--burst`` submissions from 12 clients, then submissions at
500 an hour per 750 nodes, accelerated ``--speedup`` times (run times are divided by it too), while
one dashboard tab per ``--tabs`` polls /v1/queue, /v1/tenants, /v1/fleet and /metrics every 5 s. Then
it prints one table, each row with its target:

- capacity freed -> binding committed, -> signalled, -> RUNNING (p50/p99): for each allocation made in
  the window whose job was already waiting, from the release of the last of its GPUs to be freed
  (``allocation.released_at``) to its ``created_at``, ``signalled_at`` and the job's RUNNING event;
- the cycle and its parts (snapshot, core, commit) from the placement service's Prometheus histograms
  (quantiles are bucket upper bounds);
- heartbeats: rate and latency, measured in the agent hosts;
- submissions: the burst's rate, and the latency of every submission;
- each view's latency;
- CPU seconds (in the window) and peak RSS of each process (from /proc).

Results also go to ``docs/benchmarks/live-<store>-<scale>x.json`` (``--json``)::

    .venv/bin/python -m benchmarks.live_bench --store postgres --scale 1 --duration 300 --speedup 30
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from benchmarks import scale_store
from benchmarks.ports import free_port
from cli.platform import DevPlatform, wait_for_port
from store.db import Database

ROOT = Path(__file__).resolve().parents[1]
PG_DEFAULT = os.environ.get("FAIRGANG_BENCH_PG") or "postgresql://root@127.0.0.1:5432/test"
TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
VIEWS = ("/v1/queue", "/v1/tenants", "/v1/fleet", "/metrics")


@dataclass
class Options:
    store: str = "postgres"
    scale: int = 1
    #: A slice of the fleet instead (smoke runs): this many nodes, with the jobs scaled to match.
    nodes: int | None = None
    duration: float = 300.0
    speedup: float = 30.0
    hosts: int = 4
    history_days: float = 8.0
    rate_per_hour: float = 500.0
    running: int | None = None
    queued: int | None = None
    burst: int = 300
    tabs: int = 1
    #: API processes (uvicorn workers, FAIRGANG_API_WORKERS).
    api_workers: int = 2
    #: Seconds between two heartbeats of a node (the platform's FAIRGANG_NODE_HEARTBEAT_INTERVAL_S; 2 by default).
    heartbeat_interval: float = 2.0
    warmup_timeout: float = 600.0
    data_dir: Path | None = None
    pg_url: str = PG_DEFAULT
    json_path: Path | None = None
    say: Callable[[str], None] = print


@dataclass
class Row:
    name: str
    p50: float | None
    p99: float | None
    unit: str
    target: str
    met: bool | None
    n: int = 0
    note: str = ""


@dataclass
class Result:
    options: dict[str, Any]
    started: float
    window_s: float
    rows: list[Row] = field(default_factory=list)
    processes: dict[str, dict[str, float]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------- helpers


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def descendants(pid: int) -> list[int]:
    """The pid and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def proc_cpu_rss(pids: list[int]) -> tuple[float, float]:
    """(CPU seconds, RSS MB) summed over the pids."""
    cpu = rss = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu += (int(fields[11]) + int(fields[12])) / TICKS
        rss += int(fields[21]) * PAGE_KB / 1024.0
    return cpu, rss


def postgres_pids() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/comm").read_text().strip() == "postgres":
                    found.append(int(entry))
    return found


class ProcessWatch:
    """Samples CPU and RSS of the platform's processes (and PostgreSQL's) once a second."""

    def __init__(self, platform: DevPlatform, postgres: bool) -> None:
        self.platform, self.postgres = platform, postgres
        self.cpu0: dict[str, float] = {}
        self.cpu1: dict[str, float] = {}
        self.peak: dict[str, float] = {}

    def groups(self) -> dict[str, list[int]]:
        out = {name: descendants(proc.pid) for name, proc in self.platform.procs.items()}
        if self.postgres:
            out["postgresql (all backends)"] = postgres_pids()
        return out

    def sample(self) -> dict[str, float]:
        cpu = {}
        for name, pids in self.groups().items():
            c, r = proc_cpu_rss(pids)
            cpu[name] = c
            self.peak[name] = max(self.peak.get(name, 0.0), r)
        return cpu

    async def run(self) -> None:
        self.cpu0 = await asyncio.to_thread(self.sample)
        while True:
            await asyncio.sleep(1.0)
            self.cpu1 = await asyncio.to_thread(self.sample)


def histogram(text_body: str, name: str, labels: dict[str, str] | None = None) -> dict[float, float]:
    """Cumulative bucket counts of one histogram (upper bound -> count); {} when absent."""
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text_body):
        if family.name != name:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                continue
            if labels and any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            out[float(sample.labels["le"])] = out.get(float(sample.labels["le"]), 0.0) + sample.value
    return out


def histogram_quantiles(before: dict[float, float], after: dict[float, float]) -> tuple[float | None, float | None, int]:
    """(p50, p99, count) of the observations between two scrapes, as bucket upper bounds."""
    if not after:
        return None, None, 0
    delta = {le: after[le] - before.get(le, 0.0) for le in after}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return None, None, 0

    def q(frac: float) -> float:
        for le in sorted(delta):
            if delta[le] >= frac * total:
                return le
        return float("inf")

    return q(0.5), q(0.99), int(total)


# ---------------------------------------------------------------- the workload


@dataclass
class Client:
    """The submitting client and the dashboard tabs, with what they measured."""

    api_url: str
    tokens: dict[str, Any]
    maker: scale_store.Maker
    speedup: float
    submissions: list[tuple[float, float, int]] = field(default_factory=list)
    views: dict[str, list[float]] = field(default_factory=lambda: {v: [] for v in VIEWS})
    view_errors: int = 0
    serial: int = 0

    def spec(self) -> tuple[str, dict[str, Any]]:
        tenant, gpu_type, count = self.maker.shape()
        self.serial += 1
        name = f"live-{self.serial:06d}-{uuid.uuid4().hex[:6]}"
        runtime = self.maker.runtime() / self.speedup
        body = {
            "name": name,
            "entrypoint": ["simulated"],
            "gpu_type": gpu_type,
            "gpu_count": count,
            "max_runtime": "47h",
            "grace_period": "5s",
            "checkpoint_dir": f"/checkpoints/{tenant}/{name}",
            "env": {"SIM_RUNTIME_S": f"{runtime:.3f}"},
        }
        return tenant, body

    async def submit(self, http: httpx.AsyncClient) -> None:
        tenant, body = self.spec()
        token = self.tokens["tenants"][tenant]
        sent, t0 = time.time(), time.perf_counter()
        status = 0
        try:
            resp = await http.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"})
            status = resp.status_code
        except httpx.HTTPError:
            status = 0
        self.submissions.append((sent, time.perf_counter() - t0, status))

    async def burst(self, http: httpx.AsyncClient, count: int, clients: int = 12) -> float:
        """``count`` submissions from ``clients`` concurrent clients; returns the rate achieved (per second)."""
        left = [count]

        async def one_client() -> None:
            while left[0] > 0:
                left[0] -= 1
                await self.submit(http)

        t0 = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        return count / max(time.perf_counter() - t0, 1e-9)

    async def paced(self, http: httpx.AsyncClient, per_s: float, until: float) -> None:
        """Poisson arrivals at ``per_s`` until ``until`` (time.time()); each submission its own task."""
        rng = random.Random(5)
        tasks: set[asyncio.Task[None]] = set()
        next_at = time.time()
        while True:
            next_at += rng.expovariate(per_s) if per_s > 0 else until
            if next_at >= until:
                break
            await asyncio.sleep(max(0.0, next_at - time.time()))
            task = asyncio.create_task(self.submit(http))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def tab(self, http: httpx.AsyncClient, until: float, every_s: float = 5.0) -> None:
        """A dashboard tab: every view in turn, every ``every_s``."""
        headers = {"Authorization": f"Bearer {self.tokens['admin']}"}
        while time.time() < until:
            began = time.perf_counter()
            for view in VIEWS:
                t0 = time.perf_counter()
                try:
                    resp = await http.get(view, headers=headers, timeout=60.0)
                    if resp.status_code != 200:
                        self.view_errors += 1
                except httpx.HTTPError:
                    self.view_errors += 1
                self.views[view].append(time.perf_counter() - t0)
            await asyncio.sleep(max(0.0, every_s - (time.perf_counter() - began)))


# ---------------------------------------------------------------- measurements from the store


async def placement_latencies(db: Database, t0: float, t1: float) -> dict[str, list[float]]:
    """Freed -> committed, -> signalled, -> RUNNING, for allocations made in [t0, t1] whose job waited."""
    async with db.sessions() as session:
        allocs = (
            await session.execute(
                text(
                    "SELECT id, job_id, attempt, created_at, signalled_at, released_at FROM allocation"
                    " WHERE created_at >= :t0 OR released_at >= :t0"
                ),
                {"t0": t0},
            )
        ).all()
        gpus = (
            await session.execute(
                text(
                    "SELECT g.allocation_id, g.node_id, g.gpu_index FROM allocation_gpu g JOIN allocation a ON a.id = g.allocation_id"
                    " WHERE a.created_at >= :t0 OR a.released_at >= :t0"
                ),
                {"t0": t0},
            )
        ).all()
        running = (
            await session.execute(
                text("SELECT job_id, attempt, min(ts) FROM job_event WHERE kind = 'RUNNING' AND ts >= :t0 GROUP BY job_id, attempt"),
                {"t0": t0},
            )
        ).all()
        waiting = (
            await session.execute(
                text(
                    "SELECT e.job_id, e.attempt, min(e.ts) FROM job_event e"
                    " JOIN allocation a ON a.job_id = e.job_id AND a.attempt = e.attempt"
                    " WHERE e.kind IN ('SUBMITTED', 'REQUEUED') AND a.created_at >= :t0 GROUP BY e.job_id, e.attempt"
                ),
                {"t0": t0},
            )
        ).all()
    by_alloc: dict[str, list[tuple[str, int]]] = {}
    for allocation_id, node_id, index in gpus:
        by_alloc.setdefault(allocation_id, []).append((node_id, int(index)))
    releases: dict[tuple[str, int], list[float]] = {}
    for a in allocs:
        if a.released_at is not None and a.released_at >= t0:
            for g in by_alloc.get(a.id, []):
                releases.setdefault(g, []).append(float(a.released_at))
    ran = {(j, int(n)): float(ts) for j, n, ts in running}
    queued = {(j, int(n)): float(ts) for j, n, ts in waiting}
    out: dict[str, list[float]] = {"committed": [], "signalled": [], "running": []}
    for a in allocs:
        if not (t0 <= float(a.created_at) <= t1):
            continue
        created = float(a.created_at)
        freed = None
        for g in by_alloc.get(a.id, []):
            before = [r for r in releases.get(g, []) if r <= created]
            if before:
                freed = max(freed or 0.0, max(before))
        since = queued.get((a.job_id, int(a.attempt)))
        if freed is None or since is None or since > freed - 1.0:
            continue  # not capacity freed in the window for a job that was already waiting
        out["committed"].append(created - freed)
        if a.signalled_at is not None:
            out["signalled"].append(float(a.signalled_at) - freed)
        if (a.job_id, int(a.attempt)) in ran:
            out["running"].append(ran[(a.job_id, int(a.attempt))] - freed)
    return out


async def job_counts(db: Database) -> dict[str, int]:
    async with db.sessions() as session:
        rows = (await session.execute(text("SELECT state, count(*) FROM job GROUP BY state"))).all()
    return {str(s): int(n) for s, n in rows}


async def finished_since(db: Database, t0: float) -> int:
    async with db.sessions() as session:
        return int(
            (
                await session.execute(text("SELECT count(*) FROM job WHERE finished_at >= :t0 AND started_at IS NOT NULL"), {"t0": t0})
            ).scalar_one()
        )


# ---------------------------------------------------------------- the run


async def _create_pg(base: str) -> str:
    name = f"fg_live_{uuid.uuid4().hex[:10]}"
    dsn = base.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return f"{dsn.rsplit('/', 1)[0]}/{name}"


async def _drop_pg(base: str, url: str) -> None:
    conn = await asyncpg.connect(base.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
    finally:
        await conn.close()


async def run(opts: Options) -> Result:
    say = opts.say
    data_dir = opts.data_dir or Path(tempfile.mkdtemp(prefix="fg-live-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    config = scale_store.build_config(opts.scale, nodes_only=opts.nodes)
    fleet = len(config.nodes) / 750.0
    running = opts.running if opts.running is not None else max(1, round(2000 * fleet))
    queued = opts.queued if opts.queued is not None else max(1, round(2000 * fleet))
    url = await _create_pg(opts.pg_url) if opts.store == "postgres" else f"sqlite+aiosqlite:///{data_dir / 'fairgang.db'}"
    say(f"store {url}: building ({len(config.nodes)} nodes, {running} + {queued} jobs to run, {opts.history_days} days of history)")
    report = await scale_store.build(
        url,
        config=config,
        history_days=opts.history_days,
        rate_per_hour=opts.rate_per_hour * fleet,
        running=running,
        queued=queued,
        live=True,
        speedup=opts.speedup,
        out=data_dir,
    )
    say(f"store built: {report.rows} rows in {report.wall_s:.0f} s")
    tokens = json.loads((data_dir / "tokens.json").read_text())
    metrics_port = free_port()
    platform = DevPlatform(
        config.model_copy(update={"nodes": []}),
        data_dir,
        api_port=free_port(),
        temporal_port=free_port(),
        ui_port=free_port(),
        database_url=url,
        extra_env={
            "FAIRGANG_SCHEDULER_METRICS_PORT": str(metrics_port),
            "FAIRGANG_LOG_LEVEL": "WARNING",
            "FAIRGANG_NODE_TOKEN": config.node_token,
            "PYTHONPATH": str(ROOT),
            "FAIRGANG_API_WORKERS": str(opts.api_workers),
            "FAIRGANG_NODE_HEARTBEAT_INTERVAL_S": str(opts.heartbeat_interval),
        },
    )
    db = Database(url)
    result = Result(options={k: str(v) for k, v in asdict(opts).items() if k != "say"}, started=time.time(), window_s=0.0)
    watch = ProcessWatch(platform, postgres=opts.store == "postgres")
    background: list[asyncio.Task[None]] = []
    try:
        await asyncio.to_thread(platform.start, lambda line: say(f"  {line}"))
        for k in range(opts.hosts):
            argv = [sys.executable, "-m", "benchmarks.agent_host", "--config", str(data_dir / "cluster.yaml")]
            argv += ["--shard", str(k), "--shards", str(opts.hosts), "--stats", str(data_dir / f"agents-{k}.json")]
            platform._spawn(f"agents-{k}", argv)
        api = platform.settings.api_url
        async with httpx.AsyncClient(base_url=api, timeout=30.0, limits=httpx.Limits(max_connections=50)) as http:
            ready = await _wait_nodes(http, tokens["admin"], len(config.nodes), opts.warmup_timeout, platform, say)
            await _warm_up(db, running, opts.warmup_timeout, platform, say)
            await asyncio.to_thread(wait_for_port, "127.0.0.1", metrics_port)
            before = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
            client = Client(api, tokens, scale_store.Maker(config, 99, True, opts.speedup), opts.speedup)
            t0 = time.time()
            until = t0 + opts.duration
            background.append(asyncio.create_task(watch.run()))
            tabs = [asyncio.create_task(client.tab(http, until)) for _ in range(opts.tabs)]
            say(f"measuring for {opts.duration:.0f} s")
            burst_rate = await client.burst(http, opts.burst) if opts.burst else None
            per_s = opts.rate_per_hour * fleet * opts.speedup / 3600.0
            await client.paced(http, per_s, until)
            await asyncio.gather(*tabs)
            t1 = time.time()
            after = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
        background[0].cancel()
        result.window_s = t1 - t0
        cpu0, cpu1 = watch.cpu0, watch.cpu1 or watch.sample()
        # The agent hosts write their final figures when they stop.
        for k in range(opts.hosts):
            proc = platform.procs.pop(f"agents-{k}", None)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except Exception:  # noqa: BLE001 - a host that hangs is killed
                    proc.kill()
            platform.procs[f"agents-{k}"] = proc  # type: ignore[assignment]
        hosts = [
            json.loads((data_dir / f"agents-{k}.json").read_text()) for k in range(opts.hosts) if (data_dir / f"agents-{k}.json").exists()
        ]
        latencies = await placement_latencies(db, t0, t1)
        result.counts = await job_counts(db)
        result.counts["nodes_ready_before_window"] = ready
        result.counts["finished_in_window"] = await finished_since(db, t0)
        result.counts["launched_by_agents"] = sum(int(h["launched"]) for h in hosts)
        result.counts["exited_in_agents"] = sum(int(h["exited"]) for h in hosts)
        result.counts["submitted"] = len(client.submissions)
        result.counts["submit_errors"] = sum(1 for _, _, s in client.submissions if s not in (200, 201))
        result.counts["view_errors"] = client.view_errors
        result.rows = _rows(latencies, before, after, hosts, client, burst_rate, t0, t1)
        for name in sorted(set(cpu0) | set(cpu1)):
            result.processes[name] = {"cpu_s": cpu1.get(name, 0.0) - cpu0.get(name, 0.0), "peak_rss_mb": watch.peak.get(name, 0.0)}
    finally:
        for task in background:
            task.cancel()
        await asyncio.to_thread(platform.stop)
        await db.dispose()
        if opts.store == "postgres":
            with contextlib.suppress(Exception):
                await _drop_pg(opts.pg_url, url)
    _control_plane_rss(result)
    return result


async def _wait_nodes(
    http: httpx.AsyncClient, admin: str, want: int, timeout: float, platform: DevPlatform, say: Callable[[str], None]
) -> int:
    """Wait until every node is schedulable; returns how many are (measuring goes on with fewer after ``timeout``)."""
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        try:
            resp = await http.get("/v1/fleet", headers={"Authorization": f"Bearer {admin}"}, timeout=60.0)
            if resp.status_code == 200:
                ready = sum(1 for n in resp.json()["nodes"] if n.get("schedulable"))
                if ready != seen:
                    say(f"  nodes ready: {ready}/{want}")
                    seen = ready
                if ready >= want:
                    return ready
        except httpx.HTTPError:
            pass
        _check_alive(platform)
        await asyncio.sleep(2.0)
    say(f"  only {seen} of {want} nodes schedulable after {timeout:.0f} s: measuring anyway")
    return max(seen, 0)


async def _warm_up(db: Database, want: int, timeout: float, platform: DevPlatform, say: Callable[[str], None]) -> None:
    """Wait until the fleet has filled: about ``want`` jobs RUNNING, or no new high for 20 s."""
    deadline = time.monotonic() + timeout
    last, high, since = -1, 0, time.monotonic()
    while time.monotonic() < deadline:
        counts = await job_counts(db)
        now_running = counts.get("RUNNING", 0)
        if now_running > high:
            high, since = now_running, time.monotonic()
        if now_running != last:
            starting = counts.get("PLACED", 0) + counts.get("LAUNCHING", 0)
            say(f"  warm-up: {now_running} running, {counts.get('QUEUED', 0)} queued, {starting} starting")
            last = now_running
        if now_running >= 0.9 * want or (high > 0 and time.monotonic() - since > 20.0):
            return
        _check_alive(platform)
        await asyncio.sleep(2.0)
    say(f"  warm-up timed out with {last} running")


def _check_alive(platform: DevPlatform) -> None:
    for name, proc in platform.procs.items():
        if proc.poll() is not None:
            log = platform.data_dir / "process-logs" / f"{name}.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{name} exited with code {proc.returncode}:\n{tail}")


def _rows(
    latencies: dict[str, list[float]],
    before: str,
    after: str,
    hosts: list[dict[str, Any]],
    client: Client,
    burst_rate: float | None,
    t0: float,
    t1: float,
) -> list[Row]:
    rows = []
    for key, label, target in (
        ("committed", "capacity freed -> binding committed", 0.1),
        ("signalled", "capacity freed -> committed and signalled", 0.1),
        ("running", "capacity freed -> RUNNING", 0.5),
    ):
        values = latencies[key]
        p99 = quantile(values, 0.99)
        rows.append(
            Row(
                label,
                quantile(values, 0.5),
                p99,
                "s",
                f"p99 <= {target * 1000:.0f} ms",
                None if p99 is None else p99 <= target,
                len(values),
            )
        )
    for label, name, labels in (
        ("cycle (whole)", "fairgang_scheduling_cycle_seconds", None),
        ("cycle: snapshot", "fairgang_scheduling_phase_seconds", {"phase": "snapshot"}),
        ("cycle: core", "fairgang_scheduling_phase_seconds", {"phase": "core"}),
        ("cycle: commit", "fairgang_scheduling_phase_seconds", {"phase": "commit"}),
        ("cycle: decision (core)", "fairgang_scheduling_decision_seconds", None),
    ):
        p50, p99, n = histogram_quantiles(histogram(before, name, labels), histogram(after, name, labels))
        if n or "phase" not in name:
            rows.append(Row(label, p50, p99, "s", "-", None, n, "bucket upper bounds"))
    beats = [(lat, status) for h in hosts for sent, lat, status in h["heartbeats"] if t0 <= sent <= t1]
    ok = [lat for lat, status in beats if status == 200]
    interval = float(hosts[0]["heartbeat_interval_s"]) if hosts else 2.0
    nodes = sum(len(h["nodes"]) for h in hosts)
    rate = len(ok) / max(t1 - t0, 1e-9)
    want = nodes / interval
    p99 = quantile(ok, 0.99)
    failed = len(beats) - len(ok)
    rows.append(
        Row(
            "heartbeat latency",
            quantile(ok, 0.5),
            p99,
            "s",
            "p99 <= 100 ms",
            None if p99 is None else p99 <= 0.1 and failed == 0,
            len(beats),
            f"{failed} failed",
        )
    )
    rows.append(
        Row("heartbeats answered", None, rate, "/s", f">= {want:.0f}/s (every node every {interval:.0f} s)", rate >= 0.95 * want, len(ok))
    )
    lat = [x for _, x, s in client.submissions if s in (200, 201)]
    p99 = quantile(lat, 0.99)
    errors = sum(1 for _, _, s in client.submissions if s not in (200, 201))
    rows.append(
        Row(
            "submission latency",
            quantile(lat, 0.5),
            p99,
            "s",
            "p99 <= 200 ms",
            None if p99 is None else p99 <= 0.2,
            len(client.submissions),
            f"{errors} refused or failed",
        )
    )
    if burst_rate is not None:
        rows.append(Row("submission rate (burst, 12 clients)", None, burst_rate, "/s", ">= 50/s", burst_rate >= 50.0, 0))
    for view, values in client.views.items():
        p99 = quantile(values, 0.99)
        rows.append(Row(f"view {view}", quantile(values, 0.5), p99, "s", "p99 <= 200 ms", None if p99 is None else p99 <= 0.2, len(values)))
    return rows


CONTROL_PLANE = ("api", "scheduler", "worker")


def _control_plane_rss(result: Result) -> None:
    peak = max((p.get("peak_rss_mb", 0.0) for n, p in result.processes.items() if n in CONTROL_PLANE), default=0.0)
    result.rows.append(Row("control-plane peak RSS (largest)", None, peak, "MB", "<= 1024 MB", peak <= 1024 if peak else None, 0))


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"
    if unit == "/s":
        return f"{value:.1f}/s"
    return f"{value:.0f} {unit}"


def table(result: Result) -> str:
    lines = [f"{'':44} {'p50':>10} {'p99/value':>12} {'n':>7}  {'target':<34} met"]
    for r in result.rows:
        met = "-" if r.met is None else ("met" if r.met else "NOT MET")
        note = f"  ({r.note})" if r.note else ""
        lines.append(f"{r.name:44} {_fmt(r.p50, r.unit):>10} {_fmt(r.p99, r.unit):>12} {r.n:>7}  {r.target:<34} {met}{note}")
    lines.append("")
    lines.append(f"{'process':32} {'CPU s':>8} {'CPU %':>7} {'peak RSS':>10}")
    for name, p in sorted(result.processes.items()):
        if "cpu_s" not in p:
            continue
        share = 100.0 * p["cpu_s"] / max(result.window_s, 1e-9)
        lines.append(f"{name:32} {p['cpu_s']:8.1f} {share:6.0f}% {p.get('peak_rss_mb', 0.0):8.0f} MB")
    lines.append("")
    lines.append("jobs: " + ", ".join(f"{k} {v}" for k, v in sorted(result.counts.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The live platform at full scale (see the module docstring).")
    parser.add_argument("--store", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--scale", type=int, default=1, help="fleet multiple: 1 = 750 nodes / 5,000 GPUs")
    parser.add_argument("--nodes", type=int, default=None, help="a slice of the fleet instead (smoke runs)")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds measured after the warm-up")
    parser.add_argument("--speedup", type=float, default=30.0, help="submission rate and run times accelerated this much")
    parser.add_argument("--hosts", type=int, default=4, help="agent host processes")
    parser.add_argument("--history-days", type=float, default=8.0)
    parser.add_argument("--running", type=int, default=None, help="jobs stored to fill the fleet (default 2,000 per 750 nodes)")
    parser.add_argument("--queued", type=int, default=None, help="jobs stored to wait (default 2,000 per 750 nodes)")
    parser.add_argument("--burst", type=int, default=300, help="submissions in the burst (0: none)")
    parser.add_argument("--tabs", type=int, default=1, help="dashboard tabs polling the views")
    parser.add_argument("--api-workers", type=int, default=2, help="API processes (uvicorn workers)")
    parser.add_argument("--heartbeat-interval", type=float, default=2.0, help="seconds between a node's heartbeats (the SPEC's fleet: 2)")
    parser.add_argument("--warmup-timeout", type=float, default=600.0)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--pg-url", default=PG_DEFAULT, help="a PostgreSQL server's database to create the bench's database from")
    parser.add_argument("--json", type=Path, default=None, help="where the results go (default docs/benchmarks/live-<store>-<scale>x.json)")
    args = parser.parse_args(argv)
    opts = Options(
        store=args.store,
        scale=args.scale,
        nodes=args.nodes,
        duration=args.duration,
        speedup=args.speedup,
        hosts=args.hosts,
        history_days=args.history_days,
        running=args.running,
        queued=args.queued,
        burst=args.burst,
        tabs=args.tabs,
        api_workers=args.api_workers,
        heartbeat_interval=args.heartbeat_interval,
        warmup_timeout=args.warmup_timeout,
        data_dir=args.data_dir,
        pg_url=args.pg_url,
    )

    async def until_signal() -> Result:
        # SIGTERM or SIGINT: stop the platform and drop the bench's database on the way out.
        task = asyncio.ensure_future(run(opts))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await task

    result = asyncio.run(until_signal())
    print(table(result))
    path = args.json or (ROOT / "docs" / "benchmarks" / f"live-{args.store}-{args.nodes or args.scale}{'n' if args.nodes else 'x'}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(result), indent=1, default=str))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
