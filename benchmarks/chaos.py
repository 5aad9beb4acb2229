"""A chaos run: the whole platform under a steady load of real jobs while its parts are killed, frozen and
restarted at random; then an audit of what must never happen.

    .venv/bin/python -m benchmarks.chaos --minutes 30 --seed 1 --report docs/reliability.md

It starts the platform the way ``fairgang dev`` does (cli/platform.py), with two placement services, two
workflow workers and, when run as root with PostgreSQL's binaries installed, a PostgreSQL server of its own
(else the SQLite store, and no store faults). Every part is supervised: one that dies is started again
within a second, as a service manager would. A load generator submits a real training job
(examples/train_numpy.py, 1 to 8 GPUs, checkpointing) every ``--every`` seconds. One fault at a time:
every part in turn, in a shuffled order (``--seed``), each with a fault of a random kind: ``kill9``
(SIGKILL; the store's whole process group), ``stop`` (SIGSTOP for 3 to 10 s, then SIGCONT) or ``restart``
(SIGTERM; PostgreSQL's fast shutdown, SIGINT), of the API, either placement service, either worker, an
agent, Temporal or PostgreSQL; and for the load nodes' agents, which run in network namespaces of their own
(as root, with `ip`), ``cut`` (their link taken down for 5 to 45 s: sometimes past the lease and the
lost-node timeout). After each, it measures the recovery: from the fault's end (the kill, the SIGCONT, the SIGTERM) until a probe job
submitted then runs (on a node the load leaves alone), or, for an agent, until its node heartbeats again.

Then it stops the faults and the load, waits for every job to end, and audits, from the store and from the
jobs' own records (each member writes its attempt and the time, every 50 ms, to a file of its job):

- GPUs held by two allocations at once (from each allocation's created_at and released_at);
- attempts of one job alive at once (from the jobs' own timestamps);
- jobs lost (submitted, never stored, or never ended) and jobs not SUCCEEDED (none fails by itself);
- checkpoints going backwards (an attempt resuming from an earlier step than one before it, or a
  recorded checkpoint older than the one before it).

It prints one table: the faults by kind with their recovery p50/p99, the jobs, and every invariant with its
count of violations; ``--json`` and ``--report`` (markdown) keep it. Exit status 1 if any invariant was
violated or a fault did not recover.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table
from sqlalchemy import select
from sqlmodel import col

from benchmarks.ports import free_port
from cli.platform import DevPlatform, wait_for_port
from fairgang.cluster import ClusterConfig
from store.db import Database
from store.models import Allocation, Job, JobEvent

REPO = Path(__file__).resolve().parents[1]
ADMIN = {"Authorization": "Bearer admin-token"}
TENANTS = {"alpha": "alpha-token", "beta": "beta-token"}
LOAD_NODES = ("h1", "h2", "h3")
PROBE_NODE = "p1"
CLUSTER = ClusterConfig.model_validate(
    {
        "admin_tokens": ["admin-token"],
        "node_token": "chaos-node-token",
        "tenants": [
            {
                "name": name,
                "cohort": "chaos",
                "tokens": [token],
                "quotas": {"H100-80GB": {"nominal": 12}, "L40S": {"nominal": 4 if name == "alpha" else 0}},
                "max_gpus_per_job": 8,
                "max_runtime": "1h",
                "checkpoint_prefix": f"/ckpt/{name}",
            }
            for name, token in TENANTS.items()
        ],
        "nodes": [
            *({"id": n, "gpu_type": "H100-80GB", "gpus": 8, "labels": {"leaf": "l1", "spine": "s1"}} for n in LOAD_NODES),
            {"id": PROBE_NODE, "gpu_type": "L40S", "gpus": 4, "labels": {"leaf": "l2", "spine": "s1"}},
        ],
    }
)
#: Each member records its attempt and the time every 50 ms, and at its start the step it resumes from.
TICKER = r"""
import os, re, runpy, sys, threading, time
out = sys.argv[1]
attempt, rank = os.environ["FAIRGANG_ATTEMPT"], os.environ["RANK"]
resume = re.search(r"step-(\d+)", os.environ.get("RESUME_FROM", ""))
with open(out, "a") as f:
    f.write(f"resume {attempt} {rank} {int(resume.group(1)) if resume else 0}\n")
if rank != "0":
    os.environ["CHECKPOINT_DIR"] += f"/rank-{rank}"

