"""Workloads: the Philly trace with documented seeded rules, a synthetic generator, and CSV files.

Rules that turn a Philly row into a job (all draws from one ``random.Random(seed)``, in
trace order, so a seed gives the same workload every time):

- tenant: ``vc-<vc id>``; the tenant's weight is its share of the trace's GPU-hours
  (scaled so the mean weight is 1), as Philly's VCs were sized to their teams.
- GPU count: as recorded; a multi-node count that is not a multiple of 8 (12) is rounded
  up to whole 8-GPU nodes (16), because multi-node gangs take whole nodes.
- duration: as recorded, at least 60 s and at most 48 h (the SPEC's largest runtime; a
  longer Philly job is modelled as stopping at its limit). This keeps about half of the
  trace's GPU-hours.
- GPU type: drawn with probability proportional to each type's GPU capacity in the fleet,
  among the types whose nodes can hold the gang (a count up to the node size, or a multiple
  of it).
- priority: 10 % high (200, not preemptible), 70 % normal (100), 20 % low (0).
- checkpoint interval: none for jobs under 30 min, otherwise 15, 30 or 60 min (equally likely).
- max runtime (the user's limit): the smallest of 1, 2, 4, 8, 12, 24, 48 h at least the
  duration times a factor drawn uniformly from [1, 2] (users overestimate).
- time compression: every submit time is divided by one factor, chosen so that the offered
  load (GPU-seconds demanded over fleet GPUs x the submission span) equals the target.
- more jobs than the trace holds: the trace is repeated, each copy after the previous one.

Elastic jobs (:func:`make_elastic`, ``fairgang sim --elastic-share S``): a seeded share S of
the multi-GPU jobs becomes elastic, with the recorded count as its maximum and half of it as
its minimum (rounded up to whole nodes once the maximum spans nodes). The recorded duration
is the run time at the maximum; at g GPUs the job runs at ``(g / max) ** 0.8`` of that
speed (sub-linear, as Pollux measures for data-parallel training), and its limit grows by the
same factor at its minimum.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from scheduler.core.types import Quota
from simulator.fleet import Fleet, TenantSpec

HOUR = 3600.0
PRIORITY_HIGH, PRIORITY_NORMAL, PRIORITY_LOW = 200, 100, 0
LIMITS_H = (1, 2, 4, 8, 12, 24, 48)
MAX_DURATION_S = 48 * HOUR


@dataclass(frozen=True, slots=True)
class SimJob:
    """One submitted job, with what the simulator knows and the scheduler may not (its duration)."""

    id: str
    tenant: str
    submit_s: float
    gpu_type: str
    gpu_count: int
    #: True run time of the work (excluding restarts).
    duration_s: float
    #: The user's limit (what the scheduler sees unless a policy gets oracle durations).
    max_runtime_s: float
    priority: int = PRIORITY_NORMAL
    preemptible: bool = True
    #: Useful work between checkpoints; ``math.inf``: the job never checkpoints.
    checkpoint_interval_s: float = math.inf
    #: "node" for single-node gangs, "leaf" for multi-node ones.
    topology_level: str = "node"
    #: An elastic job's most GPUs (``gpu_count`` is then its minimum, and ``duration_s`` its run time at
    #: this size); None: a fixed job.
    gpu_max: int | None = None

    @property
    def elastic(self) -> bool:
        return self.gpu_max is not None and self.gpu_max > self.gpu_count


#: Speed of an elastic job at g GPUs relative to its maximum m: ``(g / m) ** SPEEDUP_EXPONENT``.
SPEEDUP_EXPONENT = 0.8


def speed(gpus: int, gpu_max: int, exponent: float = SPEEDUP_EXPONENT) -> float:
    """The share of its full speed that an elastic job (at most ``gpu_max`` GPUs) runs at on ``gpus``."""
    return 1.0 if gpus >= gpu_max else (gpus / gpu_max) ** exponent


@dataclass(frozen=True)
class Workload:
    """Jobs sorted by submit time, and the tenants' weights (entitlements)."""

    name: str
    jobs: tuple[SimJob, ...]
    tenants: tuple[TenantSpec, ...]

    def gpu_seconds(self) -> float:
        """GPU-seconds of work (an elastic job's at its maximum)."""
        return sum((j.gpu_max or j.gpu_count) * j.duration_s for j in self.jobs)


def offered_load(workload: Workload, fleet_gpus: int) -> float:
    """GPU-seconds demanded over fleet GPU-seconds across the submission span."""
    if not workload.jobs:
        return 0.0
    span = max(workload.jobs[-1].submit_s - workload.jobs[0].submit_s, 1.0)
    return workload.gpu_seconds() / (fleet_gpus * span)


