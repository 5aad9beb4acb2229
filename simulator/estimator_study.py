"""Where the queue-wait estimator's misses come from: the learned run times, or the jobs that arrive later.

One run of ours on the Philly workload, probed as ``fairgang sim`` probes it (every 6 simulated hours, the
forward simulation on a 15-minute grid for 150 steps, calibrated from the run's own earlier outcomes; until it
can calibrate, the first variant gets the live API's cold-start interval), five times at every probe, each told
something else:

- ``learned``: what the live platform knows (learned run times, no arrivals): the estimator as it is;
- ``learned + last 6 h replayed``: the same, and the jobs submitted in the last 6 h submitted again over the
  next 6 h (learned run times): a guess of the arrivals the platform could make;
- ``true run times``: every waiting job's true remaining run time, every running job's true end
  (:meth:`simulator.engine.Engine.with_true_runtimes`), no arrivals;
- ``true run times and arrivals``: and the jobs that will really arrive within the horizon
  (:meth:`simulator.engine.Engine.arrivals`): the forward simulation told the whole future;
- ``the true future, decided on learned run times``: the same future (jobs end at their true times, the real
  arrivals come), but the policy is shown the learned run times, as the run's was
  (:meth:`simulator.engine.Engine.true_times`): a replay of the run itself.

Each is scored raw (the forward simulation's start) and calibrated, on the estimates made at least an hour
before the job started, as docs/evaluation.md scores them.

    python -m simulator.evaluation estimator --load 0.7 --seed 0 --out docs/evaluation/estimator-70.json
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler.core.types import PendingJob, Snapshot
from simulator.compare import HOUR, PROBE_MAX_STEPS, PROBE_STEP_S, core_fingerprint, engine_for, probe_for
from simulator.engine import SimOptions
from simulator.fleet import load_fleet
from simulator.metrics import IntervalAccuracy, Prediction, estimate_accuracy
from simulator.workload import philly_workload

#: The variants, in the order reported: what the forward simulation is told.
VARIANTS = (
    "learned",
    "learned + last 6 h replayed",
    "true run times",
    "true run times and arrivals",
    "the true future, decided on learned run times",
)
#: How much of the recent past the second variant replays.
REPLAY_S = 6 * HOUR


def study(*, load: float, seed: int, every_s: float = 6 * HOUR, jobs: int | None = None) -> dict[str, Any]:
    """Run ours once with both probes; each variant's raw and calibrated accuracy on waits of an hour or more."""
    fleet = load_fleet("spec")
    workload = philly_workload(fleet, seed=seed, load=load, jobs=jobs)
    engine = engine_for(workload, fleet, "ours", SimOptions(seed=seed))
    horizon = PROBE_STEP_S * PROBE_MAX_STEPS

    def replayed(now: float) -> list[PendingJob]:
        return engine.arrivals(now - REPLAY_S, now, true_runtimes=False, shift_s=REPLAY_S, prefix="replay:")

    def future(now: float) -> list[PendingJob]:
        return engine.arrivals(now, now + horizon, true_runtimes=True)

    true = engine.with_true_runtimes
    probes = {
        "learned": probe_for(engine, every_s=every_s),
        "learned + last 6 h replayed": probe_for(engine, every_s=every_s, arrivals=replayed),
        "true run times": probe_for(engine, every_s=every_s, view=true),
        "true run times and arrivals": probe_for(engine, every_s=every_s, view=true, arrivals=future),
        "the true future, decided on learned run times": probe_for(
            engine, every_s=every_s, arrivals=lambda now: engine.arrivals(now, now + horizon, true_runtimes=False), replay=engine.true_times
        ),
    }

    def hook(snapshot: Snapshot, now: float, new_ids: list[str]) -> None:
        for probe in probes.values():
            probe(snapshot, now, new_ids)

    began = time.perf_counter()
    result = engine.run(hook=hook)
    rows = []
    for variant in VARIANTS:
        probe = probes[variant]
        for calibrated, predictions in ((False, probe.raw_predictions), (True, probe.predictions)):
            rows.append({"variant": variant, "calibrated": calibrated, **_scored(predictions, result.records, calibrated)})
    return {
        "core_sha256": core_fingerprint(),
        "workload": workload.name,
        "load": load,
        "seed": seed,
        "jobs": len(workload.jobs),
        "probe_every_h": every_s / HOUR,
        "wall_s": time.perf_counter() - began,
        "command": f"python -m simulator.evaluation estimator --load {load:g} --seed {seed}" + (f" --jobs {jobs}" if jobs else ""),
        "rows": rows,
    }


