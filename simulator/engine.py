"""The discrete-event engine: a virtual clock, a fleet, a workload and one policy.

Every policy is a callable ``(Snapshot, now) -> Decisions`` (the production core's
contract). The engine builds full snapshots (nodes with free GPUs, the queue, tenants with
quotas and decayed usage, running jobs with their members and checkpoints), calls the
policy, and applies what it decided: preemptions first (the victim loses the work since its
last checkpoint and goes back to the queue), then bindings (checked: whole gang, free GPUs,
right type, one topology domain). Elastic jobs' resizes (SPEC R9.2) are applied between the two:
the job stops, keeps the work up to its last checkpoint, and restarts at once at its new size
(the same attempt, paying the restart overhead), running at the speed its size gives it
(:func:`simulator.workload.speed`).

Cycles follow the placement service: one runs after anything that changes the queue or
the free capacity, on a grid of ``cycle_s`` seconds (events inside one grid step share a
cycle), and at least every ``tick_s`` while jobs wait (aging, max-wait and attained-service
rules need time to pass).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from scheduler.core.predict import Key, RuntimePredictor
from scheduler.core.types import (
    Decisions,
    Member,
    NodeView,
    PendingJob,
    Reservation,
    Resize,
    RunningJob,
    SchedulerConfig,
    Snapshot,
    TenantView,
)
from simulator.fleet import Fleet, TenantSpec
from simulator.workload import SPEEDUP_EXPONENT, SimJob, Workload, resolve_tenants, speed

Policy = Callable[[Snapshot, float], Decisions]
#: Called as ``on_cycle(snapshot, now, new_job_ids)`` before the policy runs (the estimator hooks in here).
CycleHook = Callable[[Snapshot, float, list[str]], None]

_PENDING, _RUNNING, _DONE, _NEVER = 0, 1, 2, 3
_FINISH, _NODE_FAIL, _NODE_REPAIR, _GPU_FAIL, _GPU_REPAIR, _SAMPLE, _CKPT, _EXPECT = range(8)


class SimulationError(RuntimeError):
    """A policy decided something impossible (in strict mode), or the run cannot go on."""


@dataclass(frozen=True)
class SimOptions:
    """Knobs of one run."""

    #: Cycles land on this grid (seconds); 0: a cycle at every event time.
    cycle_s: float = 30.0
    #: While jobs wait, a cycle at least this often.
    tick_s: float = 300.0
    #: Paid again (as lost GPU time) by every restart after a preemption or failure.
    restart_overhead_s: float = 120.0
    #: Sampling step for utilisation, demand and shares; None: about 1,500 samples.
    sample_s: float | None = None
    #: Mean time between failures of one node (hours); None: no node failures.
    node_mtbf_h: float | None = None
    node_repair_h: float = 4.0
    #: Mean time between fatal faults of one GPU (hours); None: none.
    gpu_mtbf_h: float | None = None
    gpu_repair_h: float = 24.0
    #: Give the policy the true remaining run time as ``expected_runtime_s`` (the SJF oracle).
    oracle_runtime: bool = False
    #: Give the policy learned run times: ``expected_runtime_s`` and running jobs' ``expected_end`` from a
    #: :class:`scheduler.core.predict.RuntimePredictor` fed with the jobs finished so far (never the future).
    learned_runtimes: bool = False
    #: Refresh running jobs' ``last_checkpoint_at`` as checkpoints happen (costs time; only
    #: policies that plan preemptions need it).
    fresh_checkpoints: bool = True
    #: Raise on an impossible decision instead of counting and skipping it.
    strict: bool = False
    #: Tenants' decayed usage in the snapshot is recomputed at most this often (it moves
    #: slowly: the half-life is a day).
    usage_refresh_s: float = 300.0
    #: Run elastic jobs as fixed jobs at their maximum (the rigid baseline of the same workload).
    rigid: bool = False
    #: An elastic job at g of its m GPUs runs at ``(g / m) ** speedup_exponent`` of its full speed.
    speedup_exponent: float = SPEEDUP_EXPONENT
    seed: int = 0
    config: SchedulerConfig = field(default_factory=SchedulerConfig)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job."""

    id: str
    tenant: str
    gpu_type: str
    #: Its size (an elastic job's maximum: the size the trace recorded).
    gpu_count: int
    submit: float
    first_start: float | None
    finish: float | None
    #: Total time spent waiting in the queue, over all attempts.
    queued_s: float
    #: GPU-seconds held (useful, lost and restart overhead).
    held_gpu_s: float
    #: GPU-seconds lost to preemptions and failures (work since the last checkpoint, restart overhead).
    lost_gpu_s: float
    preemptions: int
    failures: int
    duration_s: float
    #: An elastic job's maximum (None: fixed, or run rigid); its resizes and the GPU-seconds they lost.
    gpu_max: int | None = None
    resizes: int = 0
    resize_lost_gpu_s: float = 0.0


@dataclass
class Samples:
    """Fleet state on a regular time grid."""

    times: list[float] = field(default_factory=list)
    #: Per sample, per GPU type (``types`` order): GPUs held, GPUs demanded (held + queued), schedulable GPUs.
    used: list[list[int]] = field(default_factory=list)
    demand: list[list[int]] = field(default_factory=list)
    capacity: list[list[int]] = field(default_factory=list)
    #: Per sample, per tenant (``tenants`` order): GPUs held; and GPUs demanded per type.
    tenant_used: list[list[int]] = field(default_factory=list)
    tenant_demand: list[list[list[int]]] = field(default_factory=list)
    #: Free GPUs stranded on partly used nodes, and all free schedulable GPUs.
    stranded: list[int] = field(default_factory=list)
    free: list[int] = field(default_factory=list)
    queued_jobs: list[int] = field(default_factory=list)


