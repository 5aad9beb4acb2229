"""The queue-wait estimator: exact on known futures, sane on a simulated run."""

from __future__ import annotations

import pytest

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
