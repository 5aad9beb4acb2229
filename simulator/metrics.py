"""Metrics of a run: JCT and queueing delay, utilisation against its bound, fairness, losses, fragmentation.

Definitions (also in docs/evaluation.md):

- JCT: finish - submit. Queueing delay: time spent waiting in the queue, summed over
  attempts (a preempted job waits again). Both in hours.
- Utilisation: GPU-seconds held (including work later lost) over fleet GPU-seconds from
  the first submit to the last finish. Its bound at time t is Σ over GPU types of
  min(capacity, GPUs demanded by running and queued jobs); ``util/bound`` is Σ held over
  Σ bound across the samples.
- Fairness: per sample, each tenant's fair share is the weighted max-min (water-filling)
  split of each GPU type's capacity over the tenants' demands of that type. Per window,
  x_i = GPUs held / fair share (both summed over the window's samples), and Jain's index
  (Σx)² / (n·Σx²) over the tenants with a fair share; reported as mean and minimum.
- Fragmentation: with jobs waiting, the share of free GPUs that sit on partly used nodes
  (stranded), averaged over samples; and free GPUs while jobs wait, over capacity (idle).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from simulator.engine import JobRecord, SimResult
from simulator.workload import SIZE_CLASSES, size_class

HOUR = 3600.0


@dataclass(frozen=True)
class GroupStats:
    """JCT and queueing delay of a set of jobs, in hours."""

    jobs: int
    finished: int
    avg_jct: float
    p50_jct: float
    p90_jct: float
    p99_jct: float
    avg_wait: float
    p50_wait: float
    p90_wait: float
    p99_wait: float
    max_wait: float


@dataclass(frozen=True)
class Summary:
    """One policy's headline numbers."""

    overall: GroupStats
    makespan_h: float
    utilisation: float
    util_vs_bound: float
    jain_mean: float
    jain_min: float
    preemptions: int
    failures: int
    lost_gpu_h: float
    stranded_frac: float
    idle_while_waiting: float
    by_size: dict[str, GroupStats]
    by_tenant: dict[str, GroupStats]
    #: Per tenant: GPU-hours held over its fair share of GPU-hours (1 = exactly fair).
    tenant_share_ratio: dict[str, float]
    #: Elastic jobs (run elastic), their resizes by direction, and the GPU-hours resizes lost
    #: (work since the last checkpoint and the restart overhead).
    elastic_jobs: int = 0
    resizes: dict[str, int] = field(default_factory=dict)
    resize_lost_gpu_h: float = 0.0
    #: GPU-hours held by jobs (useful work, lost work and restarts).
    served_gpu_h: float = 0.0


def group_stats(records: Sequence[JobRecord]) -> GroupStats:
    done = [r for r in records if r.finish is not None]
    if not done:
        nan = float("nan")
        return GroupStats(len(records), 0, nan, nan, nan, nan, nan, nan, nan, nan, nan)
    jct = np.array([r.finish - r.submit for r in done if r.finish is not None]) / HOUR
    wait = np.array([r.queued_s for r in done]) / HOUR
    p = np.percentile
    return GroupStats(
        jobs=len(records),
        finished=len(done),
        avg_jct=float(jct.mean()),
        p50_jct=float(p(jct, 50)),
        p90_jct=float(p(jct, 90)),
        p99_jct=float(p(jct, 99)),
        avg_wait=float(wait.mean()),
        p50_wait=float(p(wait, 50)),
        p90_wait=float(p(wait, 90)),
        p99_wait=float(p(wait, 99)),
        max_wait=float(wait.max()),
    )


def _groups(records: Iterable[JobRecord], key: Callable[[JobRecord], str]) -> dict[str, list[JobRecord]]:
    out: dict[str, list[JobRecord]] = {}
    for r in records:
        out.setdefault(key(r), []).append(r)
    return out