def tick():
    with open(out, "a") as f:
        while True:
            f.write(f"alive {attempt} {rank} {time.time():.3f}\n")
            f.flush()
            time.sleep(0.05)

threading.Thread(target=tick, daemon=True).start()
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


PG_BIN = next((p for p in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True) if (p / "postgres").exists()), None)


@dataclass
class Fault:
    kind: str
    part: str
    at: float
    #: Seconds from the fault's end to the recovery; None: not recovered within the bound.
    recovery_s: float | None = None


@dataclass
class Report:
    seconds: float
    seed: int
    store: str
    network_cuts: bool = False
    faults: list[Fault] = field(default_factory=list)
    jobs: dict[str, int] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values()) and all(f.recovery_s is not None for f in self.faults)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def gpu_double_bookings(allocations: Sequence[tuple[str, float, float | None, Sequence[Mapping[str, Any]]]]) -> list[str]:
    """(allocation id, created_at, released_at, members) -> each GPU held by two allocations at one instant (an
    allocation holds its GPUs from its commit to its release; one never released holds them still)."""
    held: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    for alloc_id, created, released, members in allocations:
        for m in members:
            for gpu in m["gpu_indices"]:
                held.setdefault((m["node_id"], int(gpu)), []).append((created, float("inf") if released is None else released, alloc_id))
    found = []
    for (node, gpu), spans in sorted(held.items()):
        spans.sort()
        latest_end, holder = spans[0][1], spans[0][2]
        for start, end, alloc_id in spans[1:]:
            if start < latest_end:
                found.append(f"{node} GPU {gpu}: {holder} and {alloc_id}")
            if end > latest_end:
                latest_end, holder = end, alloc_id
    return found


def attempt_violations(name: str, ticks: str) -> tuple[list[str], list[str]]:
    """From a job's own records (``alive ATTEMPT RANK TIME`` and ``resume ATTEMPT RANK STEP`` lines): the attempts
    alive at once as an earlier one, and attempts resuming from an earlier step than an attempt before them."""
    spans: dict[int, tuple[float, float]] = {}
    resumes: dict[int, int] = {}
    for line in ticks.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "alive":
            attempt, t = int(parts[1]), float(parts[3])
            lo, hi = spans.get(attempt, (t, t))
            spans[attempt] = (min(lo, t), max(hi, t))
        elif len(parts) == 4 and parts[0] == "resume" and parts[2] == "0":
            resumes[int(parts[1])] = int(parts[3])
    overlaps = []
    latest_end, latest = -1.0, 0
    for attempt, (start, end) in sorted(spans.items()):
        if start <= latest_end:
            overlaps.append(f"{name}: attempt {latest} alive until {latest_end:.3f}, attempt {attempt} from {start:.3f}")
        if end > latest_end:
            latest_end, latest = end, attempt
    steps = [resumes[a] for a in sorted(resumes)]
    backwards = [f"{name}: its attempts resumed from steps {steps}"] if steps != sorted(steps) else []
    return overlaps, backwards


def checkpoint_regressions(rows: list[tuple[str, str]]) -> list[str]:
    """(job id, checkpoint path) in the order the store recorded them -> each job whose recorded steps go back."""
    by_job: dict[str, list[int]] = {}
    for job_id, path in rows:
        found = re.search(r"step-(\d+)", path)
        if found and "/rank-" not in path:
            by_job.setdefault(job_id, []).append(int(found.group(1)))
    return [f"{job_id}: recorded checkpoints at steps {steps}" for job_id, steps in sorted(by_job.items()) if steps != sorted(steps)]


