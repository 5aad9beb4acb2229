"""Build a store at the SPEC's scale: the fleet, the tenants, the current jobs and a week of history.

At ``--scale 1``: 750 nodes / 5,000 GPUs (A100-40GB, A100-80GB and H100-80GB nodes of 8 GPUs,
L40S nodes of 4), in leaves of 16-32 nodes under spines; 50 tenants in 5 cohorts with per-type
quotas and one token each; 2,000 running jobs (each with a live ACKED allocation, state RUNNING)
and 2,000 queued jobs (their workflows started, waiting for placement); and the history that 500
submissions an hour leave behind over the last 8 days: about 96,000 finished jobs, each with its
released allocation(s) (``allocation`` RELEASED, ``allocation_gpu`` rows with ``live`` false) and its
events (SUBMITTED, PLACED, LAUNCHING, RUNNING, then SUCCEEDED, FAILED or CANCELLED; a few were
preempted once: PREEMPTING, REQUEUED and a second attempt). ``--scale 2`` or ``4`` multiplies the
fleet, the current jobs and the history rate; there are always 50 tenants.

How: the schema comes from the migrations (``store.db.migrate``); tenants, tokens, nodes and GPUs
are loaded by ``store.tenants.seed_cluster`` from a :class:`~fairgang.cluster.ClusterConfig` and every node
is registered by ``store.nodes.register_node`` (as its agent would, with the simulated GPUs' inventory).
The jobs, allocations and events (about 700,000 rows at 1x) are bulk-inserted with SQLAlchemy Core:
exactly the rows ``create_job``, ``mark_queued``, ``commit_bindings``, ``record_transition`` and
``requeue_job`` write, without a transaction per state change. Historical allocations are spread
over GPUs of the right type without checking that two of them never overlapped in time on one GPU
(nothing reads history that way); the current live allocations are packed without overlap, as the
partial unique index requires. Afterwards ``store.usage.rebuild`` brings any usage ledger the store
keeps in line with the inserted history (an empty store has none: the first placement cycle builds
its ledger from these rows).

With ``--live`` the current jobs are left for a live platform to run: the 2,000 "running" and 2,000
queued jobs are all stored as just submitted (QUEUED, their workflows not started yet), so the
platform's reconciler starts their workflows and the placement service places them. Their specs
carry ``SIM_RUNTIME_S`` (the simulated run time, see benchmarks/agent_host.py).

It writes the cluster config it used (``cluster.yaml``, so that simulated agents can register as
those nodes) and ``tokens.json`` into ``--out``, and prints where they are::

    .venv/bin/python -m benchmarks.scale_store --url sqlite:////tmp/scale/fairgang.db --scale 1
    .venv/bin/python -m benchmarks.scale_store --url postgresql://root@127.0.0.1:5432/scale --scale 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlmodel import SQLModel

from fairgang.cluster import ClusterConfig
from fairgang.spec import PRIORITY_CLASSES, JobSpec
from store import nodes as stored_nodes
from store import tenants as stored_tenants
from store import usage
from store.db import Database, migrate
from worker_agent.gpus import SimulatedGpus

#: Per GPU type at 1x: (nodes, GPUs per node). 200*8 + 180*8 + 120*8 + 250*4 = 5,000 GPUs on 750 nodes.
FLEET: dict[str, tuple[int, int]] = {"H100-80GB": (200, 8), "A100-80GB": (180, 8), "A100-40GB": (120, 8), "L40S": (250, 4)}
TENANTS = 50
COHORTS = 5
#: Job sizes (GPUs) and their weights; gangs of 16 and 32 span whole nodes of one leaf.
SIZES_BIG = ((1, 0.58), (2, 0.2), (4, 0.12), (8, 0.08), (16, 0.015), (32, 0.005))
SIZES_SMALL = ((1, 0.6), (2, 0.25), (4, 0.15))
#: Mean run time: by Little's law 2,000 running at 500 submissions an hour.
MEAN_RUNTIME_S = 4 * 3600.0
ADMIN_TOKEN = "scale-admin-token"
NODE_TOKEN = "scale-node-token"
CHUNK = 5000


def tenant_name(i: int) -> str:
    return f"team-{i:02d}"


def tenant_token(name: str) -> str:
    return f"{name}-token"


def build_config(scale: int = 1, nodes_only: int | None = None) -> ClusterConfig:
    """The fleet and the tenants at ``scale`` times the SPEC's fleet (``nodes_only``: a slice of it, every type kept)."""
    nodes: list[dict[str, Any]] = []
    capacity: dict[str, int] = {}
    for gpu_type, (count, per_node) in FLEET.items():
        short = gpu_type.lower().replace("-", "")[:8]
        n = count * scale
        capacity[gpu_type] = n * per_node
        leaf_size, leaves_per_spine = 25, 4
        for i in range(n):
            leaf = i // leaf_size
            nodes.append(
                {
                    "id": f"{short}-{i:04d}",
                    "gpu_type": gpu_type,
                    "gpus": per_node,
                    "labels": {"leaf": f"{short}-l{leaf:03d}", "spine": f"{short}-s{leaf // leaves_per_spine:02d}"},
                }
            )
    if nodes_only is not None:
        step = max(1, len(nodes) // max(nodes_only, 1))
        nodes = nodes[::step][:nodes_only]
        capacity = {t: sum(n["gpus"] for n in nodes if n["gpu_type"] == t) for t in FLEET}
    tenants: list[dict[str, Any]] = []
    types = [t for t in FLEET if capacity[t] > 0]
    rng = random.Random(7)
    # A slice of the fleet has too few GPUs for 50 tenants' shares: 4 tenants in one cohort, every type each.
    count, cohorts = (TENANTS, COHORTS) if nodes_only is None else (4, 1)
    # Each tenant is guaranteed part of two or three types; the nominal shares of a type add up to its capacity.
    shares: dict[str, list[tuple[int, float]]] = {t: [] for t in types}
    for i in range(count):
        for gpu_type in rng.sample(types, rng.choice((2, 3))) if nodes_only is None else types:
            shares[gpu_type].append((i, rng.uniform(0.5, 2.0)))
    quotas: dict[int, dict[str, dict[str, Any]]] = {i: {} for i in range(count)}
    for gpu_type, parts in shares.items():
        total = sum(w for _, w in parts)
        for i, w in parts:
            quotas[i][gpu_type] = {"nominal": int(capacity[gpu_type] * w / total), "borrow_limit": capacity[gpu_type] // 4}
    for i in range(count):
        name = tenant_name(i)
        tenants.append(
            {
                "name": name,
                "weight": 1.0 + (i % 3),
                "cohort": f"cohort-{i % cohorts}",
                "tokens": [tenant_token(name)],
                "quotas": quotas[i],
                "max_gpus_per_job": 64,
                "max_runtime": 48 * 3600.0,
                "max_concurrent_jobs": 1000 * scale,
            }
        )
    return ClusterConfig.model_validate({"admin_tokens": [ADMIN_TOKEN], "node_token": NODE_TOKEN, "tenants": tenants, "nodes": nodes})


# ---------------------------------------------------------------- rows


@dataclass
class Rows:
    jobs: list[dict[str, Any]] = field(default_factory=list)
    allocations: list[dict[str, Any]] = field(default_factory=list)
    allocation_gpus: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class NodeSlots:
    node_id: str
    leaf: str
    free: list[int]


class Fleet:
    """Free GPUs per type, to pack the live allocations without overlap."""

    def __init__(self, config: ClusterConfig) -> None:
        self.by_type: dict[str, list[NodeSlots]] = {}
        for n in config.nodes:
            self.by_type.setdefault(n.gpu_type, []).append(NodeSlots(n.id, n.labels["leaf"], list(range(n.gpus))))
        self.per_node = {t: len(nodes[0].free) for t, nodes in self.by_type.items()}

    def take(self, gpu_type: str, count: int) -> list[dict[str, Any]] | None:
        """Members for ``count`` GPUs (best fit on one node, or whole nodes of one leaf), or None."""
        per_node = self.per_node[gpu_type]
        nodes = self.by_type[gpu_type]
        if count <= per_node:
            fits = [n for n in nodes if len(n.free) >= count]
            if not fits:
                return None
            best = min(fits, key=lambda n: len(n.free))
            indices, best.free = best.free[:count], best.free[count:]
            return [{"node_id": best.node_id, "gpu_indices": indices, "rank": 0}]
        want = count // per_node
        by_leaf: dict[str, list[NodeSlots]] = {}
        for n in nodes:
            if len(n.free) == per_node:
                by_leaf.setdefault(n.leaf, []).append(n)
        for leaf_nodes in by_leaf.values():
            if len(leaf_nodes) >= want:
                members = []
                for rank, n in enumerate(leaf_nodes[:want]):
                    members.append({"node_id": n.node_id, "gpu_indices": n.free, "rank": rank})
                    n.free = []
                return members
        return None


class Maker:
    """Makes the rows of one job's life, as the store's own functions would write them."""

    def __init__(self, config: ClusterConfig, seed: int, live: bool, speedup: float = 1.0) -> None:
        self.rng = random.Random(seed)
        self.live, self.speedup = live, speedup
        self.tenants = [(t.name, sorted(t.quotas)) for t in config.tenants]
        self.per_node = {n.gpu_type: n.gpus for n in config.nodes}
        self.nodes_by_type: dict[str, list[str]] = {}
        for n in config.nodes:
            self.nodes_by_type.setdefault(n.gpu_type, []).append(n.id)
        self.serial = 0
        self.spec_template = JobSpec(
            name="x",
            entrypoint=["python3", "train.py"],
            gpu_type="H100-80GB",
            gpu_count=1,
            max_runtime=48 * 3600.0,
            checkpoint_dir="/ckpt/x",
        ).model_dump(mode="json", exclude={"idempotency_key"})

    def _id(self, prefix: str) -> str:
        return f"{prefix}-{self.rng.getrandbits(48):012x}"

    def runtime(self) -> float:
        return min(self.rng.expovariate(1.0 / MEAN_RUNTIME_S) + 60.0, 47 * 3600.0)

    def shape(self) -> tuple[str, str, int]:
        tenant, types = self.rng.choice(self.tenants)
        gpu_type = self.rng.choice(types)
        sizes = SIZES_BIG if self.per_node[gpu_type] >= 8 else SIZES_SMALL
        count = self.rng.choices([s for s, _ in sizes], [w for _, w in sizes])[0]
        return tenant, gpu_type, count

    def job(
        self, rows: Rows, *, tenant: str, gpu_type: str, count: int, submitted: float, state: str, sim_runtime_s: float | None = None
    ) -> dict[str, Any]:
        self.serial += 1
        name = f"train-{self.serial:06d}"
        env = {"SIM_RUNTIME_S": f"{sim_runtime_s:.3f}"} if sim_runtime_s is not None else {}
        priority_class = self.rng.choices(["low", "normal", "high"], [0.15, 0.75, 0.1])[0]
        spec = self.spec_template | {
            "name": name,
            "gpu_type": gpu_type,
            "gpu_count": count,
            "env": env,
            "priority_class": priority_class,
            "checkpoint_dir": f"/checkpoints/{tenant}/{name}",
            "tenant": tenant,
        }
        row: dict[str, Any] = {
            "id": self._id("j"),
            "tenant": tenant,
            "name": name,
            "idempotency_key": f"name:{name}",
            "spec": spec,
            "gpu_type": gpu_type,
            "gpu_count": count,
            "priority": PRIORITY_CLASSES[priority_class],
            "state": state,
            "attempt": 1,
            "pending_reason": None,
            "end_reason": None,
            "exit_code": None,
            "latest_checkpoint": None,
            "latest_checkpoint_at": None,
            "workflow_started": True,
            "created_at": submitted,
            "updated_at": submitted,
            "queued_at": submitted,
            "started_at": None,
            "finished_at": None,
        }
        rows.jobs.append(row)
        self.event(rows, row["id"], 1, "SUBMITTED", f"submitted by tenant {tenant}", "submitted", submitted)
        return row

    def event(self, rows: Rows, job_id: str, attempt: int, kind: str, message: str, key: str, ts: float, **data: Any) -> None:
        payload = {"allocation_id": None, "exit_code": None} | data if kind not in ("SUBMITTED", "REQUEUED") else {}
        rows.events.append(
            {"job_id": job_id, "ts": ts, "attempt": attempt, "kind": kind, "message": message, "data": payload, "dedupe_key": key}
        )

    def random_members(self, gpu_type: str, count: int) -> list[dict[str, Any]]:
        nodes, per_node = self.nodes_by_type[gpu_type], self.per_node[gpu_type]
        if count <= per_node:
            start = self.rng.randrange(0, per_node - count + 1)
            return [{"node_id": self.rng.choice(nodes), "gpu_indices": list(range(start, start + count)), "rank": 0}]
        first = self.rng.randrange(0, len(nodes) - count // per_node + 1)
        return [{"node_id": nodes[first + r], "gpu_indices": list(range(per_node)), "rank": r} for r in range(count // per_node)]

    def allocate(
        self, rows: Rows, job: dict[str, Any], attempt: int, members: list[dict[str, Any]], placed: float, *, live: bool
    ) -> dict[str, Any]:
        alloc = {
            "id": self._id("a"),
            "job_id": job["id"],
            "attempt": attempt,
            "state": "ACKED" if live else "RELEASED",
            "epoch": 1,
            "members": members,
            "created_at": placed,
            "acked_at": placed + 0.05,
            "released_at": None,
            "signalled_at": placed + 0.01,
        }
        rows.allocations.append(alloc)
        for m in members:
            for index in m["gpu_indices"]:
                rows.allocation_gpus.append({"allocation_id": alloc["id"], "node_id": m["node_id"], "gpu_index": index, "live": live})
        where = ", ".join(f"{m['node_id']}[{','.join(map(str, m['gpu_indices']))}]" for m in members)
        self.event(rows, job["id"], attempt, "PLACED", f"placed on {where}", f"placed-{attempt}", placed, allocation_id=alloc["id"])
        self.event(rows, job["id"], attempt, "LAUNCHING", "launching", f"launching-{attempt}", placed + 0.05, allocation_id=alloc["id"])
        running = placed + self.rng.uniform(0.2, 3.0)
        world = len(members)
        message = f"{world} member(s) running"
        self.event(rows, job["id"], attempt, "RUNNING", message, f"running-{attempt}", running, allocation_id=alloc["id"])
        if job["started_at"] is None:
            job["started_at"] = running
        return alloc

    def finished(self, rows: Rows, submitted: float, end_by: float) -> None:
        """A job of the history: queued, placed, run (maybe preempted once) and ended before ``end_by``."""
        tenant, gpu_type, count = self.shape()
        job = self.job(rows, tenant=tenant, gpu_type=gpu_type, count=count, submitted=submitted, state="QUEUED")
        t = submitted + self.rng.expovariate(1 / 600.0)
        attempt = 1
        if self.rng.random() < 0.03:  # preempted once, then ran again
            alloc = self.allocate(rows, job, 1, self.random_members(gpu_type, count), t, live=False)
            stop = t + self.rng.uniform(600, 3600)
            self.event(
                rows, job["id"], 1, "PREEMPTING", "preempted for a higher-priority job", "preempting-1", stop, allocation_id=alloc["id"]
            )
            alloc["released_at"] = stop + 5.0
            attempt = 2
            reason = "preempted: preempted for a higher-priority job"
            self.event(rows, job["id"], 2, "REQUEUED", reason, "requeue-1", stop + 5.0)
            job["attempt"], job["queued_at"] = 2, stop + 5.0
            t = stop + 5.0 + self.rng.expovariate(1 / 600.0)
        alloc = self.allocate(rows, job, attempt, self.random_members(gpu_type, count), t, live=False)
        end = min(t + self.runtime(), end_by)
        roll = self.rng.random()
        code: int | None = 0
        state, reason, key = "SUCCEEDED", "all members exited 0", "end"
        if roll < 0.07:
            state, code, reason, key = "FAILED", 1, "member 0 exited with code 1", "end"
        elif roll < 0.12:
            state, code, reason, key = "CANCELLED", None, "cancelled by user", "cancel"
        self.event(rows, job["id"], attempt, state, reason, f"{key}-{attempt}", end, allocation_id=None, exit_code=code)
        alloc["released_at"] = end
        job.update(state=state, exit_code=code, end_reason=reason, finished_at=end, updated_at=end)

    def running(self, rows: Rows, fleet: Fleet, now: float) -> bool:
        """A job running now on GPUs nobody else holds; False when no such GPUs are left for its shape."""
        tenant, gpu_type, count = self.shape()
        members = fleet.take(gpu_type, count)
        if members is None:
            return False
        started = now - self.rng.uniform(60.0, 2 * MEAN_RUNTIME_S)
        submitted = started - self.rng.expovariate(1 / 600.0)
        if self.live:
            # Left for the live platform to place: it runs for what remains of its run time.
            self.pending(rows, now, tenant=tenant, gpu_type=gpu_type, count=count, submitted=submitted, sim=self.runtime() / self.speedup)
            return True
        job = self.job(rows, tenant=tenant, gpu_type=gpu_type, count=count, submitted=submitted, state="RUNNING")
        self.allocate(rows, job, 1, members, started - 1.0, live=True)
        job["updated_at"] = job["started_at"]
        return True

    def pending(
        self,
        rows: Rows,
        now: float,
        *,
        tenant: str | None = None,
        gpu_type: str | None = None,
        count: int | None = None,
        submitted: float | None = None,
        sim: float | None = None,
    ) -> None:
        """A queued job: its workflow started and waiting for placement (``--live``: just submitted)."""
        if tenant is None or gpu_type is None or count is None:
            tenant, gpu_type, count = self.shape()
        submitted = now - self.rng.uniform(0.0, 6 * 3600.0) if submitted is None else submitted
        if self.live and sim is None:
            sim = self.runtime() / self.speedup
        job = self.job(rows, tenant=tenant, gpu_type=gpu_type, count=count, submitted=submitted, state="QUEUED", sim_runtime_s=sim)
        if self.live:
            job["workflow_started"], job["pending_reason"] = False, "waiting for its workflow to start"
        else:
            job["pending_reason"] = "waiting for placement"


def chunks(items: Sequence[dict[str, Any]], size: int = CHUNK) -> Iterator[Sequence[dict[str, Any]]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


async def insert_rows(conn: AsyncConnection, rows: Rows) -> None:
    for table, items in (
        ("job", rows.jobs),
        ("allocation", rows.allocations),
        ("allocation_gpu", rows.allocation_gpus),
        ("job_event", rows.events),
    ):
        for part in chunks(items):
            await conn.execute(insert(SQLModel.metadata.tables[table]), list(part))


def write_config(config: ClusterConfig, out: Path) -> None:
    """``out/cluster.yaml`` (the cluster config) and ``out/tokens.json`` (admin, node and per-tenant tokens)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "cluster.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    tokens = {"admin": ADMIN_TOKEN, "node": config.node_token, "tenants": {t.name: t.tokens[0] for t in config.tenants}}
    (out / "tokens.json").write_text(json.dumps(tokens, indent=1))


@dataclass
class BuildReport:
    url: str
    out: Path
    nodes: int
    gpus: int
    history_jobs: int
    running_jobs: int
    queued_jobs: int
    rows: int
    wall_s: float
    cpu_s: float


async def build(
    url: str,
    *,
    scale: int = 1,
    history_days: float = 8.0,
    rate_per_hour: float = 500.0,
    running: int | None = None,
    queued: int | None = None,
    live: bool = False,
    speedup: float = 1.0,
    out: Path,
    now: float | None = None,
    seed: int = 11,
    config: ClusterConfig | None = None,
) -> BuildReport:
    """Migrate the store at ``url`` and fill it (it should be empty); writes ``cluster.yaml`` and ``tokens.json`` into ``out``.

    ``speedup`` (with ``live``): the simulated run times are the real ones divided by it.
    """
    started, cpu0 = time.perf_counter(), time.process_time()
    now = time.time() if now is None else now
    config = config or build_config(scale)
    running = 2000 * scale if running is None else running
    queued = 2000 * scale if queued is None else queued
    write_config(config, out)

    await migrate(url)
    db = Database(url)
    try:
        await stored_tenants.seed_cluster(db, config, now=now)
        for n in config.nodes:
            gpus = SimulatedGpus(n.id, n.gpu_type, n.gpus)
            await stored_nodes.register_node(
                db,
                node_id=n.id,
                gpu_type=n.gpu_type,
                gpu_count=n.gpus,
                labels=dict(n.labels),
                boot_id="scale-store",
                gpus=[g.as_dict() for g in gpus.inventory()],
                now=now,
            )
        maker = Maker(config, seed, live, speedup)
        rows = Rows()
        history = int(rate_per_hour * scale * 24 * history_days)
        span = history_days * 86400.0
        for i in range(history):
            submitted = now - span + span * (i + maker.rng.random()) / max(history, 1)
            maker.finished(rows, submitted, end_by=now - 1.0)
        fleet = Fleet(config)
        placed = misses = 0
        while placed < running and misses < 1000:
            if maker.running(rows, fleet, now):
                placed += 1
            else:
                misses += 1
        for _ in range(queued):
            maker.pending(rows, now)
        async with db.engine.begin() as conn:
            await insert_rows(conn, rows)
            if not db.sqlite:
                await conn.execute(text("ANALYZE"))
        await usage.rebuild(db, now=now)  # ledgers kept already (none in an empty store) match the inserted rows
        if db.sqlite:
            async with db.engine.connect() as conn:
                await conn.exec_driver_sql("ANALYZE")
    finally:
        await db.dispose()
    total = len(rows.jobs) + len(rows.allocations) + len(rows.allocation_gpus) + len(rows.events)
    return BuildReport(
        url=url,
        out=out,
        nodes=len(config.nodes),
        gpus=sum(n.gpus for n in config.nodes),
        history_jobs=history,
        running_jobs=placed,
        queued_jobs=queued,
        rows=total,
        wall_s=time.perf_counter() - started,
        cpu_s=time.process_time() - cpu0,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="DATABASE_URL of an empty store (SQLite file or PostgreSQL database)")
    parser.add_argument("--scale", type=int, default=1, help="fleet multiple (1: 750 nodes / 5,000 GPUs)")
    parser.add_argument("--history-days", type=float, default=8.0)
    parser.add_argument("--rate", type=float, default=500.0, help="submissions an hour at 1x the history had")
    parser.add_argument("--running", type=int, default=None, help="running jobs (default 2,000 x scale)")
    parser.add_argument("--queued", type=int, default=None, help="queued jobs (default 2,000 x scale)")
    parser.add_argument("--live", action="store_true", help="store the current jobs as just submitted, for a live platform to run")
    parser.add_argument("--speedup", type=float, default=1.0, help="with --live: simulated run times are divided by it")
    parser.add_argument(
        "--out", type=Path, default=None, help="where cluster.yaml and tokens.json go (default: beside a SQLite file, else ./scale-store)"
    )
    args = parser.parse_args(argv)
    out = args.out
    if out is None:
        out = Path(args.url.split(":///", 1)[1]).parent if args.url.startswith("sqlite") else Path("scale-store")
    report = asyncio.run(
        build(
            args.url,
            scale=args.scale,
            history_days=args.history_days,
            rate_per_hour=args.rate,
            running=args.running,
            queued=args.queued,
            live=args.live,
            speedup=args.speedup,
            out=out,
        )
    )
    print(f"store    {report.url}")
    print(f"fleet    {report.nodes} nodes, {report.gpus} GPUs")
    print(f"jobs     {report.history_jobs} finished, {report.running_jobs} running, {report.queued_jobs} queued ({report.rows} rows)")
    print(f"config   {report.out / 'cluster.yaml'}")
    print(f"tokens   {report.out / 'tokens.json'}")
    print(f"took     {report.wall_s:.1f} s wall, {report.cpu_s:.1f} s CPU (this process)")


if __name__ == "__main__":
    main()
