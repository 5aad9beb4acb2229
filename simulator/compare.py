"""Run several policies on one workload and fleet, with the estimator scored along the way."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import cast

from scheduler.core.types import PendingJob, Snapshot
from simulator.calibrate import WaitCalibrator
from simulator.engine import Engine, SimOptions, SimResult
from simulator.estimate import INTERVAL_QUANTILES, Policy, estimate_intervals, estimate_starts
from simulator.fleet import Fleet
from simulator.metrics import Prediction, estimate_accuracy, summarize
from simulator.policies import get_policy
from simulator.report import RunSet
from simulator.workload import Workload, offered_load, size_class

HOUR = 3600.0


class EstimatorProbe:
    """A cycle hook that, at most every ``every_s``, predicts the start of every waiting job.

    Predictions use a fresh instance of the policy under test, so they see exactly what
    the live API would. Jobs that arrived since the previous cycle count as "at submit".
    With ``started`` (job id -> its first start, or None while it has not started), each raw
    forward-simulated estimate is calibrated as the live API calibrates it
    (:class:`simulator.calibrate.WaitCalibrator`), from the outcomes of this run's earlier
    estimates whose jobs have started by now: never from the future. With ``ratios`` too (the run-time
    predictor's error ratios at ``INTERVAL_QUANTILES``, as they are now), a job the calibrator has too few
    samples for gets the live API's cold-start interval (``estimate_intervals``: the forward simulation with
    remaining run times scaled by each ratio) instead of its raw start alone.
    """

    def __init__(
        self,
        make_policy: Callable[[], Callable[..., object]],
        *,
        every_s: float,
        step_s: float,
        max_steps: int,
        started: Callable[[str], float | None] | None = None,
        calibrator: WaitCalibrator | None = None,
        view: Callable[[Snapshot], Snapshot] | None = None,
        arrivals: Callable[[float], Sequence[PendingJob]] | None = None,
        replay: Callable[[Snapshot, Sequence[PendingJob]], tuple[dict[str, float], dict[str, float]]] | None = None,
        ratios: Callable[[], Sequence[float]] | None = None,
    ) -> None:
        self.make = make_policy
        self.ratios = ratios
        #: A study's variants: what the estimator is shown instead of the snapshot (e.g. true run times), and the
        #: jobs it is told will arrive after ``now`` (``estimate_starts``' ``arrivals``). None: as the live API.
        self.view = view
        self.arrivals = arrivals
        #: And, for a replay of the future as it happens: (running jobs' true ends, waiting and arriving jobs' true
        #: run times) of the snapshot and the arrivals (``estimate_starts``' ``true_ends``, ``true_runtimes``).
        self.replay = replay
        self.every_s = every_s
        self.step_s = step_s
        self.max_steps = max_steps
        self.started = started
        self.calibrator = calibrator or WaitCalibrator()
        #: Job id -> its raw estimates not yet scored: (made at, predicted remaining wait, its size class).
        self.outstanding: dict[str, list[tuple[float, float, str]]] = {}
        self.last = -float("inf")
        #: (job id, made at, predicted start or None, made at submission, low, high, GPUs)
        self.predictions: list[Prediction] = []
        #: The same, uncalibrated: the forward simulation's own start (low = high = it).
        self.raw_predictions: list[Prediction] = []

    def _learn(self) -> None:
        if self.started is None:
            return
        for job_id in list(self.outstanding):
            start = self.started(job_id)
            if start is not None:
                for made_at, predicted, group in self.outstanding.pop(job_id):
                    self.calibrator.observe(predicted, start - made_at, group)

    def __call__(self, snapshot: Snapshot, now: float, new_ids: list[str]) -> None:
        if now - self.last < self.every_s or not snapshot.pending:
            return
        self.last = now
        self._learn()
        fresh = set(new_ids)
        shown = snapshot if self.view is None else self.view(snapshot)
        later = () if self.arrivals is None else self.arrivals(now)
        true_ends, true_runtimes = self.replay(snapshot, later) if self.replay is not None else (None, None)
        starts = estimate_starts(
            shown,
            now,
            self.make(),  # type: ignore[arg-type]
            step_s=self.step_s,
            max_steps=self.max_steps,
            arrivals=later,
            true_ends=true_ends,
            true_runtimes=true_runtimes,
        )
        cold: dict[str, tuple[float | None, float | None, float | None]] | None = None
        for job in snapshot.pending:
            if job.attempt != 1:
                continue
            raw = starts.get(job.id)
            self.raw_predictions.append((job.id, now, raw, job.id in fresh, raw, raw, job.gpu_count))
            if raw is None:
                self.predictions.append((job.id, now, None, job.id in fresh, None, None, job.gpu_count))
                continue
            if self.started is None:
                self.predictions.append((job.id, now, raw, job.id in fresh, raw, raw, job.gpu_count))
                continue
            group = size_class(job.gpu_count)
            self.outstanding.setdefault(job.id, []).append((now, raw - now, group))
            if self.ratios is not None and not self.calibrator.calibrates(raw - now, group):
                if cold is None:
                    make = cast(Callable[[], Policy], self.make)
                    cold = estimate_intervals(shown, now, make, ratios=self.ratios(), step_s=self.step_s, max_steps=self.max_steps)
                lo, med, hi = cold.get(job.id, (None, None, None))
                self.predictions.append((job.id, now, med, job.id in fresh, lo, hi, job.gpu_count))
                continue
            low, median, high = self.calibrator.interval(raw - now, group)
            self.predictions.append((job.id, now, now + median, job.id in fresh, now + low, now + high, job.gpu_count))


#: The estimator probe's forward simulation: its grid and how many cycles it looks ahead (37.5 h).
PROBE_STEP_S = 900.0
PROBE_MAX_STEPS = 150


def engine_for(workload: Workload, fleet: Fleet, name: str, options: SimOptions) -> Engine:
    """An engine running a fresh instance of the named policy, with the options the policy needs."""
    spec = get_policy(name)
    opts = replace(
        options,
        oracle_runtime=spec.oracle_runtime or options.oracle_runtime,
        fresh_checkpoints=spec.needs_checkpoints,
        rigid=spec.rigid or options.rigid,
        learned_runtimes=spec.learned_runtimes or options.learned_runtimes,
    )
    return Engine(workload, fleet, spec.make(), name, opts)


def probe_for(
    engine: Engine,
    *,
    every_s: float,
    view: Callable[[Snapshot], Snapshot] | None = None,
    arrivals: Callable[[float], Sequence[PendingJob]] | None = None,
    replay: Callable[[Snapshot, Sequence[PendingJob]], tuple[dict[str, float], dict[str, float]]] | None = None,
) -> EstimatorProbe:
    """An estimator probe of the engine's policy, calibrated from the engine's own starts so far; one shown the
    platform's own knowledge (no ``view``, ``arrivals`` or ``replay``) falls back as the live API does where it
    cannot calibrate yet (the engine's run-time predictor's error ratios as they are at each probe)."""

    def started(job_id: str) -> float | None:
        return engine.jobs[engine.job_index[job_id]].first_start

    return EstimatorProbe(
        get_policy(engine.name).make,
        every_s=every_s,
        step_s=PROBE_STEP_S,
        max_steps=PROBE_MAX_STEPS,
        started=started,
        view=view,
        arrivals=arrivals,
        replay=replay,
        ratios=(lambda: engine.predictor.quantiles(INTERVAL_QUANTILES)) if view is None and arrivals is None and replay is None else None,
    )


def run_set(
    workload: Workload,
    fleet: Fleet,
    policies: Sequence[str],
    *,
    title: str,
    command: str,
    options: SimOptions,
    estimate_for: Sequence[str] = ("ours",),
    estimate_every_s: float = 6 * HOUR,
    progress: Callable[[str, int, int], None] | None = None,
) -> RunSet:
    """Simulate each policy (a fresh instance each) and summarise it."""
    load = offered_load(workload, fleet.total_gpus())
    gpu_h = workload.gpu_seconds() / HOUR
    runs = RunSet(
        title=title,
        setup=[
            f"- workload: {workload.name}, {len(workload.jobs)} jobs, {gpu_h:,.0f} GPU-hours, offered load {load:.2f}, "
            f"{len({j.tenant for j in workload.jobs})} tenants"
            + (f", {sum(j.elastic for j in workload.jobs)} of them elastic" if any(j.elastic for j in workload.jobs) else ""),
            f"- fleet: {fleet.name}: {len(fleet.nodes)} nodes, {fleet.total_gpus()} GPUs "
            + ", ".join(f"{t} {c}" for t, c in fleet.capacity().items()),
            f"- engine: cycles on a {options.cycle_s:g} s grid (and every {options.tick_s:g} s while jobs wait), restart overhead "
            f"{options.restart_overhead_s:g} s, node MTBF {options.node_mtbf_h or '-'} h, "
            f"GPU MTBF {options.gpu_mtbf_h or '-'} h, seed {options.seed}",
        ],
        command=command,
        jobs=len(workload.jobs),
    )
    for name in policies:
        engine = engine_for(workload, fleet, name, options)
        probe = probe_for(engine, every_s=estimate_every_s) if name in estimate_for else None

        def tick(done: int, total: int, _name: str = name) -> None:
            if progress is not None:
                progress(_name, done, total)

        result: SimResult = engine.run(hook=probe, progress=tick)
        runs.results[name] = result
        runs.summaries[name] = summarize(result)
        if probe is not None:
            runs.estimates[name] = estimate_accuracy(probe.predictions, result.records)
    return runs


def core_fingerprint() -> str:
    """SHA-256 (first 12 hex digits) of the production core's sources: which "ours" a run measured."""
    import hashlib

    import scheduler.core

    digest = hashlib.sha256()
    for source in sorted(Path(scheduler.core.__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:12]


def write_summary_json(runs: RunSet, path: Path) -> None:
    """The numbers behind a report, for docs/evaluation.md to be generated from."""
    data = {
        "core_sha256": core_fingerprint(),
        "title": runs.title,
        "setup": runs.setup,
        "command": runs.command,
        "jobs": runs.jobs,
        "summaries": {n: asdict(s) for n, s in runs.summaries.items()},
        "estimates": {n: asdict(e) for n, e in runs.estimates.items()},
        "speed": {
            n: {"wall_s": r.wall_s, "policy_s": r.policy_s, "cycles": r.cycles, "jobs": len(r.records), "invalid": len(r.invalid)}
            for n, r in runs.results.items()
        },
    }
    path.write_text(json.dumps(data, indent=1, allow_nan=True) + "\n")