class Netns:
    """Network namespaces of the run's own, one per load node, each linked to the host by a veth pair."""

    def __init__(self, pid: int) -> None:
        self.tag = pid % 10000
        self.subnet = 200 + pid % 50
        self.nodes: dict[str, int] = {}

    def name(self, node: str) -> str:
        return f"fgchaos-{self.tag}-{node}"

    def host_if(self, node: str) -> str:
        return f"fg{self.tag}{self.nodes[node]}h"

    def add(self, i: int, node: str) -> str:
        """Make the node's namespace and link; the host end's address (what the agent reaches the API at)."""
        self.nodes[node] = i
        ns, host, peer = self.name(node), self.host_if(node), f"fg{self.tag}{i}n"
        host_ip, ns_ip = f"10.{self.subnet}.{i}.1", f"10.{self.subnet}.{i}.2"
        for cmd in (
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", host, "type", "veth", "peer", "name", peer],
            ["ip", "link", "set", peer, "netns", ns],
            ["ip", "addr", "add", f"{host_ip}/30", "dev", host],
            ["ip", "link", "set", host, "up"],
            ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", peer],
            ["ip", "netns", "exec", ns, "ip", "link", "set", peer, "up"],
            ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
        ):
            subprocess.run(cmd, check=True, capture_output=True)
        return host_ip

    def link(self, node: str, *, up: bool) -> None:
        subprocess.run(["ip", "link", "set", self.host_if(node), "up" if up else "down"], check=True, capture_output=True)

    def remove(self) -> None:
        for node in self.nodes:
            subprocess.run(["ip", "link", "del", self.host_if(node)], capture_output=True)
            subprocess.run(["ip", "netns", "del", self.name(node)], capture_output=True)