def _scored(predictions: Sequence[Prediction], records: Sequence[Any], calibrated: bool) -> dict[str, Any]:
    acc = estimate_accuracy(predictions, records).long_wait or IntervalAccuracy(0, math.nan, math.nan, math.nan)
    return {
        "estimates": acc.n,
        "median_abs_rel": acc.median_abs_rel,
        "median_signed_rel": acc.median_signed_rel,
        # A raw estimate is one time, not an interval.
        "coverage": acc.coverage if calibrated else None,
    }


def write(data: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")


def section(files: Sequence[Path], current_core: str) -> list[str]:
    """docs/evaluation.md's section: one row per study file, variant and raw/calibrated."""
    if not files:
        return []
    out = [
        "## Where the estimator's misses come from",
        "",
        "Each run below probes ours' estimator five times at every probe (as the runs above do: every 6 simulated",
        "hours, calibrated from the run's own earlier outcomes), each told something else: what the platform knows",
        "(learned run times, no later arrivals); that and the last 6 h of submissions replayed over the next 6 h;",
        "the true run times; the true run times and the jobs that really arrive; and the true future (true ends,",
        "real arrivals) with the policy shown the learned run times, as the run's was. Estimates made at least an",
        "hour before the job started, relative to that wait (`simulator/estimator_study.py`; negative: it started",
        "later than said):",
        "",
        "| load | seed | the forward simulation is told | estimates | raw: median abs error | raw: median signed "
        "| calibrated: median abs error | calibrated: median signed | calibrated: p10-p90 coverage |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    stale = []
    runs = sorted(((json.loads(path.read_text()), path) for path in files), key=lambda run: (run[0]["load"], run[0]["seed"]))
    for data, path in runs:
        if data.get("core_sha256") != current_core:
            stale.append(path.name)
        by = {(r["variant"], r["calibrated"]): r for r in data["rows"]}
        for variant in VARIANTS:
            raw, cal = by[(variant, False)], by[(variant, True)]
            out.append(
                f"| {data['load']:g} | {data['seed']} | {variant} | {cal['estimates']:,} | {raw['median_abs_rel']:.1%} | "
                f"{raw['median_signed_rel']:+.1%} | {cal['median_abs_rel']:.1%} | {cal['median_signed_rel']:+.1%} | {cal['coverage']:.1%} |"
            )
    out += [""]
    if stale:
        out += [f"(the core has changed since {', '.join(stale)}; re-run to refresh)", ""]
    out += [
        "What the true run times fix is what the run-time predictor costs; what the true arrivals fix on top is what",
        "no forward simulation of the queue as it is can see: the jobs that arrive after the estimate and start first",
        "(a tenant further below its fair share, the fast lane's short jobs). What is left when the whole future is",
        "known is where the forward simulation departs from the run. Part of it is which run times the policy decides",
        "on: the last row, a replay of the run itself whose policy is shown the learned run times as the run's was,",
        "misses less than the row before it, whose policy is shown the true ones. The rest: on its 15-minute grid a",
        "start is dated back to when the job's GPUs came free, or, for a job held",
        "back at the step before, to the latest end or arrival since (`simulator/estimate.py`), which is not always",
        "when the run's 30 s cycles started it; and the run does what the forward simulation does not: its predictor",
        "goes on learning from the jobs that finish, and running jobs' expected ends are corrected as they overrun.",
        "Calibrating from earlier outcomes corrects the bias of the estimator as it is, but adds error to a forecast",
        "that is already close (compare the raw and calibrated columns of the last rows): it learns ratios from a",
        "queue that has moved on.",
        "",
        "Reproduce: " + "; ".join(f"`{data['command']} --out {path}`" for data, path in runs),
        "",
    ]
    return out
