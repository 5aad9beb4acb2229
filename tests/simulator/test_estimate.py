"""The queue-wait estimator: exact on known futures, sane on a simulated run."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.types import Decisions, PendingJob, Snapshot
from simulator.compare import EstimatorProbe
from simulator.engine import SimOptions, simulate
from simulator.estimate import estimate_intervals, estimate_starts, queue_estimates
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


def test_jobs_arriving_later_join_the_forward_simulation_at_their_time():
    # "long" waits for the running job; a shorter job arriving at 10 goes first under SJF (on a grid too).
    snap = snapshot([node("n0", 0)], [pending("long", 8, runtime=500.0)], [running("r", "n0", tuple(range(8)), end=100.0)])
    later = [pending("short", 8, at=10.0, runtime=50.0)]
    assert estimate_starts(snap, 0.0, Sjf(), step_s=0.0) == {"long": 100.0}
    assert estimate_starts(snap, 0.0, Sjf(), step_s=0.0, arrivals=later) == {"long": 150.0}
    # On a grid too: "short" is bound at 120 but started when the GPUs came free (100), so "long" at 150.
    assert estimate_starts(snap, 0.0, Sjf(), step_s=30.0, arrivals=later) == {"long": 150.0}
    # One arriving after the running job has ended finds the queue empty but for "long", which has started.
    assert estimate_starts(snap, 0.0, Sjf(), step_s=0.0, arrivals=[pending("short", 8, at=120.0, runtime=50.0)]) == {"long": 100.0}
    # With nothing running or waiting yet, arrivals alone drive the clock (and are not targets).
    empty = snapshot([node("n0", 8)], [pending("w", 8, runtime=500.0)])
    assert estimate_starts(empty, 0.0, Sjf(), step_s=0.0, arrivals=later) == {"w": 0.0}


def test_on_a_coarse_grid_a_start_is_when_its_gpus_came_free_not_the_cycle_that_saw_it():
    # The service's cycles are far finer than the forward simulation's grid: a job bound at the cycle after its
    # GPUs came free started about when they did. Otherwise every start in a chain is late by up to a step,
    # and a queue's later jobs by the sum of them.
    snap = snapshot(
        [node("n0", 0)],
        [pending("first", 8, at=1.0, runtime=50.0), pending("second", 8, at=2.0, runtime=70.0)],
        [running("r", "n0", tuple(range(8)), end=100.0)],
    )
    assert estimate_starts(snap, 0.0, Fifo(), step_s=300.0) == {"first": 100.0, "second": 150.0}
    # A job held back behind the head (its GPUs free all along) started when what held it changed: r's end at 100.
    held = snapshot(
        [node("n0", 0), node("n1", {4, 5, 6, 7})],
        [pending("head", 8, at=1.0, runtime=50.0), pending("small", 4, at=2.0, runtime=50.0)],
        [running("r", "n0", tuple(range(8)), end=100.0), running("r2", "n1", (0, 1, 2, 3), end=1000.0)],
    )
    assert (
        estimate_starts(held, 10.0, Fifo(), step_s=300.0)
        == {"head": 100.0, "small": 100.0}
        == estimate_starts(held, 10.0, Fifo(), step_s=0.0)
    )
    # Never before the cycle before the one that bound it (it was not bound then), nor before the snapshot.
    busy = snapshot([node("n0", 8)], [pending("w", 8, runtime=50.0)])
    assert estimate_starts(busy, 500.0, Fifo(), step_s=300.0) == {"w": 500.0}


def test_jobs_started_back_and_ended_within_one_step_do_not_shorten_the_horizon():
    # Three 10 s jobs behind r (ends at 100) on a 300 s grid: one step of the clock, then the policy is asked again
    # at 300 for each job that ended within it. max_steps counts the clock's steps, so two reach all three.
    snap = snapshot(
        [node("n0", 0)],
        [pending(name, 8, at=i + 1.0, runtime=10.0) for i, name in enumerate(("a", "b", "c"))],
        [running("r", "n0", tuple(range(8)), end=100.0)],
    )
    assert estimate_starts(snap, 0.0, Fifo(), step_s=300.0, max_steps=2) == {"a": 100.0, "b": 110.0, "c": 120.0}
    assert estimate_starts(snap, 0.0, Fifo(), step_s=300.0, max_steps=1) == {}


def test_a_job_that_can_never_fit_has_no_estimate():
    snap = snapshot([node("n0", 0)], [pending("huge", 64)], [running("r", "n0", tuple(range(8)), end=100.0)])
    assert estimate_starts(snap, 0.0, Fifo(), step_s=0.0) == {}


def test_jobs_that_the_schedulable_nodes_cannot_hold_are_not_simulated_to_the_horizon():
    # Every node stale (e.g. the agents' heartbeats lost): nothing can start, and the policy is asked once, not
    # at every end of the running jobs up to the horizon. A job that fits still gets its start.
    calls = []

    def counted(snap: Snapshot, now: float) -> Decisions:
        calls.append(now)
        return fifo(snap, now)

    fifo = Fifo()
    runs = [running(f"r{i}", "n0", (i,), end=100.0 * (i + 1)) for i in range(8)]
    stale = snapshot([dataclasses.replace(node("n0", 0), schedulable=False)], [pending("w", 8), pending("huge", 64, at=1.0)], runs)
    assert estimate_starts(stale, 0.0, counted, step_s=0.0) == {} and len(calls) == 1
    calls.clear()
    live = snapshot([node("n0", 0)], [pending("w", 8), pending("huge", 64, at=1.0)], runs)
    assert estimate_starts(live, 0.0, counted, step_s=0.0) == {"w": 800.0} and len(calls) == 9


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


def _expecting(job: PendingJob, expected: float) -> PendingJob:
    return dataclasses.replace(job, expected_runtime_s=expected)


def test_intervals_scale_every_remaining_run_time_by_the_error_quantiles_within_the_limits():
    # r is expected to end at 100 (its limit: 400); "first" is expected to run 50 (limit 200), "second" 70.
    run = dataclasses.replace(running("r", "n0", tuple(range(8)), end=100.0), max_end=400.0)
    snap = snapshot(
        [node("n0", 0)],
        [_expecting(pending("first", 8, at=1.0, runtime=200.0), 50.0), _expecting(pending("second", 8, at=2.0, runtime=200.0), 70.0)],
        [run],
    )
    got = estimate_intervals(snap, 0.0, Fifo, ratios=(0.5, 1.0, 5.0), step_s=0.0)
    # Low (x0.5): r ends at 50, first runs 25. Median: as estimate_starts. High (x5): r ends at its limit, 400 (not
    # 500), first runs its limit, 200 (not 250).
    assert got == {"first": (50.0, 100.0, 400.0), "second": (75.0, 150.0, 600.0)}
    assert estimate_starts(snap, 0.0, Fifo(), step_s=0.0) == {"first": 100.0, "second": 150.0}


def test_a_running_job_past_its_expected_end_is_taken_to_end_a_step_after_now():
    snap = snapshot(
        [node("n0", 0)], [_expecting(pending("next", 8, runtime=100.0), 50.0)], [running("r", "n0", tuple(range(8)), end=-10.0)]
    )
    assert estimate_intervals(snap, 0.0, Fifo, ratios=(1.0, 1.0, 1.0), step_s=0.0, overdue_s=60.0) == {"next": (60.0, 60.0, 60.0)}


def test_a_job_beyond_the_horizon_has_no_start_and_ratios_are_checked():
    snap = snapshot([node("n0", 0)], [pending("huge", 64)], [running("r", "n0", tuple(range(8)), end=100.0)])
    assert estimate_intervals(snap, 0.0, Fifo, ratios=(0.5, 1.0, 2.0), step_s=0.0) == {"huge": (None, None, None)}
    with pytest.raises(ValueError, match="ratios"):
        estimate_intervals(snap, 0.0, Fifo, ratios=(1.0, 2.0), step_s=0.0)
    with pytest.raises(ValueError, match="ratios"):
        estimate_intervals(snap, 0.0, Fifo, ratios=(-1.0, 1.0, 2.0), step_s=0.0)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.floats(10.0, 5000.0), st.floats(1.0, 3.0)), min_size=1, max_size=8),
    st.lists(st.floats(10.0, 3000.0), min_size=1, max_size=2),
    st.tuples(st.floats(0.1, 1.0), st.floats(0.5, 1.5), st.floats(1.0, 4.0)),
    st.sampled_from([0.0, 60.0]),
)
def test_intervals_are_ordered(jobs, ends, ratios, step):
    waiting = [
        _expecting(pending(f"j{i}", gpus, at=float(i), runtime=expected * over, tenant="ab"[i % 2]), expected)
        for i, (gpus, expected, over) in enumerate(jobs)
    ]
    runs = [dataclasses.replace(running(f"r{i}", f"n{i}", tuple(range(8)), end=end), max_end=end * 2) for i, end in enumerate(ends)]
    snap = snapshot([node(f"n{i}", 0) for i in range(len(ends))] + [node("free", 4)], waiting, runs)
    got = estimate_intervals(snap, 0.0, Sjf, ratios=ratios, step_s=step, max_steps=200)
    assert got.keys() == {j.id for j in waiting}
    for low, median, high in got.values():
        values = [math.inf if v is None else v for v in (low, median, high)]
        assert values == sorted(values)


def test_the_median_is_the_median_simulation_on_its_own_grid():
    # r ends at 45, scaled by each ratio: "next" starts at 45 (low), 135 (median, on its 30 s grid) and 90 (high, on
    # the bounds' 120 s grid); the median is the median simulation's start, not the middle of the three (the
    # what-if's "no change" replays only that one), and the high the latest of them.
    snap = snapshot([node("n0", 0)], [_expecting(pending("next", 8, runtime=100.0), 50.0)], [running("r", "n0", tuple(range(8)), end=45.0)])
    got = estimate_intervals(snap, 0.0, Fifo, ratios=(1.0, 3.0, 2.0), step_s=30.0, bound_step_s=120.0)
    assert got == {"next": (45.0, 135.0, 135.0)}
    assert estimate_starts(snap, 0.0, Fifo(), step_s=30.0) == {"next": 45.0}


def test_a_job_that_an_elastic_job_shrinks_for_is_predicted_to_start_at_once_not_at_the_elastic_jobs_end():
    from scheduler.core import Quota, Scheduler, TenantView

    elastic = dataclasses.replace(running("e", "n0", tuple(range(8)), end=100_000.0), gpu_min=4, gpu_max=8, last_checkpoint_at=0.0)
    snap = snapshot([node("n0", 0)], [pending("fixed", 4, tenant="b", runtime=600.0)], [elastic])
    quota = (("H100", Quota(nominal=4)),)
    snap = dataclasses.replace(snap, tenants=(TenantView(name="a", quotas=quota), TenantView(name="b", quotas=quota)))
    starts = estimate_starts(snap, 1000.0, Scheduler().run_cycle, step_s=30.0)
    assert starts["fixed"] <= 1000.0 + 60.0  # "e" gives back its 4 GPUs above its minimum, "fixed" binds on them