class OwnPostgres:
    """A PostgreSQL server of the run's own (the machine's may serve others; this one is killed)."""

    def __init__(self, root: Path, port: int) -> None:
        assert PG_BIN is not None
        self.bin, self.dir, self.port = PG_BIN, root / "pg", port
        self.as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]

    def init(self) -> None:
        self.dir.mkdir()
        shutil.chown(self.dir, "postgres", "postgres")
        self.dir.chmod(0o700)
        cmd = [*self.as_postgres, str(self.bin / "initdb"), "-D", str(self.dir), "-U", "root", "--auth=trust", "--no-sync"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed: {out.stderr or out.stdout}")

    @property
    def argv(self) -> list[str]:
        options = ["-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.dir}", "-c", "max_connections=200"]
        return [*self.as_postgres, str(self.bin / "postgres"), "-D", str(self.dir), "-p", str(self.port), *options]

    @property
    def url(self) -> str:
        return f"postgresql://root@127.0.0.1:{self.port}/postgres"


class Chaos:
    def __init__(self, args: argparse.Namespace, data_dir: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.load_rng = random.Random(args.seed + 1)
        self.data_dir = data_dir
        self.ticks = data_dir / "ticks"
        self.pg = OwnPostgres(data_dir, free_port()) if PG_BIN is not None and os.geteuid() == 0 and not args.sqlite else None
        #: Load nodes' agents in network namespaces of their own (root, and `ip`), so that their links can be cut.
        self.netns = Netns(os.getpid()) if os.geteuid() == 0 and shutil.which("ip") and not args.no_netns else None
        self.platform = DevPlatform(
            CLUSTER,
            data_dir,
            api_port=free_port(),
            temporal_port=free_port(),
            ui_port=free_port(),
            database_url=self.pg.url if self.pg else None,
            listen_host="0.0.0.0" if self.netns else "127.0.0.1",
            extra_env={"FAIRGANG_ISOLATE_MEMBERS": "false"},
        )
        self.api = f"http://127.0.0.1:{self.platform.api_port}"
        self.submitted: dict[str, str] = {}  # job name -> id
        self.deck: list[str] = []
        self.lock = threading.Lock()
        self.loading = threading.Event()
        self.console = Console(stderr=True)

    # ------------------------------------------------------------ the platform

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}", highlight=False)

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o711)  # the store's own user passes through to its directory
        self.ticks.mkdir()
        if self.pg is not None:
            self.pg.init()
            self.platform._spawn("postgres", self.pg.argv)
            wait_for_port("127.0.0.1", self.pg.port)
            time.sleep(1.0)
        self.platform.start(say=self.say)
        if self.netns is not None:
            for i, node in enumerate(LOAD_NODES):
                self.move_agent(i, node)
        self.platform._spawn("scheduler-2", self.platform.argvs["scheduler"])
        self.platform._spawn("worker-2", self.platform.argvs["worker"])
        self.platform.wait_ready("admin-token", timeout=120)
        self.ticks.chmod(0o777)

    def move_agent(self, i: int, node: str) -> None:
        """Start the node's agent again inside a network namespace of its own, reaching the API and Temporal
        through a link of its own (its host end can be taken down: a network cut)."""
        assert self.netns is not None
        host_ip = self.netns.add(i, node)
        name = f"agent-{node}"
        proc = self.platform.procs[name]
        proc.terminate()
        proc.wait(30)
        env = self.platform.part_envs.get(name, {}) | {
            "FAIRGANG_API_URL": f"http://{host_ip}:{self.platform.api_port}",
            "FAIRGANG_TEMPORAL_ADDRESS": f"{host_ip}:{self.platform.temporal_port}",
        }
        self.platform._spawn(name, ["ip", "netns", "exec", self.netns.name(node), *self.platform.argvs[name]], env)

    def supervise_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.platform.supervise(say=self.say)
            time.sleep(0.2)

    def kinds(self, part: str) -> list[str]:
        cut = self.netns is not None and part.removeprefix("agent-") in LOAD_NODES
        return ["kill9", "stop", "restart", *(["cut"] if cut else [])]

    def parts(self) -> list[str]:
        parts = ["api", "scheduler", "scheduler-2", "worker", "worker-2", "temporal", *(f"agent-{n}" for n in (*LOAD_NODES, PROBE_NODE))]
        return [*parts, "postgres"] if self.pg is not None else parts

    # ------------------------------------------------------------ load

    def spec(self, name: str, tenant: str) -> dict[str, Any]:
        steps = self.load_rng.randint(40, 160)
        train = [str(REPO / "examples" / "train_numpy.py"), "--steps", str(steps), "--checkpoint-every", "10", "--step-seconds", "0.1"]
        return {
            "name": name,
            "tenant": tenant,
            "entrypoint": [sys.executable, "-c", TICKER, str(self.ticks / name), *train],
            "gpu_type": "H100-80GB",
            "gpu_count": self.load_rng.choice([1, 2, 4, 8]),
            "max_runtime": "30m",
            "grace_period": "5s",
            "checkpoint_dir": f"/ckpt/{tenant}/{name}",
        }

    def submit(self, spec: dict[str, Any], token: str, bound_s: float = 600) -> str | None:
        """Submit until the platform takes it (a submission is idempotent by name)."""
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            try:
                resp = httpx.post(f"{self.api}/v1/jobs", json=spec, headers={"Authorization": f"Bearer {token}"}, timeout=10)
                if resp.status_code in (200, 201):
                    return str(resp.json()["job"]["id"])
                if resp.status_code < 500 and resp.status_code != 429:
                    raise RuntimeError(f"{spec['name']} refused: {resp.status_code} {resp.text}")
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return None

    def load(self) -> None:
        n = 0
        while self.loading.is_set():
            n += 1
            tenant = "alpha" if n % 2 else "beta"
            spec = self.spec(f"load-{n:04d}", tenant)
            job_id = self.submit(spec, TENANTS[tenant])
            with self.lock:
                self.submitted[spec["name"]] = job_id or ""
            time.sleep(self.args.every)

    # ------------------------------------------------------------ faults

    def inject(self, kind: str, part: str) -> None:
        proc = self.platform.procs[part]
        if kind == "kill9":
            if part == "postgres":  # the server and its backends, as a crash of its machine or container
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait()
        elif kind == "restart":
            # PostgreSQL's SIGTERM waits for every session to end (pooled ones never do): its fast shutdown is SIGINT.
            proc.send_signal(signal.SIGINT if part == "postgres" else signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        elif kind == "cut":
            assert self.netns is not None
            node = part.removeprefix("agent-")
            self.netns.link(node, up=False)
            try:
                # Sometimes past the lease and the lost-node timeout: the node is declared LOST, its members fence.
                self.supervise_for(self.rng.uniform(5, 45))
            finally:
                self.netns.link(node, up=True)
        else:
            target = os.getpgid(proc.pid) if part == "postgres" else proc.pid
            send = os.killpg if part == "postgres" else os.kill
            send(target, signal.SIGSTOP)
            try:
                self.supervise_for(self.rng.uniform(3, 10))
            finally:
                send(target, signal.SIGCONT)

    def recovered(self, part: str, since: float, probe: str) -> bool:
        if part.startswith("agent-"):
            node_id = part.removeprefix("agent-")
            try:
                fleet = httpx.get(f"{self.api}/v1/fleet", headers=ADMIN, timeout=5).json()
            except (httpx.HTTPError, ValueError):
                return False
            node = next((n for n in fleet.get("nodes", []) if n["id"] == node_id), None)
            return node is not None and node["schedulable"] and (node["last_heartbeat"] or 0) > since
        try:
            job = httpx.get(f"{self.api}/v1/jobs/{probe}", headers=ADMIN, timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return False
        return job.get("state") in ("RUNNING", "SUCCEEDED")

    def fault(self, n: int) -> Fault:
        # Every part in turn, in a shuffled order (shuffled again each round), each with a fault of a random kind.
        if not self.deck:
            self.deck = self.parts()
            self.rng.shuffle(self.deck)
        part = self.deck.pop()
        kind = self.rng.choice(self.kinds(part))
        self.say(f"fault {n}: {kind} {part}")
        fault = Fault(kind, part, time.time())
        self.inject(kind, part)
        ended = time.time()
        probe_spec: dict[str, Any] = {
            "name": f"probe-{n:03d}",
            "tenant": "alpha",
            "entrypoint": [sys.executable, "-c", "import time; time.sleep(1)"],
            "gpu_type": "L40S",
            "gpu_count": 1,
            "max_runtime": "10m",
            "checkpoint_dir": f"/ckpt/alpha/probe-{n:03d}",
        }
        probe = ""
        deadline = time.monotonic() + self.args.recovery_bound
        while time.monotonic() < deadline:
            self.platform.supervise(say=self.say)
            if not probe and not part.startswith("agent-"):
                probe = self.submit(probe_spec, TENANTS["alpha"], bound_s=1) or ""
                if probe:
                    with self.lock:
                        self.submitted[probe_spec["name"]] = probe
            if (probe or part.startswith("agent-")) and self.recovered(part, ended, probe):
                fault.recovery_s = time.time() - ended
                break
            time.sleep(0.2)
        self.say(f"  recovered in {fault.recovery_s:.1f} s" if fault.recovery_s is not None else "  NOT recovered")
        return fault

    # ------------------------------------------------------------ the run

    def run(self) -> Report:
        store = "postgres (own server)" if self.pg else "sqlite"
        report = Report(seconds=self.args.minutes * 60, seed=self.args.seed, store=store, network_cuts=self.netns is not None)
        self.loading.set()
        loader = threading.Thread(target=self.load, daemon=True)
        loader.start()
        end = time.monotonic() + self.args.minutes * 60
        self.supervise_for(10)
        n = 0
        while time.monotonic() < end:
            n += 1
            report.faults.append(self.fault(n))
            self.supervise_for(self.rng.uniform(2, 6))
        self.loading.clear()
        loader.join(timeout=700)
        self.say(f"faults over; waiting for {len(self.submitted)} jobs to end")
        self.drain()
        asyncio.run(self.audit(report))
        return report

    def drain(self) -> None:
        deadline = time.monotonic() + self.args.drain_bound
        while time.monotonic() < deadline:
            self.platform.supervise(say=self.say)
            try:
                jobs = httpx.get(f"{self.api}/v1/jobs", params={"limit": 1000}, headers=ADMIN, timeout=10).json()
                ids = {j["id"] for j in jobs if j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")}
                if set(self.submitted.values()) <= ids:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1)

    async def audit(self, report: Report) -> None:
        db = Database(self.platform.settings.database_url)
        try:
            async with db.sessions() as session:
                jobs = {j.id: j for j in (await session.execute(select(Job))).scalars()}
                allocations = list((await session.execute(select(Allocation))).scalars())
                checkpoints = (
                    await session.execute(
                        select(col(JobEvent.job_id), col(JobEvent.message))
                        .where(col(JobEvent.kind) == "CHECKPOINT")
                        .order_by(col(JobEvent.id))
                    )
                ).all()
        finally:
            await db.dispose()
        v: dict[str, list[str]] = {
            "GPU held by two allocations at once": [],
            "two attempts of a job alive at once": [],
            "job lost (not stored, or never ended)": [],
            "job not SUCCEEDED (failed for the platform's faults)": [],
            "checkpoint going backwards": [],
        }
        for name, job_id in sorted(self.submitted.items()):
            job = jobs.get(job_id)
            if job is None or job.state not in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"):
                v["job lost (not stored, or never ended)"].append(
                    f"{name} ({job_id or 'never accepted'}: {job.state if job else 'absent'})"
                )
            elif job.state != "SUCCEEDED":
                v["job not SUCCEEDED (failed for the platform's faults)"].append(f"{name}: {job.state} {job.end_reason}")
        held = [(a.id, a.created_at, a.released_at, a.members) for a in allocations]
        v["GPU held by two allocations at once"] = gpu_double_bookings(held)
        for path in sorted(self.ticks.iterdir()):
            overlaps, backwards = attempt_violations(path.name, path.read_text(errors="replace"))
            v["two attempts of a job alive at once"] += overlaps
            v["checkpoint going backwards"] += backwards
        v["checkpoint going backwards"] += checkpoint_regressions([(job_id, message or "") for job_id, message in checkpoints])
        load = [jobs[i] for n, i in self.submitted.items() if n.startswith("load-") and i in jobs]
        report.jobs = {
            "submitted": len([n for n in self.submitted if n.startswith("load-")]),
            "probes": len([n for n in self.submitted if n.startswith("probe-")]),
            "succeeded": sum(j.state == "SUCCEEDED" for j in load),
            "attempts": sum(j.attempt for j in load),
            "requeued": sum(j.attempt > 1 for j in load),
            "allocations": len(allocations),
        }
        report.violations = v


def render(report: Report) -> tuple[Table, str]:
    """The report as a rich table and as markdown."""
    cuts = "agents in network namespaces" if report.network_cuts else "no network cuts"
    title = f"chaos run: {report.seconds / 60:.0f} min, seed {report.seed}, store {report.store}, {cuts}"
    table = Table(title=title)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_column("recovery p50 / p99 (s)", justify="right")
    md = [title[0].upper() + title[1:] + ".", ""]
    md += ["| fault | count | recovery p50 / p99 (s) |", "|---|---:|---:|"]
    kinds = Counter(f"{f.kind} {f.part}" for f in report.faults)
    for key in sorted(kinds):
        times = [f.recovery_s for f in report.faults if f"{f.kind} {f.part}" == key and f.recovery_s is not None]
        missing = kinds[key] - len(times)
        rec = f"{percentile(times, 0.5):.1f} / {percentile(times, 0.99):.1f}" if times else "-"
        rec += f" ({missing} not recovered)" if missing else ""
        table.add_row(f"fault: {key}", str(kinds[key]), rec)
        md.append(f"| {key} | {kinds[key]} | {rec} |")
    for kind in ("kill9", "stop", "restart", "cut"):
        times = [f.recovery_s for f in report.faults if f.kind == kind and f.recovery_s is not None]
        if times:
            rec = f"{percentile(times, 0.5):.1f} / {percentile(times, 0.99):.1f}"
            table.add_row(f"all {kind}", str(len(times)), rec)
            md.append(f"| all {kind} | {len(times)} | {rec} |")
    md += ["", "| jobs | count |", "|---|---:|"]
    for key, value in report.jobs.items():
        table.add_row(f"jobs {key}", str(value), "")
        md.append(f"| {key} | {value} |")
    md += ["", "| invariant | violations |", "|---|---:|"]
    for name, found in report.violations.items():
        table.add_row(f"violations: {name}", str(len(found)), "")
        md.append(f"| {name} | {len(found)} |")
    for name, found in report.violations.items():
        for item in found[:20]:
            md.append(f"- {name}: {item}")
    return table, "\n".join(md) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long faults are injected")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=float, default=3.0, help="seconds between load submissions")
    parser.add_argument("--recovery-bound", type=float, default=180.0, help="seconds a fault may take to recover")
    parser.add_argument("--drain-bound", type=float, default=600.0, help="seconds the jobs may take to end afterwards")
    parser.add_argument("--sqlite", action="store_true", help="the SQLite store even where PostgreSQL could run")
    parser.add_argument("--no-netns", action="store_true", help="agents on the host's network (no network cuts)")
    parser.add_argument("--json", type=Path, help="write the report as JSON here")
    parser.add_argument("--report", type=Path, help="write the report as markdown here")
    parser.add_argument("--keep", action="store_true", help="keep the data dir (logs, store) afterwards")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="fairgang-chaos-", dir="/tmp"))
    chaos = Chaos(args, data_dir)
    try:
        chaos.start()
        report = chaos.run()
    finally:
        chaos.platform.stop()
        if chaos.netns is not None:
            chaos.netns.remove()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
        else:
            chaos.say(f"data dir kept: {data_dir}")
    table, md = render(report)
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(asdict(report) | {"ok": report.ok}, indent=1))
    if args.report:
        args.report.write_text(md)
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
