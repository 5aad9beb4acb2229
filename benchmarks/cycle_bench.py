"""One placement cycle on a full-scale store, without Temporal: snapshot, core, commit (CPU and wall time).

Runs the placement service's own cycle (``PlacementService.cycle``: lease, lost nodes, snapshot,
core, fenced commit, reconcile) on a store built by ``benchmarks/scale_store.py``, with a stand-in
for the Temporal client that accepts every signal (so Temporal's share is left out: the live
benchmark, ``benchmarks/live_bench.py``, has it). Between cycles nothing changes except time, as on
a quiet tick; ``--churn N`` ends N running jobs and queues N new ones between cycles (what a busy
minute at 500 submissions an hour does, and more). Nodes are kept fresh by touching their heartbeats.

Prints one table: per phase (snapshot, core, commit) and for the whole cycle, p50 and p99 of wall
time, and the process's CPU seconds per cycle (``time.process_time``; these machines' two cores are
shared, so wall time alone misleads). The first cycle (which reads every job's spec once and builds
the usage ledger if the store has none) is shown on its own.

    .venv/bin/python -m benchmarks.cycle_bench --url sqlite:////tmp/scale/fairgang.db --cycles 20
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import text

from fairgang import metrics
from fairgang.settings import Settings
from fairgang.spec import JobState
from scheduler.service import PlacementService
from store import jobs
from store import tenants as stored_tenants
from store.db import Database
from tests.builders import job_spec


class _Signals:
    """Accepts every workflow signal (the cycle signals bindings and preemptions after its commit)."""

    def get_workflow_handle(self, workflow_id: str) -> Any:
        return self

    async def signal(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def execute_update(self, *args: Any, **kwargs: Any) -> Any:
        return None

    async def start_workflow(self, *args: Any, **kwargs: Any) -> Any:
        return None


def _phase_totals() -> dict[str, float]:
    out: dict[str, float] = {}
    for metric in metrics.SCHEDULING_PHASE.collect():
        for sample in metric.samples:
            if sample.name.endswith("_sum"):
                out[sample.labels["phase"]] = sample.value
    return out


async def _churn(db: Database, n: int, serial: int, now: float) -> None:
    running = [j for j in await jobs.list_jobs(db, state=JobState.RUNNING.value, limit=5 * n) if j.attempt == 1][:n]
    for job in running:
        await jobs.record_transition(db, job_id=job.id, attempt=job.attempt, state=JobState.SUCCEEDED, event_key="bench-end", now=now)
    tenants = [t.name for t in await stored_tenants.list_tenants(db)]
    for i in range(n):
        spec = job_spec(name=f"bench-{serial}-{i}", gpu_type=random.choice(["H100-80GB", "A100-80GB", "L40S"]), gpu_count=1)
        job, _ = await jobs.create_job(db, spec=spec, tenant=random.choice(tenants), now=now)
        await jobs.mark_queued(db, job_id=job.id, attempt=1, now=now)


async def run(url: str, cycles: int, churn: int) -> None:
    db = Database(url)
    settings = Settings(database_url=url)
    service = PlacementService(settings, db, _Signals(), holder="bench")  # type: ignore[arg-type]
    rows: list[dict[str, float]] = []
    for i in range(cycles):
        now = time.time()
        async with db.transaction() as session:
            await session.execute(text("UPDATE node SET last_heartbeat = :now"), {"now": now})
        if churn and i:
            await _churn(db, churn, i, now)
        before = _phase_totals()
        cpu, wall = time.process_time(), time.perf_counter()
        report = await service.cycle(now)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = _phase_totals()
        rows.append({"cycle": wall, "cpu": cpu, "bound": report.bound} | {k: after[k] - before.get(k, 0.0) for k in after})
    await db.dispose()
    table = Table(title=f"Placement cycle on {url.split('://')[0]} (no Temporal: signals accepted by a stand-in), churn {churn}/cycle")
    for column in ("", "first cycle", "p50 (later)", "p99 (later)", "CPU s/cycle (later, mean)"):
        table.add_column(column)
    later = rows[1:] or rows
    for key in ("snapshot", "core", "commit", "cycle"):
        values = sorted(r.get(key, 0.0) for r in later)
        p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
        first, p50 = rows[0].get(key, 0.0), statistics.median(values)
        table.add_row(key, f"{first * 1000:.1f} ms", f"{p50 * 1000:.1f} ms", f"{p99 * 1000:.1f} ms", "")
    table.add_row("process CPU", f"{rows[0]['cpu']:.3f} s", "", "", f"{statistics.mean(r['cpu'] for r in later):.3f} s")
    table.add_row("bound", f"{rows[0]['bound']:.0f}", "", "", f"{statistics.mean(r['bound'] for r in later):.1f}")
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="DATABASE_URL of a store built by benchmarks/scale_store.py")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--churn", type=int, default=0, help="running jobs ended and new jobs queued between cycles")
    args = parser.parse_args()
    asyncio.run(run(args.url, args.cycles, args.churn))


if __name__ == "__main__":
    main()