def type_loads(workload: Workload, capacity: dict[str, int], window_s: float = 24 * 3600.0) -> dict[str, tuple[float, float]]:
    """Per GPU type of ``capacity``: its offered load over the submission span (GPU-seconds submitted for the type
    over its GPU-seconds), and that of its busiest ``window_s`` (the most GPU-seconds submitted within any window of
    that length, over the type's GPU-seconds in it). A type above 1 for a window builds a backlog that no order of
    the queue avoids: the jobs that arrive in it wait for it to drain, and a policy decides only whose jobs wait longest."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, got {window_s}")
    out: dict[str, tuple[float, float]] = {}
    span = max(workload.jobs[-1].submit_s - workload.jobs[0].submit_s, 1.0) if workload.jobs else 1.0
    for gpu_type, gpus in sorted(capacity.items()):
        if gpus <= 0:
            continue
        jobs = [(j.submit_s, (j.gpu_max or j.gpu_count) * j.duration_s) for j in workload.jobs if j.gpu_type == gpu_type]
        total = busiest = window = 0.0
        first = 0
        for submit_s, gpu_s in jobs:  # jobs are sorted by submit time: a sliding window over them
            total += gpu_s
            window += gpu_s
            while jobs[first][0] <= submit_s - window_s:
                window -= jobs[first][1]
                first += 1
            busiest = max(busiest, window)
        out[gpu_type] = (total / (gpus * span), busiest / (gpus * min(window_s, span)))
    return out


def compress_to_load(workload: Workload, fleet_gpus: int, load: float) -> Workload:
    """Scale submit times by one factor so the offered load is ``load``."""
    current = offered_load(workload, fleet_gpus)
    if current <= 0 or load <= 0:
        return workload
    factor = current / load
    start = workload.jobs[0].submit_s
    jobs = tuple(replace(j, submit_s=(j.submit_s - start) * factor) for j in workload.jobs)
    return replace(workload, jobs=jobs)


def make_elastic(workload: Workload, fleet: Fleet, share: float, *, seed: int = 0) -> Workload:
    """A seeded ``share`` of the multi-GPU jobs made elastic: maximum = the recorded count, minimum = half of it.

    The minimum is rounded up to whole nodes when the maximum spans several nodes (the step of a
    multi-node elastic job is one node); a job whose half would not be below its maximum stays fixed.
    Its user limit is stretched by the slowdown at its minimum. Other draws are untouched: the same
    seed gives the same workload with and without elastic jobs.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"elastic share must be within [0, 1], got {share}")
    if share == 0.0:
        return workload
    rng = random.Random(f"elastic-{seed}")
    sizes = fleet.node_size()
    jobs = []
    for j in workload.jobs:
        draw = rng.random()
        if j.gpu_count < 2 or draw >= share:
            jobs.append(j)
            continue
        size = sizes.get(j.gpu_type, j.gpu_count)
        low = math.ceil(j.gpu_count / 2)
        if j.gpu_count > size:
            low = math.ceil(low / size) * size
        if low >= j.gpu_count:
            jobs.append(j)
            continue
        slow = speed(low, j.gpu_count)
        jobs.append(replace(j, gpu_count=low, gpu_max=j.gpu_count, max_runtime_s=j.max_runtime_s / slow))
    return replace(workload, jobs=tuple(jobs))


def _limit_for(duration_s: float, factor: float) -> float:
    want = duration_s * factor
    for hours in LIMITS_H:
        if hours * HOUR >= want:
            return max(hours * HOUR, duration_s)
    return max(LIMITS_H[-1] * HOUR, duration_s)


class _Eligible:
    """GPU types (with their capacity as the weight) whose nodes can hold a gang of a given size."""

    def __init__(self, fleet: Fleet) -> None:
        self.caps, self.sizes = fleet.capacity(), fleet.node_size()
        self.memo: dict[int, list[tuple[str, int]]] = {}

    def __call__(self, count: int) -> list[tuple[str, int]]:
        if count not in self.memo:
            self.memo[count] = [(t, c) for t, c in self.caps.items() if count <= self.sizes[t] or count % self.sizes[t] == 0]
        return self.memo[count]


def _pick_type(rng: random.Random, choices: Sequence[tuple[str, int]]) -> str:
    total = sum(w for _, w in choices)
    x = rng.random() * total
    for name, weight in choices:
        x -= weight
        if x < 0:
            return name
    return choices[-1][0]