def water_fill(capacity: float, demand: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Weighted max-min fair split of ``capacity`` over ``demand`` (never more than demanded)."""
    alloc = np.zeros_like(demand, dtype=float)
    active = demand > 0
    left = float(capacity)
    while active.any() and left > 1e-9:
        level = left / weight[active].sum()
        capped = active & (demand - alloc <= weight * level + 1e-9)
        if not capped.any():
            alloc[active] += weight[active] * level
            break
        left -= float((demand[capped] - alloc[capped]).sum())
        alloc[capped] = demand[capped]
        active &= ~capped
    return alloc


def fair_shares(result: SimResult) -> np.ndarray:
    """Per sample and tenant: the demand-capped weighted fair share of GPUs (summed over types)."""
    s = result.samples
    demand = np.asarray(s.tenant_demand, dtype=float)  # samples x tenants x types
    cap = np.asarray(s.capacity, dtype=float)  # samples x types
    weight = np.array([t.weight for t in result.tenants], dtype=float)
    fair = np.zeros(demand.shape[:2])
    for i in range(demand.shape[0]):
        for ty in range(demand.shape[2]):
            col = demand[i, :, ty]
            if col.any():
                fair[i] += water_fill(cap[i, ty], col, weight)
    return fair


def jain(x: np.ndarray) -> float:
    return float(x.sum() ** 2 / (len(x) * (x**2).sum())) if len(x) and (x**2).sum() > 0 else 1.0


def fairness(result: SimResult, fair: np.ndarray, window_s: float) -> tuple[float, float, dict[str, float]]:
    """Mean and minimum of Jain's index over windows, and each tenant's held/fair ratio over the run."""
    s = result.samples
    if not s.times:
        return 1.0, 1.0, {}
    used = np.asarray(s.tenant_used, dtype=float)
    times = np.asarray(s.times)
    window = ((times - times[0]) // window_s).astype(int)
    scores = []
    for w in np.unique(window):
        sel = window == w
        f, u = fair[sel].sum(axis=0), used[sel].sum(axis=0)
        have = f > 0
        if have.sum() >= 2:
            scores.append(jain(u[have] / f[have]))
    total_f, total_u = fair.sum(axis=0), used.sum(axis=0)
    ratio = {t.name: float(total_u[i] / total_f[i]) for i, t in enumerate(result.tenants) if total_f[i] > 0}
    if not scores:
        return 1.0, 1.0, ratio
    return float(np.mean(scores)), float(np.min(scores)), ratio


def summarize(result: SimResult, *, window_s: float = 6 * HOUR) -> Summary:
    """Everything the report shows for one policy."""
    records = result.records
    total_gpus = sum(result.capacity.values())
    submits = [r.submit for r in records]
    finishes = [r.finish for r in records if r.finish is not None]
    makespan = (max(finishes) - min(submits)) if finishes else 0.0
    held = sum(r.held_gpu_s for r in records)
    s = result.samples
    used = np.asarray(s.used, dtype=float).sum(axis=1) if s.used else np.zeros(0)
    bound = np.minimum(np.asarray(s.capacity, dtype=float), np.asarray(s.demand, dtype=float)).sum(axis=1) if s.used else np.zeros(0)
    queued = np.asarray(s.queued_jobs) > 0
    free = np.asarray(s.free, dtype=float)
    stranded = np.asarray(s.stranded, dtype=float)
    cap = np.asarray(s.capacity, dtype=float).sum(axis=1) if s.capacity else np.zeros(0)
    waiting_free = queued & (free > 0)
    fair = fair_shares(result)
    jain_mean, jain_min, ratio = fairness(result, fair, window_s)
    return Summary(
        overall=group_stats(records),
        makespan_h=makespan / HOUR,
        utilisation=held / (total_gpus * makespan) if makespan > 0 else 0.0,
        util_vs_bound=float(used.sum() / bound.sum()) if bound.sum() > 0 else 1.0,
        jain_mean=jain_mean,
        jain_min=jain_min,
        preemptions=result.preemptions,
        failures=result.failures,
        lost_gpu_h=sum(r.lost_gpu_s for r in records) / HOUR,
        stranded_frac=float((stranded[waiting_free] / free[waiting_free]).mean()) if waiting_free.any() else 0.0,
        idle_while_waiting=float((free[queued] / cap[queued]).mean()) if queued.any() else 0.0,
        by_size={
            k: group_stats(v)
            for k, v in sorted(_groups(records, lambda r: size_class(r.gpu_count)).items(), key=lambda kv: SIZE_CLASSES.index(kv[0]))
        },
        by_tenant={k: group_stats(v) for k, v in sorted(_groups(records, lambda r: r.tenant).items())},
        tenant_share_ratio=ratio,
        elastic_jobs=sum(1 for r in records if r.gpu_max is not None),
        resizes=dict(sorted(result.resizes.items())),
        resize_lost_gpu_h=sum(r.resize_lost_gpu_s for r in records) / HOUR,
        served_gpu_h=held / HOUR,
    )


#: One start estimate: (job id, made at, predicted start or None, made at submission, low, high, GPUs).
Prediction = tuple[str, float, float | None, bool, float | None, float | None, int]


@dataclass(frozen=True)
class IntervalAccuracy:
    """Estimates of jobs that still had at least an hour to wait, relative to that wait."""

    n: int
    #: Median of |predicted - actual start| / actual remaining wait, and of the signed error.
    median_abs_rel: float
    median_signed_rel: float
    #: Share of estimates whose p10-p90 interval held the actual start.
    coverage: float


@dataclass(frozen=True)
class EstimateAccuracy:
    """Predicted against actual start, in hours: made at submission, and made while waiting."""

    at_submit: int
    at_submit_median_abs_h: float
    at_submit_p90_abs_h: float
    at_submit_median_signed_h: float
    while_waiting: int
    while_waiting_median_abs_h: float
    while_waiting_p90_abs_h: float
    beyond_horizon: int
    #: Of all scored estimates: the share within 10 minutes and within an hour of the actual start.
    within_10min: float = float("nan")
    within_1h: float = float("nan")
    #: Estimates made at least an hour before the actual start, overall and by job size class.
    long_wait: IntervalAccuracy | None = None
    long_wait_by_size: dict[str, IntervalAccuracy] = field(default_factory=dict)


def _interval_accuracy(rows: list[tuple[float, float, float, float, float]]) -> IntervalAccuracy:
    """``rows`` of (predicted, actual, low, high, remaining wait)."""
    nan = float("nan")
    if not rows:
        return IntervalAccuracy(0, nan, nan, nan)
    a = np.asarray(rows)
    rel = (a[:, 0] - a[:, 1]) / a[:, 4]
    covered = (a[:, 2] <= a[:, 1]) & (a[:, 1] <= a[:, 3])
    return IntervalAccuracy(len(rows), float(np.median(np.abs(rel))), float(np.median(rel)), float(covered.mean()))


def estimate_accuracy(predictions: Sequence[Prediction], records: Sequence[JobRecord]) -> EstimateAccuracy:
    """Score :data:`Prediction` rows against the run's actual first starts."""
    actual = {r.id: r.first_start for r in records}
    sub: list[float] = []
    wait: list[float] = []
    beyond = 0
    long: list[tuple[float, float, float, float, float]] = []
    by_size: dict[str, list[tuple[float, float, float, float, float]]] = {}
    for job_id, made_at, predicted, at_submit, low, high, gpus in predictions:
        real = actual.get(job_id)
        if real is None:
            continue
        if predicted is None:
            beyond += 1
            continue
        err = (predicted - real) / HOUR
        (sub if at_submit else wait).append(err)
        remaining = real - made_at
        if remaining >= HOUR:
            row = (predicted, real, predicted if low is None else low, math.inf if high is None else high, remaining)
            long.append(row)
            by_size.setdefault(size_class(gpus), []).append(row)
    a, b = np.asarray(sub), np.asarray(wait)
    every = np.abs(np.concatenate([a, b])) if len(a) + len(b) else np.zeros(0)
    nan = float("nan")
    return EstimateAccuracy(
        within_10min=float((every <= 10 / 60).mean()) if len(every) else nan,
        within_1h=float((every <= 1.0).mean()) if len(every) else nan,
        long_wait=_interval_accuracy(long),
        long_wait_by_size={c: _interval_accuracy(by_size[c]) for c in SIZE_CLASSES if c in by_size},
        at_submit=len(a),
        at_submit_median_abs_h=float(np.median(np.abs(a))) if len(a) else nan,
        at_submit_p90_abs_h=float(np.percentile(np.abs(a), 90)) if len(a) else nan,
        at_submit_median_signed_h=float(np.median(a)) if len(a) else nan,
        while_waiting=len(b),
        while_waiting_median_abs_h=float(np.median(np.abs(b))) if len(b) else nan,
        while_waiting_p90_abs_h=float(np.percentile(np.abs(b), 90)) if len(b) else nan,
        beyond_horizon=beyond,
    )
