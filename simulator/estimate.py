"""Queue-wait estimates (SPEC R7.2): forward-simulate the current queue with expected durations.

The live API and the simulator call the same function. From one snapshot it replays the
future with no new arrivals: running jobs end at their ``expected_end``, a job the policy
starts runs for its ``expected_runtime_s`` (else its ``max_runtime_s``), and the policy is
asked again after ends, on a grid of ``step_s``. A job's estimate is the first time the
policy binds it, back-dated within that step to when its GPUs came free (and it had arrived):
the service decides far more often than the grid, so a start at the grid's time would make
every start in a chain late by up to a step, and a queue's later jobs late by the sum of them;
a job started back in a step that has ended by the step's time is released and the policy is
asked again at that time. Preemptions the policy asks for are applied (the victim waits again).
Pure: no clock, no I/O; imports only the core's types.

``estimate_intervals`` gives each waiting job a (low, median, high) start: the same forward simulation once
per error quantile of the run-time predictor, with every job's remaining expected run time scaled by that
quantile's ratio (actual / predicted), never past its max runtime.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from scheduler.core.types import Decisions, NodeView, PendingJob, RunningJob, Snapshot

Policy = Callable[[Snapshot, float], Decisions]


@dataclass(frozen=True)
class QueueEstimate:
    """A waiting job's place in the predicted start order, and its predicted start (None: beyond the horizon)."""

    job_id: str
    position: int
    start_at: float | None