def _favourite_types(names: Sequence[str], weights: dict[str, float], caps: Sequence[tuple[str, int]]) -> dict[str, str]:
    """Each team's preferred GPU type: heaviest team first, to the type whose preferring teams weigh
    least for its capacity (ties: the larger type, then its name)."""
    held = {t: 0.0 for t, _ in caps}
    cap = dict(caps)
    out = {}
    for name in sorted(names, key=lambda n: (-weights[n], n)):
        best = min(cap, key=lambda t: ((held[t] + weights[name]) / cap[t], -cap[t], t))
        out[name] = best
        held[best] += weights[name]
    return out


def _checkpoint_interval(rng: random.Random, duration_s: float) -> float:
    if duration_s < 1800:
        return math.inf
    return rng.choice((900.0, 1800.0, 3600.0))


def _priority(rng: random.Random) -> tuple[int, bool]:
    x = rng.random()
    if x < 0.10:
        return PRIORITY_HIGH, False
    if x < 0.80:
        return PRIORITY_NORMAL, True
    return PRIORITY_LOW, True


def read_philly_rows() -> list[dict[str, str]]:
    """Every row of the bundled Philly trace, in (submit time, VC, index) order."""
    rows: list[dict[str, str]] = []
    folder = resources.files("simulator") / "data" / "philly"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".csv.gz"):
            text = gzip.decompress(entry.read_bytes()).decode()
            rows.extend(csv.DictReader(io.StringIO(text)))
    rows.sort(key=lambda r: (float(r["submit_time_s"]), r["vc"], int(r["job_idx"])))
    return rows


