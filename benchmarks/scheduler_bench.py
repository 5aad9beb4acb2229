"""Scheduler core benchmark: full cycle time and free-to-bind latency.

Builds the SPEC fleet (750 nodes, 5,000 GPUs of four types, 8 GPUs per node for the big
types, leaves of 16-32 nodes under spines of 4 leaves), 50 tenants in 5 cohorts with
quotas, the fleet about 80% busy with running jobs, and 2,000 pending jobs of mixed
sizes; then at 4x and 16x that (nodes, tenants, running and pending jobs all scaled).
Quotas: each tenant's nominal is 1/50 of each GPU type, 10 tenants per cohort, two in three
may borrow without limit (the others up to 64 GPUs).

Two measurements per scale and mode, on one core, timing only the cycle (``Scheduler.run_cycle``, the
placement service's long-lived scheduler, or a one-shot ``run_cycle``):

- full cycle: a rolling run; between cycles virtual time moves 30 s, due jobs end,
  bindings become running jobs and arrivals refill the queue to its size;
- free-to-bind: from a busy state, every job on one node ends; the time of the one
  cycle that follows, and whether it bound the freed node (or held it for a reservation
  or nomination instead: EASY keeps freed nodes for the head job when nothing that ends
  in time can use them, and quotas may leave them idle).

Run: ``.venv/bin/python benchmarks/scheduler_bench.py`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from dataclasses import dataclass, replace

from rich.console import Console
from rich.table import Table

from scheduler.core import (
    Member,
    NodeView,
    PendingJob,
    Quota,
    Reservation,
    RunningJob,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    TenantView,
    run_cycle,
)

#: (GPU type, nodes at 1x, GPUs per node): 750 nodes, 5,000 GPUs.
FLEET = (("H100-80GB", 225, 8), ("A100-80GB", 150, 8), ("A100-40GB", 125, 8), ("L40S", 250, 4))
SIZES = ((1, 30), (2, 15), (4, 20), (8, 20), (16, 7), (32, 5), (64, 3))
RUNTIMES = (900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 48 * 3600.0)


@dataclass
class World:
    """The fleet and its jobs, mutable between cycles (the benchmark's stand-in for the store)."""

    nodes: dict[str, NodeView]
    free: dict[str, set[int]]
    running: dict[str, RunningJob]
    pending: dict[str, PendingJob]
    tenants: tuple[TenantView, ...]
    reservations: tuple[Reservation, ...] = ()
    now: float = 1_000_000.0
    serial: int = 0

    def snapshot(self) -> Snapshot:
        nodes = tuple(replace(view, free=frozenset(self.free[node_id])) for node_id, view in self.nodes.items())
        return Snapshot(
            nodes=nodes,
            pending=tuple(self.pending.values()),
            tenants=self.tenants,
            running=tuple(self.running.values()),
            config=SchedulerConfig(),
            reservations=self.reservations,
        )


def build_world(scale: int, seed: int, pending: int = 2000) -> World:
    rng = random.Random(seed)
    nodes: dict[str, NodeView] = {}
    leaf = spine = 0
    for gpu_type, count, per_node in FLEET:
        left = count * scale
        while left > 0:
            size = min(left, rng.randint(16, 32))
            for _ in range(size):
                node_id = f"n{len(nodes):06d}"
                labels = (("leaf", f"leaf{leaf:04d}"), ("spine", f"spine{spine:03d}"))
                nodes[node_id] = NodeView(id=node_id, gpu_type=gpu_type, gpu_count=per_node, labels=labels, free=frozenset())
            left -= size
            leaf += 1
            if leaf % 4 == 0:
                spine += 1
        spine += 1
    tenants = []
    capacity = {t: c * scale * p for t, c, p in FLEET}
    count = 50 * scale
    for i in range(count):
        quotas = tuple(
            (gpu_type, Quota(nominal=capacity[gpu_type] // count, borrow_limit=None if i % 3 else 64, lend_limit=None))
            for gpu_type in sorted(capacity)
        )
        decayed = tuple((t, rng.uniform(0, 3600.0 * 24 * 8)) for t in sorted(capacity))
        tenants.append(
            TenantView(
                name=f"t{i:04d}",
                weight=float(rng.choice((1, 1, 2, 3))),
                cohort=f"c{i % (5 * scale)}",
                quotas=quotas,
                decayed_usage=decayed,
            )
        )
    world = World(nodes=nodes, free={n: set(range(v.gpu_count)) for n, v in nodes.items()}, running={}, pending={}, tenants=tuple(tenants))
    _fill_running(world, rng, target=0.8)
    _refill(world, rng, pending * scale)
    return world


def _new_job(world: World, rng: random.Random) -> PendingJob:
    world.serial += 1
    gpu_type, _, per_node = rng.choice(FLEET)
    size = rng.choices([s for s, _ in SIZES], weights=[w for _, w in SIZES])[0]
    if per_node < 8 and size > per_node:
        size = per_node * rng.choice((1, 2, 4))
    level = "leaf" if size > per_node and rng.random() < 0.7 else "any"
    queued = world.now - rng.uniform(0, 6 * 3600)
    return PendingJob(
        id=f"j{world.serial:07d}",
        tenant=rng.choice(world.tenants).name,
        attempt=1,
        gpu_type=gpu_type,
        gpu_count=size,
        priority=rng.choice((0, 100, 100, 100, 200)),
        queued_at=queued,
        topology_level=level,
        topology_required=rng.random() < 0.8,
        max_runtime_s=rng.choice(RUNTIMES),
        preemptible=rng.random() < 0.8,
        submitted_at=queued,
    )


def _fill_running(world: World, rng: random.Random, target: float) -> None:
    """Start single-node jobs on random nodes until ``target`` of the GPUs are busy."""
    total = sum(v.gpu_count for v in world.nodes.values())
    busy = 0
    ids = sorted(world.nodes)
    while busy < target * total:
        node_id = rng.choice(ids)
        free = sorted(world.free[node_id])
        if not free:
            continue
        take = min(len(free), rng.choice((1, 2, 4, 8)))
        job = _new_job(world, rng)
        started = world.now - rng.uniform(0, 3600.0 * 6)
        running = RunningJob(
            id=job.id,
            tenant=job.tenant,
            attempt=1,
            gpu_type=world.nodes[node_id].gpu_type,
            gpu_count=take,
            priority=job.priority,
            members=(Member(node_id=node_id, gpu_indices=tuple(free[:take]), rank=0),),
            started_at=started,
            expected_end=started + rng.choice(RUNTIMES[1:]),
            last_checkpoint_at=started + rng.uniform(0, 1800) if rng.random() < 0.7 else None,
            preemptible=job.preemptible,
        )
        _start(world, running)
        busy += take


def _start(world: World, job: RunningJob) -> None:
    for member in job.members:
        world.free[member.node_id].difference_update(member.gpu_indices)
    world.running[job.id] = job


def _end(world: World, job_id: str) -> None:
    job = world.running.pop(job_id)
    for member in job.members:
        world.free[member.node_id].update(member.gpu_indices)


def _refill(world: World, rng: random.Random, size: int) -> None:
    while len(world.pending) < size:
        job = _new_job(world, rng)
        world.pending[job.id] = job


def _apply(world: World, snapshot: Snapshot, decisions: object) -> None:
    from scheduler.core import Decisions

    assert isinstance(decisions, Decisions)
    by_id = {p.id: p for p in snapshot.pending}
    for bind in decisions.binds:
        job = by_id[bind.job_id]
        world.pending.pop(job.id)
        _start(world, RunningJob.started(job, bind.members, world.now))
    for preempt in decisions.preemptions:
        if preempt.job_id in world.running:
            _end(world, preempt.job_id)
    world.reservations = decisions.reservations


def _timed_cycle(scheduler: Scheduler | None, snapshot: Snapshot, now: float) -> tuple[float, object]:
    """One cycle: the service's long-lived ``Scheduler``, or a one-shot ``run_cycle`` (None)."""
    gc.collect()
    start = time.perf_counter()
    decisions = run_cycle(snapshot, now) if scheduler is None else scheduler.run_cycle(snapshot, now)
    return time.perf_counter() - start, decisions


def bench_scale(scale: int, cycles: int, frees: int, seed: int, one_shot: bool = False) -> dict[str, float]:
    rng = random.Random(seed + 1)
    world = build_world(scale, seed)
    scheduler = None if one_shot else Scheduler()
    size = len(world.pending)
    times = []
    # The first cycle builds the workspace from nothing (in the service: once, when it starts or takes
    # the lease); it is reported on its own and not counted in the percentiles.
    first = 0.0
    for index in range(cycles + 1):
        world.now += 30.0
        for job_id in [j for j, r in sorted(world.running.items()) if r.expected_end <= world.now or rng.random() < 0.01]:
            _end(world, job_id)
        _refill(world, rng, size)
        snapshot = world.snapshot()
        elapsed, decisions = _timed_cycle(scheduler, snapshot, world.now)
        if index == 0:
            first = elapsed
        else:
            times.append(elapsed)
        _apply(world, snapshot, decisions)
    latencies, bound, reserved = [], 0, 0
    for _ in range(frees):
        world.now += 1.0
        busy = sorted({m.node_id for r in world.running.values() for m in r.members if r.gpu_type != "L40S"})
        node_id = rng.choice(busy)
        for job_id in sorted(j for j, r in world.running.items() if any(m.node_id == node_id for m in r.members)):
            _end(world, job_id)
        snapshot = world.snapshot()
        elapsed, decisions = _timed_cycle(scheduler, snapshot, world.now)
        latencies.append(elapsed)
        from scheduler.core import Decisions

        assert isinstance(decisions, Decisions)
        was_bound = any(m.node_id == node_id for b in decisions.binds for m in b.members)
        bound += was_bound
        reserved += not was_bound and any(node_id in r.node_ids for r in decisions.reservations)
        _apply(world, snapshot, decisions)
    return {
        "nodes": len(world.nodes),
        "gpus": sum(v.gpu_count for v in world.nodes.values()),
        "tenants": len(world.tenants),
        "pending": size,
        "running": len(world.running),
        "first": first * 1000,
        "p50": statistics.median(times) * 1000,
        "p99": _pct(times, 0.99) * 1000,
        "max": max(times) * 1000,
        "free_p50": statistics.median(latencies) * 1000,
        "free_max": max(latencies) * 1000,
        "freed_bound": bound / max(1, frees),
        "freed_reserved": reserved / max(1, frees),
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", default="1,4,16", help="comma-separated multiples of the SPEC fleet")
    parser.add_argument("--cycles", type=int, default=60, help="full cycles at 1x (fewer at larger scales)")
    parser.add_argument("--frees", type=int, default=20, help="node-free events at 1x (fewer at larger scales)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--modes",
        default="scheduler,one-shot",
        help="scheduler: one long-lived Scheduler across the cycles (the placement service); one-shot: run_cycle afresh each cycle",
    )
    args = parser.parse_args()
    table = Table(title="scheduler core: one cycle on one core (ms)")
    for column in ("mode", "scale", "nodes", "GPUs", "tenants", "pending", "running", "first cycle", "cycle p50", "cycle p99", "cycle max"):
        table.add_column(column, justify="right")
    for column in ("free→bind p50", "free→bind max", "freed node bound", "… or reserved"):
        table.add_column(column, justify="right")
    modes = [m.strip() for m in args.modes.split(",")]
    unknown = [m for m in modes if m not in ("scheduler", "one-shot")]
    if unknown:
        parser.error(f"--modes: {', '.join(unknown)} is not one of scheduler, one-shot")
    for mode, scale in ((m, int(s)) for m in modes for s in args.scales.split(",")):
        cycles = max(5, args.cycles // scale)
        frees = max(3, args.frees // scale)
        r = bench_scale(scale, cycles, frees, args.seed, one_shot=mode == "one-shot")
        table.add_row(
            mode,
            f"{scale}x",
            f"{r['nodes']:,}",
            f"{r['gpus']:,}",
            f"{r['tenants']:,}",
            f"{r['pending']:,}",
            f"{r['running']:,}",
            f"{r['first']:.1f}",
            f"{r['p50']:.1f}",
            f"{r['p99']:.1f}",
            f"{r['max']:.1f}",
            f"{r['free_p50']:.1f}",
            f"{r['free_max']:.1f}",
            f"{r['freed_bound']:.0%}",
            f"{r['freed_reserved']:.0%}",
        )
        Console().print(f"{mode} {scale}x done: {cycles} cycles, {frees} node frees")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