def estimate_starts(
    snapshot: Snapshot,
    now: float,
    policy: Policy,
    *,
    targets: Collection[str] | None = None,
    step_s: float = 300.0,
    horizon_s: float = 7 * 24 * 3600.0,
    max_steps: int = 500,
    overdue_s: float = 0.0,
    arrivals: Sequence[PendingJob] = (),
    true_ends: Mapping[str, float] | None = None,
    true_runtimes: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Predicted start time of each waiting job that starts within the horizon.

    Args:
        snapshot: the fleet and queue now.
        now: the clock of the snapshot.
        policy: ``(snapshot, now) -> Decisions``; give a fresh instance if it keeps state.
        targets: stop once these jobs all have a prediction (default: every waiting job).
        step_s: the policy is asked at most once per step (ends inside a step share a cycle).
        horizon_s: look no further ahead than this.
        max_steps: and move the clock at most this many times (the policy asked again at the same time for jobs
            started back in a step and ended by its time counts apart: at most as many times again).
        overdue_s: a running job whose expected end is not after ``now`` is taken to end this long after ``now``.
        arrivals: jobs that join the queue later, each at its ``queued_at`` (ids unlike the snapshot's): a study of
            what the jobs that arrive after an estimate change (none by default: the future is not known).
        true_ends, true_runtimes: a study's replay of the future: running jobs end at ``true_ends`` (by id) and
            waiting or arriving jobs, once started, run ``true_runtimes`` (by id), while the policy is still shown
            the expected ones (a job preempted in the replay is back to expected).
    """
    want = set(targets) if targets is not None else {j.id for j in snapshot.pending}
    # A job that its GPU type's schedulable nodes could not hold even empty never starts here (their number does
    # not change): not waited for, else a fleet whose nodes have all gone stale would be simulated to the horizon.
    room: dict[str, int] = {}
    for view in snapshot.nodes:
        if view.schedulable:
            room[view.gpu_type] = room.get(view.gpu_type, 0) + view.gpu_count
    want &= {j.id for j in snapshot.pending if room.get(j.gpu_type, 0) >= j.gpu_count}
    views: dict[str, NodeView] = {n.id: n for n in snapshot.nodes}
    order = [n.id for n in snapshot.nodes]
    free: dict[str, set[int]] = {n.id: set(n.free) for n in snapshot.nodes}
    pending: dict[str, PendingJob] = {j.id: j for j in snapshot.pending}
    running: dict[str, RunningJob] = {r.id: r for r in snapshot.running}
    ended = dict(true_ends or {})
    lasts = dict(true_runtimes or {})
    ends: list[tuple[float, str, int]] = [
        (ended[r.id] if r.id in ended else r.expected_end if r.expected_end > now else now + overdue_s, r.id, r.attempt)
        for r in snapshot.running
    ]
    heapq.heapify(ends)
    starts: dict[str, float] = {}
    t = now
    #: The previous cycle's time: a job bound now would have been bound by a cycle since (the service's cycles
    #: are far finer than the grid), once its GPUs were free and it had arrived.
    before = now
    #: The latest end or arrival the simulation has seen (what changed since ``before``, when a job's own GPUs and
    #: arrival do not say why it was not bound then).
    changed = now
    #: (node, GPU) -> when it came free, for those freed since ``now`` (GPUs free at ``now`` are free since then).
    freed: dict[tuple[str, int], float] = {}
    stale: set[str] = set()
    reservations = snapshot.reservations

    def release(job: RunningJob, at: float) -> None:
        for m in job.members:
            free[m.node_id].update(m.gpu_indices)
            stale.add(m.node_id)
            for g in m.gpu_indices:
                freed[(m.node_id, g)] = at

    later = sorted(arrivals, key=lambda j: (j.queued_at, j.id))
    arrived = 0
    steps = again = 0
    while steps < max_steps and again <= max_steps:
        while arrived < len(later) and later[arrived].queued_at <= t:
            pending[later[arrived].id] = later[arrived]
            changed = max(changed, later[arrived].queued_at)
            arrived += 1
        for node_id in stale:
            v = views[node_id]
            views[node_id] = NodeView(
                id=v.id,
                gpu_type=v.gpu_type,
                gpu_count=v.gpu_count,
                labels=v.labels,
                free=frozenset(free[node_id]),
                schedulable=v.schedulable,
            )
        stale.clear()
        snap = Snapshot(
            nodes=tuple(views[i] for i in order),
            pending=tuple(pending.values()),
            topology_levels=snapshot.topology_levels,
            tenants=snapshot.tenants,
            running=tuple(running.values()),
            config=snapshot.config,
            reservations=reservations,
        )
        decisions = policy(snap, t)
        reservations = decisions.reservations
        for p in decisions.preemptions:
            victim = running.pop(p.job_id, None)
            if victim is None:
                continue
            release(victim, t)
            lasts.pop(victim.id, None)
            pending[victim.id] = PendingJob(
                id=victim.id,
                tenant=victim.tenant,
                attempt=victim.attempt + 1,
                gpu_type=victim.gpu_type,
                gpu_count=victim.gpu_count,
                priority=victim.priority,
                queued_at=t,
                max_runtime_s=max(victim.expected_end - t, 0.0),
                preemptible=victim.preemptible,
            )
        for r in decisions.resizes:
            # An elastic job's resize: the GPUs it gives back are free at once, the ones it takes are taken
            # (its expected end stays; growth needs nodes' idle times, which the forward views do not carry).
            resized = running.get(r.job_id)
            if resized is None or resized.attempt != r.attempt:
                continue
            old = {(m.node_id, g) for m in resized.members for g in m.gpu_indices}
            new = {(m.node_id, g) for m in r.members for g in m.gpu_indices}
            if any(g not in free[n] for n, g in new - old):
                continue
            for n, g in old - new:
                free[n].add(g)
                freed[(n, g)] = t
                stale.add(n)
            for n, g in new - old:
                free[n].discard(g)
                stale.add(n)
            running[r.job_id] = dataclasses.replace(resized, members=r.members, gpu_count=r.to_gpus, resized_at=t)
        for b in decisions.binds:
            job = pending.get(b.job_id)
            if job is None or any(not set(m.gpu_indices) <= free[m.node_id] for m in b.members):
                continue
            del pending[job.id]
            # Its start: when the last of its GPUs came free or it arrived, if that was since the previous cycle; else
            # (it was held back then) the latest end or arrival since, else this cycle. Never the grid's time alone.
            enabled = max((freed.get((m.node_id, g), now) for m in b.members for g in m.gpu_indices), default=now)
            enabled = max(enabled, job.queued_at)
            if enabled <= before:
                enabled = changed if changed > before else t
            began = min(max(enabled, before, now), t)
            if job.id in want and job.id not in starts:
                starts[job.id] = began
            for m in b.members:
                free[m.node_id].difference_update(m.gpu_indices)
                stale.add(m.node_id)
            run = job.expected_runtime_s if job.expected_runtime_s is not None else job.max_runtime_s
            running[job.id] = RunningJob.started(job, b.members, began, run)
            heapq.heappush(ends, (began + lasts.get(job.id, run), job.id, job.attempt))
        if want <= starts.keys() or (not pending and arrived == len(later)):
            break
        # Advance to the next end (stale entries belong to preempted attempts), then to the grid; after a
        # preemption or a resize, one step only (the job it was for binds once the GPUs are free). A job started
        # back in this step that has ended by now is released and the policy asked again at this time (the
        # service's cycles would have used its GPUs since it ended), before the clock moves on.
        decided_at = t
        while ends and (ends[0][1] not in running or running[ends[0][1]].attempt != ends[0][2]):
            heapq.heappop(ends)
        if ends and ends[0][0] <= t and not (decisions.preemptions or decisions.resizes):
            again += 1
        elif decisions.preemptions or decisions.resizes:
            t = t + (step_s if step_s > 0 else 1.0)
        elif not ends and arrived == len(later):
            break
        else:
            nxt = min(ends[0][0] if ends else math.inf, later[arrived].queued_at if arrived < len(later) else math.inf)
            t = max(t + step_s, math.ceil(nxt / step_s) * step_s) if step_s > 0 else nxt
        if t != decided_at:
            before = decided_at
            steps += 1
        if t > now + horizon_s:
            break
        while ends and ends[0][0] <= t:
            end, job_id, attempt = heapq.heappop(ends)
            done = running.get(job_id)
            if done is not None and done.attempt == attempt:
                del running[job_id]
                release(done, end)
                changed = max(changed, end)
    return starts


def queue_estimates(
    snapshot: Snapshot, now: float, policy: Policy, *, step_s: float = 300.0, horizon_s: float = 7 * 24 * 3600.0, max_steps: int = 500
) -> list[QueueEstimate]:
    """Every waiting job with its position (by predicted start, then id) and predicted start."""
    starts = estimate_starts(snapshot, now, policy, step_s=step_s, horizon_s=horizon_s, max_steps=max_steps)
    never = math.inf
    ordered = sorted(snapshot.pending, key=lambda j: (starts.get(j.id, never), j.id))
    return [QueueEstimate(job_id=j.id, position=i + 1, start_at=starts.get(j.id)) for i, j in enumerate(ordered)]


#: The error quantiles of the run-time predictor an interval is made of: (low, median, high).
INTERVAL_QUANTILES = (0.1, 0.5, 0.9)


def scaled(snapshot: Snapshot, now: float, ratio: float, *, overdue_s: float = 60.0) -> Snapshot:
    """The snapshot with every job's remaining expected run time multiplied by ``ratio`` (an error ratio, actual /
    predicted), never past its max runtime: a waiting job's ``expected_runtime_s`` (its ``max_runtime_s`` when
    it has none), a running job's ``expected_end`` (one already past is taken as ``now + overdue_s``, before
    scaling). Views left unchanged are the very objects (``ratio`` 1 changes only overdue ends)."""
    pending = []
    for job in snapshot.pending:
        run = job.expected_runtime_s if job.expected_runtime_s is not None else job.max_runtime_s
        expected = min(run * ratio, job.max_runtime_s)
        pending.append(job if expected == job.expected_runtime_s else dataclasses.replace(job, expected_runtime_s=expected))
    running = []
    for r in snapshot.running:
        end = r.expected_end if r.expected_end > now else now + overdue_s
        if ratio != 1.0:
            end = now + (end - now) * ratio
        if r.max_end is not None:
            end = min(end, r.max_end if r.max_end > now else now + overdue_s)
        running.append(r if end == r.expected_end else dataclasses.replace(r, expected_end=end))
    return dataclasses.replace(snapshot, pending=tuple(pending), running=tuple(running))


Interval = tuple[float | None, float | None, float | None]


def estimate_intervals(
    snapshot: Snapshot,
    now: float,
    policy_factory: Callable[[], Policy],
    *,
    ratios: Sequence[float],
    quantiles: Sequence[float] = INTERVAL_QUANTILES,
    step_s: float = 300.0,
    bound_step_s: float | None = None,
    horizon_s: float = 7 * 24 * 3600.0,
    max_steps: int = 500,
    overdue_s: float = 60.0,
) -> dict[str, Interval]:
    """(low, median, high) predicted start of every waiting job, None where beyond the horizon.

    Args:
        snapshot: the fleet and queue now, with learned run times (``expected_runtime_s``, ``expected_end``).
        now: the clock of the snapshot.
        policy_factory: a fresh policy for each of the forward simulations.
        ratios: the run-time predictor's error ratios (actual / predicted) at ``quantiles``
            (``RuntimePredictor.quantiles(quantiles)``): one forward simulation each, with every job's remaining
            expected run time scaled by it.
        quantiles: what the ratios are the quantiles of; only their count matters here (three: low, median, high).
        step_s: the median's forward simulation's grid; ``bound_step_s`` (default: the same) the low and high
            ones' (a coarser grid costs less).
        horizon_s, max_steps: as for :func:`estimate_starts`.
        overdue_s: a running job whose expected end is already past is taken to end this long after ``now``.

    The median is the median simulation's start, exactly (the what-if's replay of "no change" is that
    simulation); the low is the earliest and the high the latest of the three (None counting as beyond any
    time), so that low <= median <= high whatever the policy made of the three futures on their grids.
    """
    if len(ratios) != len(quantiles) or len(ratios) != 3:
        raise ValueError(f"ratios must be three error ratios (low, median, high), one per quantile, got {tuple(ratios)}")
    if any(not (r >= 0.0) or math.isinf(r) for r in ratios):
        raise ValueError(f"ratios must be finite numbers >= 0, got {tuple(ratios)}")
    bound_step = step_s if bound_step_s is None else bound_step_s
    runs = []
    for i, ratio in enumerate(ratios):
        runs.append(
            estimate_starts(
                scaled(snapshot, now, ratio, overdue_s=overdue_s),
                now,
                policy_factory(),
                step_s=step_s if i == 1 else bound_step,
                horizon_s=horizon_s,
                max_steps=max_steps,
                overdue_s=overdue_s,
            )
        )
    never = math.inf
    out: dict[str, Interval] = {}
    for job in snapshot.pending:
        starts = [run.get(job.id, never) for run in runs]
        bounds = (min(starts), starts[1], max(starts))
        low, median, high = (None if s == never else max(s, now) for s in bounds)
        out[job.id] = (low, median, high)
    return out
