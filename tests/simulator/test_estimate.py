"""The queue-wait estimator: exact on known futures, sane on a simulated run."""

from __future__ import annotations

import pytest

from scheduler.core.types import Snapshot
from simulator.compare import EstimatorProbe
from simulator.engine import SimOptions, simulate
from simulator.estimate import estimate_starts, queue_estimates
from simulator.metrics import estimate_accuracy
from simulator.policies.simple import Fifo, Sjf
from tests.simulator.helpers import fleet_of, job, node, pending, running, snapshot, workload


def test_a_blocked_job_is_predicted_to_start_when_the_running_job_is_expected_to_end():
    snap = snapshot([node("n0", 0)], [pending("next", 8, runtime=50.0)], [running("r", "n0", tuple(range(8)), end=100.0)])
    assert estimate_starts(snap, 0.0, Fifo(), step_s=0.0) == {"next": 100.0}


def test_the_queue_behind_is_predicted_from_the_expected_runtimes_of_those_ahead():
    snap = snapshot(
        [node("n0", 0)],
        [pending("first", 8, at=1.0, runtime=50.0), pending("second", 8, at=2.0, runtime=70.0)],
        [running("r", "n0", tuple(range(8)), end=100.0)],
    )
    assert estimate_starts(snap, 0.0, Fifo(), step_s=0.0) == {"first": 100.0, "second": 150.0}
    positions = [(e.job_id, e.position, e.start_at) for e in queue_estimates(snap, 0.0, Fifo(), step_s=0.0)]
    assert positions == [("first", 1, 100.0), ("second", 2, 150.0)]


def test_a_job_that_can_never_fit_has_no_estimate():
    snap = snapshot([node("n0", 0)], [pending("huge", 64)], [running("r", "n0", tuple(range(8)), end=100.0)])
    assert estimate_starts(snap, 0.0, Fifo(), step_s=0.0) == {}


def test_with_exact_runtimes_and_no_later_arrivals_the_estimate_matches_the_run():
    # Everything is submitted at once and the policy knows the true durations: the forecast is the future.
    wl = workload(*(job(f"j{i}", 0.0, (i % 3) * 2 + 2, 300.0 + 97 * i) for i in range(12)))
    options = SimOptions(cycle_s=0.0, tick_s=60.0, oracle_runtime=True, strict=True)
    probe = EstimatorProbe(Sjf, every_s=1e9, step_s=0.0, max_steps=1000)
    result = simulate(wl, fleet_of(2), Sjf(), options=options, hook=probe)
    acc = estimate_accuracy(probe.predictions, result.records)
    assert acc.at_submit == 12
    assert acc.at_submit_p90_abs_h == pytest.approx(0.0, abs=1e-9)


def test_with_limits_longer_than_runtimes_the_estimate_is_pessimistic():
    wl = workload(*(job(f"j{i}", 0.0, 8, 600.0, limit=3600.0) for i in range(4)))
    probe = EstimatorProbe(Fifo, every_s=1e9, step_s=0.0, max_steps=1000)
    result = simulate(wl, fleet_of(1), Fifo(), options=SimOptions(cycle_s=0.0, strict=True), hook=probe)
    acc = estimate_accuracy(probe.predictions, result.records)
    assert acc.at_submit == 4
    assert acc.at_submit_median_signed_h > 0


def test_calibrated_estimates_learn_the_bias_of_pessimistic_limits_from_earlier_starts_only():
    # Limits are 6x the run times: the raw forecast is far too late. Calibrated from the run's own past
    # (jobs started before each probe), the median error shrinks and the interval holds most starts.
    from simulator.calibrate import WaitCalibrator
    from simulator.engine import Engine

    wl = workload(*(job(f"j{i:03d}", i * 200.0, 8, 600.0, limit=3600.0) for i in range(150)))
    options = SimOptions(cycle_s=0.0, tick_s=60.0, strict=True)
    raw = EstimatorProbe(Fifo, every_s=300.0, step_s=0.0, max_steps=1000)
    plain = simulate(wl, fleet_of(1), Fifo(), options=options, hook=raw)
    engine = Engine(wl, fleet_of(1), Fifo(), "fifo", options)
    learned_from: list[tuple[float, float]] = []

    def started(job_id: str) -> float | None:
        start = engine.jobs[engine.job_index[job_id]].first_start
        if start is not None:
            learned_from.append((start, engine_now[0]))
        return start

    engine_now = [0.0]
    calibrated = EstimatorProbe(Fifo, every_s=300.0, step_s=0.0, max_steps=1000, started=started, calibrator=WaitCalibrator(min_samples=5))

    def hook(snap: Snapshot, now: float, new_ids: list[str]) -> None:
        engine_now[0] = now
        calibrated(snap, now, new_ids)

    result = engine.run(hook=hook)
    before = estimate_accuracy(raw.predictions, plain.records)
    after = estimate_accuracy(calibrated.predictions, result.records)
    assert calibrated.calibrator.observed > 0
    assert abs(after.while_waiting_median_abs_h) < before.while_waiting_median_abs_h
    assert after.long_wait is not None and after.long_wait.n > 0 and after.long_wait.coverage >= 0.5
    # Never from the future: every start it learned from had happened when it was read.
    assert learned_from and all(start <= read_at for start, read_at in learned_from)