@dataclass
class SimResult:
    policy: str
    records: list[JobRecord]
    samples: Samples
    types: list[str]
    capacity: dict[str, int]
    tenants: tuple[TenantSpec, ...]
    preemptions: int = 0
    failures: int = 0
    #: Resizes applied, by direction ("grow", "shrink").
    resizes: dict[str, int] = field(default_factory=dict)
    invalid: list[str] = field(default_factory=list)
    cycles: int = 0
    wall_s: float = 0.0
    policy_s: float = 0.0
    end_time: float = 0.0


class _Job:
    __slots__ = (
        "attempt",
        "done_s",
        "epoch",
        "expect_at",
        "expected_for",
        "failures",
        "finish",
        "first_start",
        "gmax",
        "gmin",
        "gpus",
        "held_gpu_s",
        "idx",
        "job",
        "keys",
        "last_ckpt",
        "lost_gpu_s",
        "members",
        "overhead_s",
        "preemptions",
        "queued_at",
        "queued_s",
        "rate",
        "resize_lost_gpu_s",
        "resized_at",
        "resizes",
        "started_at",
        "state",
        "tenant_i",
        "type_i",
    )  # fmt: skip

    def __init__(self, idx: int, job: SimJob, tenant_i: int, type_i: int, rigid: bool) -> None:
        self.idx, self.job, self.tenant_i, self.type_i = idx, job, tenant_i, type_i
        #: Its range: a fixed job (or an elastic one run rigid, at its maximum) has gmin == gmax.
        self.gmax = job.gpu_max if job.gpu_max is not None and job.gpu_max > job.gpu_count else job.gpu_count
        self.gmin = self.gmax if rigid else job.gpu_count
        #: GPUs held now, and the speed they give (work-seconds per second; 1 at its maximum).
        self.gpus = 0
        self.rate = 1.0
        #: Counts starts and resizes: events of an older run of the job are stale.
        self.epoch = 0
        #: When its live look-again event falls (None: none); an event at another time is stale.
        self.expect_at: float | None = None
        #: Learned run times: (epoch, the prediction before any work, how long after its start the run is expected to
        #: end) while that prediction holds, i.e. until its work reaches it or the predictor learns its key (None: none).
        self.expected_for: tuple[int, float, float] | None = None
        self.resizes = 0
        self.resize_lost_gpu_s = 0.0
        self.resized_at: float | None = None
        #: What the predictor learns it under: the tenant's jobs of its size (the trace has no job names), the tenant's.
        self.keys: tuple[Key, ...] = ((job.tenant, f"{self.gmax} GPUs"), (job.tenant,))
        self.last_ckpt: float | None = None
        self.attempt = 0
        self.done_s = 0.0
        self.state = _PENDING
        self.queued_at = 0.0
        self.queued_s = 0.0
        self.started_at = 0.0
        self.overhead_s = 0.0
        self.members: tuple[Member, ...] = ()
        self.first_start: float | None = None
        self.finish: float | None = None
        self.held_gpu_s = 0.0
        self.lost_gpu_s = 0.0
        self.preemptions = 0
        self.failures = 0


def _renewed(view: RunningJob, expected_end: float, last_checkpoint_at: float | None) -> RunningJob:
    """``dataclasses.replace(view, expected_end=..., last_checkpoint_at=...)`` at a fraction of its cost (the engine
    renews millions of views in a long run): a copy of the frozen view's fields with those two replaced."""
    renewed = object.__new__(RunningJob)
    fields = renewed.__dict__
    fields.update(view.__dict__)
    fields["expected_end"] = expected_end
    fields["last_checkpoint_at"] = last_checkpoint_at
    return renewed