def philly_workload(
    fleet: Fleet, *, seed: int = 0, load: float = 0.7, jobs: int | None = None, rows: Sequence[dict[str, str]] | None = None
) -> Workload:
    """The Philly trace, given GPU types, priorities and checkpoints by the module's rules.

    Args:
        fleet: the fleet the jobs are typed and compressed for.
        seed: seeds every draw.
        load: target offered load (0.7 = 70 % of the fleet's GPUs).
        jobs: how many jobs (the first ones in submit order; the trace repeats past its end).
        rows: rows to use instead of the bundled trace (tests).
    """
    base = list(rows if rows is not None else read_philly_rows())
    if not base:
        raise ValueError("empty trace")
    want = jobs or len(base)
    span = max(float(r["submit_time_s"]) for r in base) + 1.0
    rng = random.Random(seed)
    sizes = fleet.node_size()
    eligible = _Eligible(fleet)
    big = max(sizes.values())
    out: list[SimJob] = []
    for n in range(want):
        copy, row = divmod(n, len(base))
        r = base[row]
        count = int(r["num_gpus"])
        if count > big and count % big:
            count = (count // big + 1) * big
        duration = min(max(float(r["duration_s"]), 60.0), MAX_DURATION_S)
        choices = eligible(count)
        if not choices:
            raise ValueError(f"no GPU type in the fleet can hold a {count}-GPU gang")
        gpu_type = _pick_type(rng, choices)
        priority, preemptible = _priority(rng)
        out.append(
            SimJob(
                id=f"{r['vc']}-{r['job_idx']}" + (f"-c{copy}" if copy else ""),
                tenant=f"vc-{r['vc']}",
                submit_s=float(r["submit_time_s"]) + copy * span,
                gpu_type=gpu_type,
                gpu_count=count,
                duration_s=duration,
                max_runtime_s=_limit_for(duration, rng.uniform(1.0, 2.0)),
                priority=priority,
                preemptible=preemptible,
                checkpoint_interval_s=_checkpoint_interval(rng, duration),
                topology_level="node" if count <= sizes[gpu_type] else "leaf",
            )
        )
    out.sort(key=lambda j: (j.submit_s, j.id))
    demand: dict[str, float] = {}
    for j in out:
        demand[j.tenant] = demand.get(j.tenant, 0.0) + j.gpu_count * j.duration_s
    mean = sum(demand.values()) / len(demand)
    tenants = tuple(TenantSpec(name=t, weight=round(max(d / mean, 0.01), 4)) for t, d in sorted(demand.items()))
    workload = Workload(name="philly", jobs=tuple(out), tenants=tenants)
    return compress_to_load(workload, fleet.total_gpus(), load)


#: Synthetic gang sizes and their probabilities (SPEC: 1-64 GPUs).
SYNTH_SIZES: tuple[tuple[int, float], ...] = ((1, 0.45), (2, 0.15), (4, 0.15), (8, 0.15), (16, 0.05), (32, 0.03), (64, 0.02))


def synthetic_workload(
    fleet: Fleet, *, seed: int = 0, load: float = 0.7, jobs: int = 10_000, teams: int = 50, peak_per_hour: float = 500.0
) -> Workload:
    """A seeded workload at the SPEC's scale.

    50 teams with log-normal weights; 40 % sweeps of 15-60 min and 60 % runs of 1-48 h
    (log-uniform); gang sizes from :data:`SYNTH_SIZES`; a team prefers one GPU type (70 %)
    and otherwise draws by capacity; priorities and checkpoints by the Philly rules.
    Preferred types are dealt so that each type's preferring teams weigh in proportion to
    its capacity (:func:`_favourite_types`), so every type sees about the target load, as a
    fleet sized to its teams' demand does: no type is overloaded while the fleet as a whole
    is at the target.
    Arrivals are Poisson with a daily cycle (peak 1.5 x mean), at the rate that gives the
    target load, capped so the peak stays within ``peak_per_hour``.
    """
    rng = random.Random(seed)
    names = [f"team-{i:02d}" for i in range(teams)]
    weights = {n: round(rng.lognormvariate(0.0, 0.5), 3) for n in names}
    sizes = fleet.node_size()
    eligible = _Eligible(fleet)
    caps = list(fleet.capacity().items())
    favourite = _favourite_types(names, weights, caps)
    shapes: list[tuple[str, str, int, float]] = []
    cum_weights = list(itertools.accumulate(weights[n] for n in names))
    for _ in range(jobs):
        tenant = rng.choices(names, cum_weights=cum_weights)[0]
        x, acc, count = rng.random(), 0.0, 1
        for size, p in SYNTH_SIZES:
            acc += p
            if x < acc:
                count = size
                break
        choices = eligible(count)
        fav = [c for c in choices if c[0] == favourite[tenant]]
        gpu_type = fav[0][0] if fav and rng.random() < 0.7 else _pick_type(rng, choices)
        sweep = rng.random() < 0.4
        duration = rng.uniform(900.0, 3600.0) if sweep else math.exp(rng.uniform(math.log(HOUR), math.log(MAX_DURATION_S)))
        shapes.append((tenant, gpu_type, count, duration))
    total = sum(c * d for _, _, c, d in shapes)
    span = max(total / (load * fleet.total_gpus()), jobs / (peak_per_hour / 1.5) * HOUR)
    times: list[float] = []
    while len(times) < jobs:
        t = rng.uniform(0.0, span)
        if rng.random() < (1.0 + 0.5 * math.sin(2 * math.pi * t / 86400.0)) / 1.5:
            times.append(t)
    times.sort()
    out = []
    for n, (t, (tenant, gpu_type, count, duration)) in enumerate(zip(times, shapes, strict=True)):
        priority, preemptible = _priority(rng)
        out.append(
            SimJob(
                id=f"s{n:06d}",
                tenant=tenant,
                submit_s=t,
                gpu_type=gpu_type,
                gpu_count=count,
                duration_s=duration,
                max_runtime_s=_limit_for(duration, rng.uniform(1.0, 2.0)),
                priority=priority,
                preemptible=preemptible,
                checkpoint_interval_s=_checkpoint_interval(rng, duration),
                topology_level="node" if count <= sizes[gpu_type] else "leaf",
            )
        )
    tenants = tuple(TenantSpec(name=n, weight=weights[n]) for n in sorted(names))
    return Workload(name="synthetic", jobs=tuple(out), tenants=tenants)


CSV_COLUMNS = (
    "id",
    "tenant",
    "submit_s",
    "gpu_type",
    "gpu_count",
    "duration_s",
    "max_runtime_s",
    "priority",
    "preemptible",
    "checkpoint_interval_s",
    "gpu_max",
)


def csv_workload(path: str | Path, fleet: Fleet, *, seed: int = 0, load: float | None = None, jobs: int | None = None) -> Workload:
    """A CSV file: either Philly-format rows (``vc``, ``num_gpus``, ...) or :data:`CSV_COLUMNS`.

    Philly-format files go through :func:`philly_workload`'s rules. Files in the
    simulator's own format are taken as they are (``max_runtime_s`` defaults to the
    duration, ``priority`` to 100, ``preemptible`` to true, ``checkpoint_interval_s`` to
    none, ``gpu_max`` to none: a fixed job); ``load``, when given, compresses their submit times.
    """
    raw = Path(path).read_bytes()
    text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    if rows and "num_gpus" in rows[0]:
        rows.sort(key=lambda r: (float(r["submit_time_s"]), r["vc"], int(r["job_idx"])))
        return philly_workload(fleet, seed=seed, load=load or 0.7, jobs=jobs, rows=rows)
    sizes = fleet.node_size()
    out = []
    for r in rows[: jobs or len(rows)]:
        count, gpu_type = int(r["gpu_count"]), r["gpu_type"]
        if gpu_type not in sizes:
            raise ValueError(f"job {r['id']}: GPU type {gpu_type} is not in the fleet")
        duration = float(r["duration_s"])
        gpu_max = int(r["gpu_max"]) if r.get("gpu_max") else None
        if gpu_max is not None and gpu_max < count:
            raise ValueError(f"job {r['id']}: gpu_max {gpu_max} is below gpu_count {count}")
        out.append(
            SimJob(
                id=r["id"],
                tenant=r["tenant"],
                submit_s=float(r["submit_s"]),
                gpu_type=gpu_type,
                gpu_count=count,
                duration_s=duration,
                max_runtime_s=float(r.get("max_runtime_s") or duration),
                priority=int(r.get("priority") or PRIORITY_NORMAL),
                preemptible=(r.get("preemptible") or "true").lower() in ("1", "true", "yes"),
                checkpoint_interval_s=float(r.get("checkpoint_interval_s") or math.inf),
                topology_level="node" if max(count, gpu_max or 0) <= sizes[gpu_type] else "leaf",
                gpu_max=gpu_max,
            )
        )
    out.sort(key=lambda j: (j.submit_s, j.id))
    names = sorted({j.tenant for j in out})
    workload = Workload(name=Path(path).name, jobs=tuple(out), tenants=tuple(TenantSpec(name=n) for n in names))
    return compress_to_load(workload, fleet.total_gpus(), load) if load else workload


def write_csv(workload: Workload, path: str | Path) -> None:
    """Write a workload in the simulator's own CSV format (readable by :func:`csv_workload`)."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for j in workload.jobs:
            w.writerow(
                [
                    j.id,
                    j.tenant,
                    j.submit_s,
                    j.gpu_type,
                    j.gpu_count,
                    j.duration_s,
                    j.max_runtime_s,
                    j.priority,
                    j.preemptible,
                    j.checkpoint_interval_s,
                    j.gpu_max if j.gpu_max is not None else "",
                ]
            )


def resolve_tenants(fleet: Fleet, workload: Workload) -> tuple[TenantSpec, ...]:
    """Tenants for a run: the cluster config's where it names them, else the workload's weights.

    A tenant without configured quotas gets, per GPU type, a nominal quota of its weight's
    share of that type's GPUs, borrowing unlimited, all in one cohort. Shares are rounded by
    largest remainder, so the nominal quotas of a type add up to exactly its GPUs: rounded
    down, up to one GPU per tenant would lie beyond every quota and idle while jobs wait.
    """
    configured = {t.name: t for t in fleet.tenants}
    names = sorted({t.name for t in workload.tenants} | {j.tenant for j in workload.jobs} | set(configured))
    weights = {t.name: t.weight for t in workload.tenants}
    for name, t in configured.items():
        weights[name] = t.weight
    total = sum(weights.get(n, 1.0) for n in names) or 1.0
    caps = fleet.capacity()
    unset = [n for n in names if not (n in configured and configured[n].quotas)]
    unset_total = sum(weights.get(n, 1.0) for n in unset)
    nominal = {t: _largest_remainder(c * unset_total / total, {n: weights.get(n, 1.0) for n in unset}) for t, c in caps.items()}
    out = []
    for name in names:
        if name in configured and configured[name].quotas:
            out.append(configured[name])
            continue
        w = weights.get(name, 1.0)
        quotas = tuple((t, Quota(nominal=nominal[t][name])) for t in caps)
        cohort = configured[name].cohort if name in configured else "fleet"
        out.append(TenantSpec(name=name, weight=w, cohort=cohort or "fleet", quotas=quotas))
    return tuple(out)


def _largest_remainder(amount: float, weights: dict[str, float]) -> dict[str, int]:
    """``floor(amount)`` split in proportion to ``weights`` in whole units (Hamilton's method; ties by name)."""
    total = sum(weights.values())
    if total <= 0 or not weights:
        return dict.fromkeys(weights, 0)
    exact = {n: amount * w / total for n, w in weights.items()}
    out = {n: math.floor(x) for n, x in exact.items()}
    left = math.floor(amount + 1e-9) - sum(out.values())
    for n in sorted(exact, key=lambda n: (-(exact[n] - out[n]), n))[: max(0, left)]:
        out[n] += 1
    return out


def size_class(gpus: int) -> str:
    """Job-size classes used in every report: 1, 2-8 (one node), 9-32, 33+ GPUs."""
    if gpus <= 1:
        return "1"
    if gpus <= 8:
        return "2-8"
    if gpus <= 32:
        return "9-32"
    return "33+"


SIZE_CLASSES = ("1", "2-8", "9-32", "33+")
