"""Tiresias-style discretised two-dimensional least-attained-service (2D-LAS), preemptive."""

from __future__ import annotations

from scheduler.core.types import Bind, Decisions, PendingJob, Preempt, RunningJob, Snapshot
from simulator.policies.placement import FreeIndex, submitted

#: Queue boundaries in attained GPU-seconds (1 GPU-hour, 16 GPU-hours): three queues.
THRESHOLDS = (3600.0, 16 * 3600.0)


class TwoDLas:
    """Jobs in queue k by attained service (GPUs x time run, over all attempts); FIFO inside a queue.

    Each cycle the fleet's GPUs of a type go, in (queue, first submitted, id) order, to
    running and waiting jobs alike; a running job left out is preempted when a waiting job
    of a strictly better queue needs its GPUs (never within the configured minimum runtime
    since it started, and at least ``min_run_s`` (a lease, so jobs near a queue boundary do
    not thrash), never when not preemptible). The policy keeps the attained service
    it has seen, because a snapshot only shows the current attempt.
    """

    def __init__(self, thresholds: tuple[float, ...] = THRESHOLDS, min_run_s: float = 3600.0) -> None:
        self.min_run_s = min_run_s
        self.thresholds = thresholds
        #: Service of finished attempts, and (attempt, started_at, GPUs, last seen) of the current one.
        self.base: dict[str, float] = {}
        self.current: dict[str, tuple[int, float, int, float]] = {}
        #: First submit time of every job seen waiting (a running job's snapshot lacks it).
        self.submit: dict[str, float] = {}
        self.index = FreeIndex()

    def _attained(self, job_id: str) -> float:
        return self.base.get(job_id, 0.0)

    def _queue(self, service: float) -> int:
        for k, bound in enumerate(self.thresholds):
            if service < bound:
                return k
        return len(self.thresholds)

    def __call__(self, snapshot: Snapshot, now: float) -> Decisions:
        seen: set[str] = set()
        service: dict[str, float] = {}
        for r in snapshot.running:
            seen.add(r.id)
            cur = self.current.get(r.id)
            if cur is not None and cur[0] != r.attempt:
                self.base[r.id] = self.base.get(r.id, 0.0) + cur[2] * (cur[3] - cur[1])
            self.current[r.id] = (r.attempt, r.started_at, r.gpu_count, now)
            service[r.id] = self._attained(r.id) + r.gpu_count * (now - r.started_at)
        for job_id in [j for j in self.current if j not in seen]:
            _, started, gpus, last = self.current.pop(job_id)
            self.base[job_id] = self.base.get(job_id, 0.0) + gpus * (last - started)
        for job in snapshot.pending:
            service[job.id] = self._attained(job.id)

        capacity: dict[str, int] = {}
        for n in snapshot.nodes:
            if n.schedulable:
                capacity[n.gpu_type] = capacity.get(n.gpu_type, 0) + n.gpu_count
        for p in snapshot.pending:
            self.submit.setdefault(p.id, submitted(p))
        # (queue, first submitted, id, GPU type, GPUs, the running job or None, the waiting job or None)
        entries: list[tuple[int, float, str, str, int, RunningJob | None, PendingJob | None]] = []
        for r in snapshot.running:
            entries.append((self._queue(service[r.id]), self.submit.get(r.id, r.started_at), r.id, r.gpu_type, r.gpu_count, r, None))
        for p in snapshot.pending:
            entries.append((self._queue(service[p.id]), submitted(p), p.id, p.gpu_type, p.gpu_count, None, p))
        # Tie-breaks: 1. queue (less attained service first), 2. first submitted, 3. job id.
        entries.sort(key=lambda e: (e[0], e[1], e[2]))
        budget = dict(capacity)
        wanted: list[PendingJob] = []
        left_out: list[tuple[int, RunningJob]] = []
        best_waiting: dict[str, tuple[int, str]] = {}
        for queue, _, job_id, gpu_type, gpus, run, pend in entries:
            fits = budget.get(gpu_type, 0) >= gpus
            if fits:
                budget[gpu_type] -= gpus
            if run is not None and not fits:
                left_out.append((queue, run))
            elif pend is not None and fits:
                wanted.append(pend)
                best_waiting.setdefault(gpu_type, (queue, job_id))

        index = self.index
        index.sync(snapshot)
        needed: dict[str, int] = {}
        for p in wanted:
            needed[p.gpu_type] = needed.get(p.gpu_type, 0) + p.gpu_count
        preempts: list[Preempt] = []
        min_run = max(snapshot.config.min_runtime_before_preempt_s, self.min_run_s)
        for queue, run in reversed(left_out):
            head = best_waiting.get(run.gpu_type)
            if head is None or head[0] >= queue or not run.preemptible or now - run.started_at < min_run:
                continue
            if index.free_gpus(run.gpu_type) >= needed.get(run.gpu_type, 0):
                continue
            preempts.append(Preempt(job_id=run.id, attempt=run.attempt, for_job=head[1], reason="las"))
            index.give(run.members)
        binds: list[Bind] = []
        placed: set[str] = set()
        for p in wanted:
            members = index.place(p)
            if members is not None:
                binds.append(Bind(job_id=p.id, attempt=p.attempt, members=members))
                placed.add(p.id)
        # Work conservation: whatever else still fits starts, in the same order.
        for entry in entries:
            pend = entry[6]
            if pend is not None and pend.id not in placed:
                members = index.place(pend)
                if members is not None:
                    binds.append(Bind(job_id=pend.id, attempt=pend.attempt, members=members))
        for job_id in [j for j in self.submit if j not in service]:
            del self.submit[job_id]
        return Decisions(binds=tuple(binds), preemptions=tuple(preempts))
