"""Queue-wait estimates (SPEC R7.2): forward-simulate the current queue with expected durations.

The live API and the simulator call the same function. From one snapshot it replays the
future with no new arrivals: running jobs end at their ``expected_end``, a job the policy
starts runs for its ``expected_runtime_s`` (else its ``max_runtime_s``), and the policy is
asked again after ends, on a grid of ``step_s``. A job's estimate is the first time the
policy binds it. Preemptions the policy asks for are applied (the victim waits again).
Pure: no clock, no I/O; imports only the core's types.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection
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
) -> dict[str, float]:
    """Predicted start time of each waiting job that starts within the horizon.

    Args:
        snapshot: the fleet and queue now.
        now: the clock of the snapshot.
        policy: ``(snapshot, now) -> Decisions``; give a fresh instance if it keeps state.
        targets: stop once these jobs all have a prediction (default: every waiting job).
        step_s: the policy is asked at most once per step (ends inside a step share a cycle).
        horizon_s: look no further ahead than this.
        max_steps: and ask the policy at most this many times.
    """
    want = set(targets) if targets is not None else {j.id for j in snapshot.pending}
    want &= {j.id for j in snapshot.pending}
    views: dict[str, NodeView] = {n.id: n for n in snapshot.nodes}
    order = [n.id for n in snapshot.nodes]
    free: dict[str, set[int]] = {n.id: set(n.free) for n in snapshot.nodes}
    pending: dict[str, PendingJob] = {j.id: j for j in snapshot.pending}
    running: dict[str, RunningJob] = {r.id: r for r in snapshot.running}
    ends: list[tuple[float, str, int]] = [(max(r.expected_end, now), r.id, r.attempt) for r in snapshot.running]
    heapq.heapify(ends)
    starts: dict[str, float] = {}
    t = now
    stale: set[str] = set()
    reservations = snapshot.reservations

    def release(job: RunningJob) -> None:
        for m in job.members:
            free[m.node_id].update(m.gpu_indices)
            stale.add(m.node_id)

    for _ in range(max_steps):
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
            release(victim)
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
        for b in decisions.binds:
            job = pending.get(b.job_id)
            if job is None or any(not set(m.gpu_indices) <= free[m.node_id] for m in b.members):
                continue
            del pending[job.id]
            if job.id in want and job.id not in starts:
                starts[job.id] = t
            for m in b.members:
                free[m.node_id].difference_update(m.gpu_indices)
                stale.add(m.node_id)
            run = job.expected_runtime_s if job.expected_runtime_s is not None else job.max_runtime_s
            running[job.id] = RunningJob.started(job, b.members, t, run)
            heapq.heappush(ends, (t + run, job.id, job.attempt))
        if want <= starts.keys() or not pending:
            break
        # Advance to the next end (stale entries belong to preempted attempts), then to the grid.
        while ends and (ends[0][1] not in running or running[ends[0][1]].attempt != ends[0][2]):
            heapq.heappop(ends)
        if not ends:
            break
        t = max(t + step_s, math.ceil(ends[0][0] / step_s) * step_s) if step_s > 0 else ends[0][0]
        if t > now + horizon_s:
            break
        while ends and ends[0][0] <= t:
            _, job_id, attempt = heapq.heappop(ends)
            done = running.get(job_id)
            if done is not None and done.attempt == attempt:
                del running[job_id]
                release(done)
    return starts


def queue_estimates(
    snapshot: Snapshot, now: float, policy: Policy, *, step_s: float = 300.0, horizon_s: float = 7 * 24 * 3600.0, max_steps: int = 500
) -> list[QueueEstimate]:
    """Every waiting job with its position (by predicted start, then id) and predicted start."""
    starts = estimate_starts(snapshot, now, policy, step_s=step_s, horizon_s=horizon_s, max_steps=max_steps)
    never = math.inf
    ordered = sorted(snapshot.pending, key=lambda j: (starts.get(j.id, never), j.id))
    return [QueueEstimate(job_id=j.id, position=i + 1, start_at=starts.get(j.id)) for i, j in enumerate(ordered)]