class Engine:
    """One simulation run; use :func:`simulate`."""

    def __init__(self, workload: Workload, fleet: Fleet, policy: Policy, name: str, options: SimOptions) -> None:
        self.opt = options
        self.policy = policy
        self.name = name
        self.fleet = fleet
        self.rng = random.Random(options.seed)
        self.tenants = resolve_tenants(fleet, workload)
        self.tenant_index = {t.name: i for i, t in enumerate(self.tenants)}
        self.types = sorted(fleet.capacity())
        self.type_index = {t: i for i, t in enumerate(self.types)}
        self.capacity = fleet.capacity()
        nodes = fleet.nodes
        self.nodes = nodes
        self.node_index = {n.id: i for i, n in enumerate(nodes)}
        self.node_type_i = [self.type_index[n.gpu_type] for n in nodes]
        self.free: list[set[int]] = [set(range(n.gpus)) for n in nodes]
        self.owner: list[dict[int, int]] = [{} for _ in nodes]
        self.up = [True] * len(nodes)
        self.broken: list[set[int]] = [set() for _ in nodes]
        #: When each node last had GPUs freed (elastic jobs grow only onto GPUs idle long enough).
        self.freed_at = [0.0] * len(nodes)
        self.views: list[NodeView] = [self._view(i) for i in range(len(nodes))]
        self.stale_views: set[int] = set()
        self.nodes_tuple: tuple[NodeView, ...] | None = None
        self.domains: list[dict[str, str]] = [dict(n.labels) for n in nodes]
        for job in workload.jobs:
            if job.gpu_type not in self.type_index:
                raise SimulationError(f"job {job.id}: GPU type {job.gpu_type} is not in the fleet")
        self.jobs = [
            _Job(i, j, self.tenant_index[j.tenant], self.type_index[j.gpu_type], options.rigid) for i, j in enumerate(workload.jobs)
        ]
        self.job_index = {j.job.id: i for i, j in enumerate(self.jobs)}
        #: Submission times, in the order the engine takes the jobs (the workload's).
        self.submits = [j.submit_s for j in workload.jobs]
        self.pending: dict[int, PendingJob] = {}
        #: Running elastic jobs below their maximum: cycles go on while there are any (they may grow).
        self.growable: set[int] = set()
        self.running: dict[int, RunningJob] = {}
        #: ``self.running``'s views as the last snapshot listed them; None once one changed. An unchanged tuple
        #: (the same object) costs the policy's incremental sync nothing.
        self.running_tuple: tuple[RunningJob, ...] | None = None
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.next_arrival = 0
        self.done = 0
        self.cycle_at: float | None = None
        self.new_ids: list[str] = []
        self.outstanding_repairs = 0
        self.result = SimResult(policy=name, records=[], samples=Samples(), types=self.types, capacity=self.capacity, tenants=self.tenants)
        nt, ntypes = len(self.tenants), len(self.types)
        self.tenant_used = [0] * nt
        self.tenant_demand = [[0] * ntypes for _ in range(nt)]
        self.type_used = [0] * ntypes
        self.type_demand = [0] * ntypes
        # Decayed usage per (tenant, type): value at ``usage_t``, growing at the tenant's held GPUs.
        self.usage = [[0.0] * ntypes for _ in range(nt)]
        self.usage_rate = [[0] * ntypes for _ in range(nt)]
        self.usage_t = [[0.0] * ntypes for _ in range(nt)]
        self.decay = math.log(2) / options.config.usage_half_life_s
        self.tenant_cache: tuple[float, tuple[TenantView, ...]] | None = None
        #: The last cycle's reservations (and nominations), fed back to the next cycle as the service does.
        self.reservations: tuple[Reservation, ...] = ()
        #: Run times learned from the jobs finished so far (with ``learned_runtimes``).
        self.predictor = RuntimePredictor()
        #: The policy is told learned run times (not the oracle's true ones).
        self.learning = options.learned_runtimes and not options.oracle_runtime
        #: Running jobs by their most specific predictor key; each tenant's keys that ran; the keys the predictor has
        #: runs of; the keys whose running jobs' predictions a finished run changed since the last snapshot.
        self.running_by_key: dict[Key, set[int]] = {}
        self.tenant_keys: dict[str, set[Key]] = {}
        self.learned_keys: set[Key] = set()
        self.relearned: set[Key] = set()

    # ----------------------------------------------------------------- events
    def _push(self, t: float, kind: int, a: int, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def _want_cycle(self, t: float) -> None:
        if not self.pending and not self.growable:
            return
        q = self.opt.cycle_s
        at = max(t, math.ceil(t / q) * q) if q > 0 else t
        if self.cycle_at is None or at < self.cycle_at:
            self.cycle_at = at

    def _touch(self, node_i: int) -> None:
        self.stale_views.add(node_i)
        self.nodes_tuple = None

    def _account(self, js: _Job, now: float, gpus: int, running: int) -> None:
        """Change a tenant's held GPUs (and its decayed usage's growth rate) at ``now``."""
        ti, ty = js.tenant_i, js.type_i
        self._settle_usage(ti, ty, now)
        self.usage_rate[ti][ty] += gpus * running
        self.tenant_used[ti] += gpus * running
        self.type_used[ty] += gpus * running

    def _settle_usage(self, ti: int, ty: int, now: float) -> None:
        dt = now - self.usage_t[ti][ty]
        if dt > 0:
            k = math.exp(-self.decay * dt)
            self.usage[ti][ty] = self.usage[ti][ty] * k + self.usage_rate[ti][ty] * (1 - k) / self.decay
            self.usage_t[ti][ty] = now

    def _enqueue(self, js: _Job, now: float) -> None:
        js.attempt += 1
        js.state = _PENDING
        js.queued_at = now
        job = js.job
        expected: float | None = None
        if self.opt.oracle_runtime:
            expected = self._true_remaining(js)
        elif self.opt.learned_runtimes:
            expected = self._learned_remaining(js)
        self.pending[js.idx] = self._pending_view(js, now, expected, attempt=js.attempt, job_id=job.id, submitted_at=job.submit_s)
        self.tenant_demand[js.tenant_i][js.type_i] += js.gmin
        self.type_demand[js.type_i] += js.gmin
        self.new_ids.append(job.id)
        self._want_cycle(now)

    def _true_remaining(self, js: _Job) -> float:
        """A waiting job's true remaining run time (with the restart overhead of a later attempt)."""
        overhead = self.opt.restart_overhead_s if js.attempt > 1 else 0.0
        return (js.job.duration_s - js.done_s) / self._speed(js, js.gmin) + overhead

    def _fresh_runtime(self, js: _Job) -> float:
        """A job's whole true run time, started afresh at its minimum."""
        return js.job.duration_s / self._speed(js, js.gmin)

    def _run_left(self, js: _Job) -> float:
        """A running job's true run time from its (re)start: the restart overhead, then the work left at its speed."""
        return js.overhead_s + (js.job.duration_s - js.done_s) / js.rate

    def _learned_remaining(self, js: _Job) -> float:
        """A waiting job's predicted remaining run time, from the runs finished so far."""
        overhead = self.opt.restart_overhead_s if js.attempt > 1 else 0.0
        predicted = self.predictor.predict(js.keys, js.job.max_runtime_s, js.done_s)
        return min(js.job.max_runtime_s, (predicted - js.done_s) / self._speed(js, js.gmin) + overhead)

    def _pending_view(
        self, js: _Job, queued_at: float, expected: float | None, *, attempt: int, job_id: str, submitted_at: float
    ) -> PendingJob:
        job = js.job
        return PendingJob(
            id=job_id,
            tenant=job.tenant,
            attempt=attempt,
            gpu_type=job.gpu_type,
            gpu_count=js.gmin,
            gpu_max=js.gmax if js.gmax > js.gmin else None,
            priority=job.priority,
            queued_at=queued_at,
            topology_level=job.topology_level,
            topology_required=True,
            max_runtime_s=job.max_runtime_s,
            expected_runtime_s=expected,
            preemptible=job.preemptible,
            submitted_at=submitted_at,
        )

    def arrivals(self, start: float, end: float, *, true_runtimes: bool, shift_s: float = 0.0, prefix: str = "") -> list[PendingJob]:
        """The jobs submitted in ``(start, end]`` (after a snapshot at ``start``), each as a new job joining the queue
        ``shift_s`` after its submission, with its true run time or the one learned from the runs finished so far; ids
        prefixed with ``prefix``. For
        studies of what the jobs that arrive after an estimate change: the future itself, or the recent past
        replayed as a guess of it. The policies never see these."""
        out = []
        for js in self.jobs[bisect.bisect_right(self.submits, start) : bisect.bisect_right(self.submits, end)]:
            job = js.job
            if true_runtimes:
                expected = self._fresh_runtime(js)
            else:
                expected = min(job.max_runtime_s, self.predictor.predict(js.keys, job.max_runtime_s))
            at = job.submit_s + shift_s
            out.append(self._pending_view(js, at, expected, attempt=1, job_id=prefix + job.id, submitted_at=at))
        return out

    def _speed(self, js: _Job, gpus: int) -> float:
        return speed(gpus, js.gmax, self.opt.speedup_exponent) if js.gmax > js.gmin else 1.0

    def _take(self, js: _Job, members: tuple[Member, ...]) -> None:
        for m in members:
            ni = self.node_index[m.node_id]
            free, owner = self.free[ni], self.owner[ni]
            for g in m.gpu_indices:
                free.discard(g)
                owner[g] = js.idx
            self._touch(ni)

    def _give(self, js: _Job, gpus: Iterable[tuple[int, int]], now: float) -> None:
        """Give back (node index, GPU) pairs the job holds."""
        for ni, g in gpus:
            if self.owner[ni].get(g) == js.idx:
                del self.owner[ni][g]
                if g not in self.broken[ni]:
                    self.free[ni].add(g)
                self.freed_at[ni] = now
                self._touch(ni)

    def _run(self, js: _Job, now: float) -> None:
        """(Re)start the job's run at its current size: its end and its first checkpoint."""
        job = js.job
        js.epoch += 1
        js.expect_at = None
        js.started_at = now
        js.rate = self._speed(js, js.gpus)
        if js.gpus < js.gmax:
            self.growable.add(js.idx)
        else:
            self.growable.discard(js.idx)
        run = self._run_left(js)
        self._push(now + run, _FINISH, js.idx, js.epoch)
        js.last_ckpt = None
        self._expect(js, now)
        if self.opt.fresh_checkpoints and math.isfinite(job.checkpoint_interval_s):
            first = now + js.overhead_s + job.checkpoint_interval_s
            if first < now + run:
                self._push(first, _CKPT, js.idx, js.epoch)

    def _start(self, js: _Job, members: tuple[Member, ...], now: float) -> None:
        del self.pending[js.idx]
        js.state = _RUNNING
        js.queued_s += now - js.queued_at
        if js.first_start is None:
            js.first_start = now
        js.members = members
        js.gpus = sum(len(m.gpu_indices) for m in members)
        js.resized_at = None
        js.overhead_s = self.opt.restart_overhead_s if js.attempt > 1 else 0.0
        self._take(js, members)
        self._account(js, now, js.gpus, 1)
        if self.learning:
            self.running_by_key.setdefault(js.keys[0], set()).add(js.idx)
            self.tenant_keys.setdefault(js.job.tenant, set()).add(js.keys[0])
        self._run(js, now)

    def _expect(self, js: _Job, now: float, *, renew: bool = False) -> None:
        """Refresh the job's view for the policy at ``now``; with learned run times, look again when it outlives the prediction.

        One look-again event per job is live: the one for its latest view's expected end (a view refreshed at a
        checkpoint with the same end keeps it; an event for an earlier view is stale and skipped when it falls).
        A view equal to the one listed is kept as it is, so the snapshot's running tuple stays the same object.
        ``renew``: the job has not restarted or changed size since its view was made (a checkpoint, a look again), so
        only its expected end and checkpoint can differ: the view is the listed one with those two fields replaced.
        """
        old = self.running.get(js.idx)
        if renew and old is not None:
            expected_end = js.started_at + self._expected_s(js, now)
            unchanged = expected_end == old.expected_end and js.last_ckpt == old.last_checkpoint_at
            view = old if unchanged else _renewed(old, expected_end, js.last_ckpt)
        else:
            view = self._running_view(js, now)
            if view == old:
                view = old
        if view is not old:
            self.running[js.idx] = view
            self.running_tuple = None
        if self.learning:
            end = js.started_at + self._run_left(js)
            if view.expected_end < end:
                at = max(view.expected_end, now + 1.0)
                if at != js.expect_at:
                    js.expect_at = at
                    self._push(at, _EXPECT, js.idx, js.epoch)
            else:
                js.expect_at = None

    def _relearned(self, finished: _Job) -> None:
        """The predictor learned ``finished``'s run: the running jobs whose prediction that can change are brought up to
        date at the next snapshot, as the placement service's reader recomputes a tenant's running jobs when its runs
        change. They are the jobs of its most specific key, and its tenant's jobs whose most specific key has no runs
        yet (they fall back to the tenant's key). A waiting job keeps the prediction it got when queued, as the service
        keeps the one it stored for the attempt."""
        first = finished.keys[0]
        self.relearned.add(first)
        for key in self.tenant_keys.get(finished.job.tenant, ()):
            if key not in self.learned_keys:
                self.relearned.add(key)
        self.learned_keys.add(first)

    def _refresh_relearned(self, now: float) -> None:
        jobs = self.jobs
        for key in sorted(self.relearned):
            for i in sorted(self.running_by_key.get(key, ())):
                self._expect(jobs[i], now, renew=True)
        self.relearned.clear()

    def with_true_runtimes(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot as the SJF oracle sees it: each waiting job's ``expected_runtime_s`` its true remaining run
        time, each running job's ``expected_end`` its true end (at its current speed). For studies of what the
        learned run times cost an estimate; the policies never see it unless run as the oracle."""
        pending = []
        for job in snapshot.pending:
            js = self.jobs[self.job_index[job.id]]
            pending.append(dataclasses.replace(job, expected_runtime_s=min(js.job.max_runtime_s, self._true_remaining(js))))
        running = []
        for r in snapshot.running:
            js = self.jobs[self.job_index[r.id]]
            running.append(dataclasses.replace(r, expected_end=js.started_at + self._run_left(js)))
        return dataclasses.replace(snapshot, pending=tuple(pending), running=tuple(running))

    def true_times(self, snapshot: Snapshot, arrivals: Iterable[PendingJob] = ()) -> tuple[dict[str, float], dict[str, float]]:
        """For a replay of the future as it will happen: each running job's true end, and each waiting or arriving
        job's true run time (arrivals by the ids :meth:`arrivals` gives them, unprefixed)."""
        view = self.with_true_runtimes(snapshot)
        ends = {r.id: r.expected_end for r in view.running}
        runtimes = {j.id: j.expected_s for j in view.pending}
        for job in arrivals:
            runtimes[job.id] = self._fresh_runtime(self.jobs[self.job_index[job.id]])
        return ends, runtimes

    def _expected_s(self, js: _Job, now: float) -> float:
        """How long after its (re)start the job is expected to end, as the policy is told at ``now``."""
        job = js.job
        if self.opt.oracle_runtime:
            return self._run_left(js)
        if self.opt.learned_runtimes:
            # The work done by now (at full speed), the predicted total, corrected once outlived.
            worked = js.done_s + max(0.0, now - js.started_at - js.overhead_s) * js.rate
            held = js.expected_for
            if held is not None and held[0] == js.epoch and worked < held[1] and js.keys[0] not in self.relearned:
                return max(held[2], now - js.started_at)  # most checkpoints: the prediction still holds
            predicted = self.predictor.predict(js.keys, job.max_runtime_s, worked)
            expected = min(job.max_runtime_s, js.overhead_s + max(0.0, predicted - js.done_s) / js.rate)
            js.expected_for = (js.epoch, self._holds_until(js, worked, predicted), expected)
            return max(expected, now - js.started_at)
        return max(job.max_runtime_s, self._run_left(js))

    def _holds_until(self, js: _Job, worked: float, predicted: float) -> float:
        """How much work the job can reach (from ``worked``, within its run) with the predictor still giving
        ``predicted``, as long as it learns nothing of the job's keys. Short of its first prediction, it gives that
        prediction; once that is outlived, the smallest doubling of it beyond the work (the cap at most), for any
        work short of that doubling; the cap, for any work short of the cap. The margins keep clear of the rounding
        of the doubling's log2, which may double once more for work within a few ulps below a doubling (the cap's
        case is left to that chance, about 1e-15 a prediction). 0.0: none known (ask every time)."""
        cap = js.job.max_runtime_s
        if predicted == cap:
            return cap
        if predicted / 2.0 <= worked < predicted:  # the smallest doubling beyond the work (or the first prediction)
            return predicted * (1.0 - 1e-9)
        if worked < predicted / 2.0 * (1.0 - 1e-9):  # no doubling reaches this far below: the first prediction
            return predicted
        return 0.0

    def _running_view(self, js: _Job, now: float) -> RunningJob:
        job = js.job
        expected = self._expected_s(js, now)
        elastic = js.gmax > js.gmin
        return RunningJob(
            id=job.id,
            tenant=job.tenant,
            attempt=js.attempt,
            gpu_type=job.gpu_type,
            gpu_count=js.gpus,
            priority=job.priority,
            members=js.members,
            started_at=js.started_at,
            expected_end=js.started_at + expected,
            last_checkpoint_at=js.last_ckpt,
            preemptible=job.preemptible,
            gpu_min=js.gmin if elastic else None,
            gpu_max=js.gmax if elastic else None,
            topology_level=job.topology_level,
            resized_at=js.resized_at,
        )

    def _release(self, js: _Job, now: float) -> None:
        self._give(js, [(self.node_index[m.node_id], g) for m in js.members for g in m.gpu_indices], now)
        js.held_gpu_s += (now - js.started_at) * js.gpus
        self._account(js, now, js.gpus, -1)
        self.tenant_demand[js.tenant_i][js.type_i] -= js.gpus
        self.type_demand[js.type_i] -= js.gpus
        del self.running[js.idx]
        self.running_tuple = None
        if self.learning:
            self.running_by_key[js.keys[0]].discard(js.idx)
        js.expect_at = None
        self.growable.discard(js.idx)
        js.members = ()
        js.gpus = 0

    def _save(self, js: _Job, now: float) -> float:
        """Keep the run's work up to its last checkpoint; the GPU-seconds lost since (and to the restart overhead)."""
        job = js.job
        useful = max(0.0, now - js.started_at - js.overhead_s)
        interval = job.checkpoint_interval_s
        saved_wall = math.floor(useful / interval) * interval if math.isfinite(interval) else 0.0
        saved = min(saved_wall * js.rate, job.duration_s - js.done_s)
        js.done_s += saved
        return (now - js.started_at - saved / js.rate) * js.gpus

    def _stop(self, js: _Job, now: float, *, failure: bool) -> None:
        """Stop a running attempt; keep the work up to its last checkpoint and queue it again."""
        js.lost_gpu_s += self._save(js, now)
        self._release(js, now)
        if failure:
            js.failures += 1
            self.result.failures += 1
        else:
            js.preemptions += 1
            self.result.preemptions += 1
        self._enqueue(js, now)

    def _resize(self, js: _Job, members: tuple[Member, ...], now: float) -> None:
        """Stop every member, keep the work up to the last checkpoint, change the GPUs, restart at the new size at once."""
        js.resize_lost_gpu_s += self._save(js, now)
        js.held_gpu_s += (now - js.started_at) * js.gpus
        new = {(self.node_index[m.node_id], g) for m in members for g in m.gpu_indices}
        old = {(self.node_index[m.node_id], g) for m in js.members for g in m.gpu_indices}
        self._give(js, sorted(old - new), now)
        self._take(js, members)
        gpus = len(new)
        self._account(js, now, gpus - js.gpus, 1)
        self.tenant_demand[js.tenant_i][js.type_i] += gpus - js.gpus
        self.type_demand[js.type_i] += gpus - js.gpus
        direction = "grow" if gpus > js.gpus else "shrink"
        self.result.resizes[direction] = self.result.resizes.get(direction, 0) + 1
        js.gpus, js.members = gpus, members
        js.resizes += 1
        js.resized_at = now
        js.overhead_s = self.opt.restart_overhead_s
        self._run(js, now)
        self._want_cycle(now)

    def _finish(self, js: _Job, now: float) -> None:
        self._release(js, now)
        if self.opt.learned_runtimes:
            self.predictor.observe(js.keys, js.job.duration_s, js.job.max_runtime_s)
            if self.learning:
                self._relearned(js)
        js.state = _DONE
        js.finish = now
        self.done += 1
        self._want_cycle(now)

    # ------------------------------------------------------------- snapshot
    def _node_views(self) -> tuple[NodeView, ...]:
        if self.nodes_tuple is None:
            for i in self.stale_views:
                self.views[i] = self._view(i)
            self.stale_views.clear()
            self.nodes_tuple = tuple(self.views)
        return self.nodes_tuple

    def _view(self, i: int) -> NodeView:
        n = self.nodes[i]
        return NodeView(
            id=n.id,
            gpu_type=n.gpu_type,
            gpu_count=n.gpus,
            labels=n.labels,
            free=frozenset(self.free[i]),
            schedulable=self.up[i],
            free_since=self.freed_at[i],
        )

    def _tenant_views(self, now: float) -> tuple[TenantView, ...]:
        if self.tenant_cache is not None and now - self.tenant_cache[0] < self.opt.usage_refresh_s:
            return self.tenant_cache[1]
        out = []
        for ti, t in enumerate(self.tenants):
            usage = []
            for ty, name in enumerate(self.types):
                self._settle_usage(ti, ty, now)
                if self.usage[ti][ty] > 0:
                    usage.append((name, self.usage[ti][ty]))
            out.append(TenantView(name=t.name, weight=t.weight, cohort=t.cohort, quotas=t.quotas, decayed_usage=tuple(usage)))
        self.tenant_cache = (now, tuple(out))
        return self.tenant_cache[1]

    def _running_views(self) -> tuple[RunningJob, ...]:
        if self.running_tuple is None:
            self.running_tuple = tuple(self.running.values())
        return self.running_tuple

    def snapshot(self, now: float) -> Snapshot:
        if self.relearned:
            self._refresh_relearned(now)
        return Snapshot(
            nodes=self._node_views(),
            pending=tuple(self.pending.values()),
            topology_levels=self.fleet.topology_levels,
            tenants=self._tenant_views(now),
            running=self._running_views(),
            config=self.opt.config,
            reservations=self.reservations,
        )

    # ---------------------------------------------------------------- cycle
    def _invalid(self, message: str) -> None:
        if self.opt.strict:
            raise SimulationError(f"{self.name}: {message}")
        self.result.invalid.append(message)

    def _check_members(self, js: _Job, members: tuple[Member, ...], *, resize: bool = False) -> str | None:
        job = js.job
        what = "resize" if resize else "bind"
        count = sum(len(m.gpu_indices) for m in members)
        if resize and not js.gmin <= count <= js.gmax:
            return f"resize of {job.id} to {count} GPUs, outside its range {js.gmin}-{js.gmax}"
        if not resize and count != js.gmin:
            return f"bind of {job.id} gives {count} GPUs, it needs {js.gmin}"
        seen: set[str] = set()
        domains: set[str | None] = set()
        for m in members:
            ni = self.node_index.get(m.node_id)
            if ni is None or m.node_id in seen:
                return f"bind of {job.id} names node {m.node_id} twice or unknown"
            seen.add(m.node_id)
            if self.nodes[ni].gpu_type != job.gpu_type or not self.up[ni]:
                return f"{what} of {job.id} on {m.node_id}: wrong GPU type or node down"
            mine = {g for g, owner in self.owner[ni].items() if owner == js.idx} if resize else set()
            if len(set(m.gpu_indices)) != len(m.gpu_indices) or not set(m.gpu_indices) <= self.free[ni] | mine:
                return f"{what} of {job.id} on {m.node_id}: GPUs {m.gpu_indices} are not free"
            level = job.topology_level
            domains.add(m.node_id if level == "node" else self.domains[ni].get(level))
        if len(domains) != 1 or None in domains:
            return f"{what} of {job.id} spans more than one {job.topology_level}"
        return None

    def _apply_resize(self, r: Resize, now: float) -> None:
        i = self.job_index.get(r.job_id)
        js = self.jobs[i] if i is not None else None
        if js is None or js.state != _RUNNING or js.attempt != r.attempt or js.gmax == js.gmin:
            self._invalid(f"resize of {r.job_id} (attempt {r.attempt}), which is not a running elastic job")
            return
        problem = self._check_members(js, r.members, resize=True)
        if problem:
            self._invalid(problem)
            return
        self._resize(js, r.members, now)

    def _cycle(self, now: float, hook: CycleHook | None) -> None:
        self.cycle_at = None
        snap = self.snapshot(now)
        if hook is not None:
            hook(snap, now, self.new_ids)
        self.new_ids = []
        t0 = time.perf_counter()
        decisions = self.policy(snap, now)
        self.result.policy_s += time.perf_counter() - t0
        self.result.cycles += 1
        self.reservations = decisions.reservations
        for p in decisions.preemptions:
            i = self.job_index.get(p.job_id)
            if i is None or self.jobs[i].state != _RUNNING or self.jobs[i].attempt != p.attempt:
                self._invalid(f"preemption of {p.job_id} (attempt {p.attempt}), which is not running")
                continue
            self._stop(self.jobs[i], now, failure=False)
        for r in decisions.resizes:
            self._apply_resize(r, now)
        for b in decisions.binds:
            i = self.job_index.get(b.job_id)
            if i is None or self.jobs[i].state != _PENDING or self.jobs[i].attempt != b.attempt or i not in self.pending:
                self._invalid(f"bind of {b.job_id} (attempt {b.attempt}), which is not queued")
                continue
            problem = self._check_members(self.jobs[i], b.members)
            if problem:
                self._invalid(problem)
                continue
            self._start(self.jobs[i], b.members, now)
        if self.cycle_at is not None and self.cycle_at <= now:
            # Preempted jobs came back into the queue: look again at the next grid step, not in a loop now.
            self.cycle_at = now + (self.opt.cycle_s or 1.0)
        if self.pending:
            stuck = not decisions.binds and not decisions.preemptions and not decisions.resizes and not self.running
            if stuck and self.next_arrival >= len(self.jobs) and not self.outstanding_repairs:
                # Nothing will ever change: the remaining jobs can never start.
                for i in list(self.pending):
                    self.jobs[i].state = _NEVER
                    self.done += 1
                self.pending.clear()
                return
            tick = now + self.opt.tick_s
            if self.cycle_at is None or tick < self.cycle_at:
                self.cycle_at = tick
        elif self.growable and (self.cycle_at is None or now + self.opt.tick_s < self.cycle_at):
            self.cycle_at = now + self.opt.tick_s

    # -------------------------------------------------------------- failures
    def _schedule_failures(self, now: float) -> None:
        if self.opt.node_mtbf_h:
            rate = len(self.nodes) / (self.opt.node_mtbf_h * 3600.0)
            self._push(now + self.rng.expovariate(rate), _NODE_FAIL, -1)
        if self.opt.gpu_mtbf_h:
            rate = self.fleet.total_gpus() / (self.opt.gpu_mtbf_h * 3600.0)
            self._push(now + self.rng.expovariate(rate), _GPU_FAIL, -1)

    def _node_fail(self, now: float) -> None:
        rate = len(self.nodes) / (self.opt.node_mtbf_h or 1.0) / 3600.0
        self._push(now + self.rng.expovariate(rate), _NODE_FAIL, -1)
        ni = self.rng.randrange(len(self.nodes))
        if not self.up[ni]:
            return
        self.up[ni] = False
        self._touch(ni)
        for j in sorted(set(self.owner[ni].values())):
            self._stop(self.jobs[j], now, failure=True)
        self.outstanding_repairs += 1
        self._push(now + self.opt.node_repair_h * 3600.0, _NODE_REPAIR, ni)

    def _gpu_fail(self, now: float) -> None:
        rate = self.fleet.total_gpus() / (self.opt.gpu_mtbf_h or 1.0) / 3600.0
        self._push(now + self.rng.expovariate(rate), _GPU_FAIL, -1)
        ni = self.rng.randrange(len(self.nodes))
        g = self.rng.randrange(self.nodes[ni].gpus)
        if g in self.broken[ni]:
            return
        self.broken[ni].add(g)
        self.free[ni].discard(g)
        self._touch(ni)
        if g in self.owner[ni]:
            self._stop(self.jobs[self.owner[ni][g]], now, failure=True)
        self.outstanding_repairs += 1
        self._push(now + self.opt.gpu_repair_h * 3600.0, _GPU_REPAIR, ni, g)

    # -------------------------------------------------------------- samples
    def _sample(self, now: float) -> None:
        s = self.result.samples
        s.times.append(now)
        s.used.append(list(self.type_used))
        s.demand.append(list(self.type_demand))
        cap = [0] * len(self.types)
        stranded = free_total = 0
        for i, n in enumerate(self.nodes):
            if not self.up[i]:
                continue
            f = len(self.free[i])
            cap[self.node_type_i[i]] += n.gpus - len(self.broken[i])
            free_total += f
            if 0 < f < n.gpus:
                stranded += f
        s.capacity.append(cap)
        s.tenant_used.append(list(self.tenant_used))
        s.tenant_demand.append([list(row) for row in self.tenant_demand])
        s.stranded.append(stranded)
        s.free.append(free_total)
        s.queued_jobs.append(len(self.pending))

    # ------------------------------------------------------------------ run
    def run(self, *, hook: CycleHook | None = None, progress: Callable[[int, int], None] | None = None) -> SimResult:
        started = time.perf_counter()
        jobs = self.jobs
        total = len(jobs)
        if total == 0:
            return self.result
        first = jobs[0].job.submit_s
        last = jobs[-1].job.submit_s
        sample_s = self.opt.sample_s or max(60.0, (last - first + 48 * 3600.0) / 1500.0)
        self.freed_at = [first] * len(self.nodes)
        self.views = [self._view(i) for i in range(len(self.nodes))]
        self._push(first, _SAMPLE, 0)
        self._schedule_failures(first)
        report_every = max(1, total // 200)
        next_report = report_every
        now = first
        heap = self.heap
        while self.done < total:
            t_arr = jobs[self.next_arrival].job.submit_s if self.next_arrival < total else math.inf
            t_ev = heap[0][0] if heap else math.inf
            t = min(t_arr, t_ev)
            if self.cycle_at is not None and self.cycle_at < t:
                now = self.cycle_at
                self._cycle(now, hook)
                if progress is not None and self.done >= next_report:
                    progress(self.done, total)
                    next_report = self.done + report_every
                continue
            if t == math.inf:
                raise SimulationError("no events left but jobs unfinished")
            now = t
            if t_arr <= t_ev:
                js = jobs[self.next_arrival]
                self.next_arrival += 1
                self._enqueue(js, now)
                continue
            _, _, kind, a, b = heapq.heappop(heap)
            if kind == _FINISH:
                js = jobs[a]
                if js.state == _RUNNING and js.epoch == b:
                    self._finish(js, now)
            elif kind == _CKPT:
                js = jobs[a]
                if js.state == _RUNNING and js.epoch == b:
                    js.last_ckpt = now
                    # Through _expect: a fresh view's expected end comes from the predictor as it is now, and
                    # must be looked at again once the job outlives it (else it would lapse into the past).
                    self._expect(js, now, renew=True)
                    nxt = now + js.job.checkpoint_interval_s
                    end = js.started_at + self._run_left(js)
                    if nxt < end:
                        self._push(nxt, _CKPT, a, b)
            elif kind == _EXPECT:
                js = jobs[a]
                if js.state == _RUNNING and js.epoch == b and js.expect_at == now:
                    js.expect_at = None
                    self._expect(js, now, renew=True)
            elif kind == _SAMPLE:
                self._sample(now)
                self._push(now + sample_s, _SAMPLE, 0)
            elif kind == _NODE_FAIL:
                self._node_fail(now)
                self._want_cycle(now)
            elif kind == _GPU_FAIL:
                self._gpu_fail(now)
                self._want_cycle(now)
            elif kind == _NODE_REPAIR:
                self.up[a] = True
                self._touch(a)
                self.outstanding_repairs -= 1
                self._want_cycle(now)
            elif kind == _GPU_REPAIR:
                self.broken[a].discard(b)
                if b not in self.owner[a]:
                    self.free[a].add(b)
                self._touch(a)
                self.outstanding_repairs -= 1
                self._want_cycle(now)
        self._sample(now)
        if progress is not None:
            progress(total, total)
        self.result.end_time = now
        self.result.records = [
            JobRecord(
                id=js.job.id,
                tenant=js.job.tenant,
                gpu_type=js.job.gpu_type,
                gpu_count=js.gmax,
                submit=js.job.submit_s,
                first_start=js.first_start,
                finish=js.finish,
                queued_s=js.queued_s,
                held_gpu_s=js.held_gpu_s,
                lost_gpu_s=js.lost_gpu_s,
                preemptions=js.preemptions,
                failures=js.failures,
                duration_s=js.job.duration_s,
                gpu_max=js.gmax if js.gmax > js.gmin else None,
                resizes=js.resizes,
                resize_lost_gpu_s=js.resize_lost_gpu_s,
            )
            for js in jobs
        ]
        self.result.wall_s = time.perf_counter() - started
        return self.result


def simulate(
    workload: Workload,
    fleet: Fleet,
    policy: Policy,
    *,
    name: str = "policy",
    options: SimOptions | None = None,
    hook: CycleHook | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Run ``workload`` on ``fleet`` under ``policy`` until every job has finished.

    Args:
        workload: the jobs, sorted by submit time.
        fleet: nodes and (optionally) configured tenants.
        policy: ``(snapshot, now) -> Decisions``; a fresh instance per run when it keeps state.
        name: the policy's name in results and errors.
        options: engine knobs.
        hook: called before each cycle with the snapshot (the estimator's evaluation uses it).
        progress: called with (jobs done, jobs in all) now and then.
    """
    return Engine(workload, fleet, policy, name, options or SimOptions()).run(hook=hook, progress=progress)
