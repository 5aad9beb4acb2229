"""Learned run times in the simulator (issue: run times from history): from the jobs finished so far, never the future."""

from __future__ import annotations

import math

import pytest

from scheduler.core import run_cycle
from scheduler.core.types import RunningJob, Snapshot
from simulator.engine import SimOptions, simulate
from tests.simulator.helpers import fleet_of, job, workload

LEARNED = SimOptions(cycle_s=0.0, tick_s=60.0, restart_overhead_s=0.0, strict=True, learned_runtimes=True)


class Seen:
    """A cycle hook that keeps what the policy was told of each job, per cycle."""

    def __init__(self) -> None:
        self.pending: dict[str, list[tuple[float, float | None]]] = {}
        self.ends: dict[str, list[tuple[float, float]]] = {}

    def __call__(self, snap: Snapshot, now: float, new_ids: list[str]) -> None:
        for p in snap.pending:
            self.pending.setdefault(p.id, []).append((now, p.expected_runtime_s))
        for r in snap.running:
            self.ends.setdefault(r.id, []).append((now, r.expected_end))


def test_a_waiting_job_is_expected_to_run_as_long_as_its_tenants_last_two_runs_of_its_size():
    # a1 and a2 (1 GPU, 1,000 s and 3,000 s) finish; a3 arrives after, while the node is full of "big".
    wl = workload(
        job("a1", 0, 1, 1000, limit=7200),
        job("a2", 0, 1, 3000, limit=7200),
        job("big", 3000, 8, 5000, tenant="b", limit=7200),
        job("a3", 3100, 1, 500, limit=7200),
    )
    seen = Seen()
    simulate(wl, fleet_of(1), run_cycle, options=LEARNED, hook=seen)
    assert seen.pending["a3"][0][1] == pytest.approx(2000.0)  # mean of 1,000 and 3,000, below the 7,200 s limit


def test_no_prediction_peeks_at_jobs_that_have_not_finished():
    # "first" runs 5,000 s; "second" (same tenant and size) arrives while it runs: nothing is known yet.
    wl = workload(job("first", 0, 8, 5000, limit=14_400), job("second", 100, 8, 5000, limit=14_400))
    seen = Seen()
    simulate(wl, fleet_of(1), run_cycle, options=LEARNED, hook=seen)
    assert {e for _, e in seen.pending["second"]} == {14_400.0}  # the limit: "first" had not finished
    # "first" itself was expected to run until its limit.
    assert seen.ends["first"][0][1] == pytest.approx(14_400.0)


def test_a_running_job_that_outlives_its_prediction_is_expected_to_run_longer_never_past_its_limit():
    # Two 600 s runs teach 600 s; "long" (same key) then runs 3,000 s with a 4,000 s limit.
    wl = workload(
        job("r1", 0, 4, 600, limit=4000),
        job("r2", 0, 4, 600, limit=4000),
        job("long", 700, 4, 3000, limit=4000),
        job("other", 800, 8, 2000, tenant="b", limit=4000),  # waits: cycles go on while "long" runs
    )
    seen = Seen()
    simulate(wl, fleet_of(1), run_cycle, options=LEARNED, hook=seen)
    ends = [end for _, end in seen.ends["long"]]
    assert ends[0] == pytest.approx(700 + 600)  # the learned 600 s
    assert ends == sorted(ends) and len(set(ends)) > 1  # moved later as it outlived it (600 -> 1,200 -> 2,400 -> ...)
    assert max(ends) <= 700 + 4000  # never past the limit
    assert all(end >= now for now, end in seen.ends["long"])


def test_a_running_job_is_told_what_the_predictor_learns_and_a_waiting_one_keeps_its_queued_prediction():
    # As the placement service does: "long" (4 GPUs, no checkpoints) starts told its limit; r1 and r2 (same tenant and
    # size) then finish in 600 s each, one after the other, and its expected end follows (600 s learned, outlived: 2,400 s
    # once it is 1,200 s in). "wait" (8 GPUs, queued before anything was learned) keeps its limit while it waits.
    wl = workload(
        job("other", 0, 8, 3000, tenant="b", limit=4000),  # holds one node: "wait" waits
        job("long", 0, 4, 3000, limit=4000),
        job("r1", 0, 4, 600, limit=4000),
        job("wait", 10, 8, 1000, limit=4000),
        job("r2", 600, 4, 600, limit=4000),
    )
    seen = Seen()
    simulate(wl, fleet_of(2), run_cycle, options=LEARNED, hook=seen)
    assert seen.ends["long"][0][1] == pytest.approx(4000.0)  # nothing learned yet: its limit
    after = [end for now, end in seen.ends["long"] if 1200 <= now < 2400]
    assert after and after == pytest.approx([2400.0] * len(after)), seen.ends["long"]
    assert {e for _, e in seen.pending["wait"]} == {4000.0}


def test_a_checkpoint_that_refreshes_a_running_jobs_prediction_never_leaves_its_expected_end_in_the_past():
    # "long" starts with nothing learned (its limit); r1 and r2 (same tenant and size) then finish in 600 s. At
    # its checkpoint at 1,000 s its prediction is refreshed from them (600 s, outlived: 1,200 s), and it must be
    # looked at again when it outlives that too, not left at 1,200 s until the next checkpoint at 2,000 s.
    wl = workload(
        job("long", 0, 4, 3000, limit=4000, ckpt=1000),
        job("r1", 0, 4, 600, limit=4000),
        job("r2", 600, 4, 600, limit=4000),
        job("other", 700, 16, 1000, tenant="b", limit=4000),  # a two-node gang: waits while "long" runs, so cycles go on
    )
    seen = Seen()
    simulate(wl, fleet_of(2), run_cycle, options=LEARNED, hook=seen)
    ends = seen.ends["long"]
    assert any(end < 4000 for _, end in ends), "the checkpoint brought the learned run time in"
    assert all(end >= now for now, end in ends), [(now, end) for now, end in ends if end < now][:3]


def test_a_running_jobs_view_carries_its_latest_checkpoint_and_its_learned_end_at_every_cycle() -> None:
    # "long" checkpoints every 500 s; "other" (a two-node gang) waits while it runs, so cycles come every minute.
    # r1 and r2 teach 600 s for long's key: its view is renewed at checkpoints and look-agains, never rebuilt.
    wl = workload(
        job("long", 0, 4, 3000, limit=4000, ckpt=500),
        job("r1", 0, 4, 600, limit=4000),
        job("r2", 600, 4, 600, limit=4000),
        job("other", 700, 16, 1000, tenant="b", limit=4000),
    )
    views: list[tuple[float, RunningJob]] = []
    simulate(
        wl,
        fleet_of(2),
        run_cycle,
        options=LEARNED,
        hook=lambda snap, now, _: views.extend((now, r) for r in snap.running if r.id == "long"),
    )
    assert len(views) > 20
    for now, view in views:
        latest = math.floor(now / 500) * 500
        assert view.last_checkpoint_at == (latest if latest > 0 else None), (now, view)
        assert (view.started_at, view.gpu_count, view.attempt, len(view.members)) == (0.0, 4, 1, 1)
        assert now <= view.expected_end <= 4000
    assert {view.expected_end for _, view in views} > {4000.0}, "the learned run time reached its view"


def test_a_prediction_held_between_checkpoints_gives_the_views_the_predictor_gives_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine keeps a running job's learned end between checkpoints while the predictor would give it again
    (short of the prediction, or of the doubling beyond an outlived one, and nothing learned of its key). Asked
    every time instead, the policy sees the same views at every cycle and every job ends the same."""
    from simulator.engine import Engine
    from simulator.fleet import spec_fleet
    from simulator.policies import get_policy
    from simulator.workload import synthetic_workload

    fleet = spec_fleet()
    wl = synthetic_workload(fleet, seed=3, load=0.9, jobs=1500)
    spec = get_policy("ours")
    options = SimOptions(seed=3, fresh_checkpoints=spec.needs_checkpoints, learned_runtimes=True)

    def run() -> tuple[list[tuple[float, tuple[tuple[str, float, float | None], ...]]], list[tuple[str, float | None, float | None]]]:
        seen: list[tuple[float, tuple[tuple[str, float, float | None], ...]]] = []

        def hook(snap: Snapshot, now: float, _: list[str]) -> None:
            seen.append((now, tuple((r.id, r.expected_end, r.last_checkpoint_at) for r in snap.running)))

        result = simulate(wl, fleet, spec.make(), name="ours", options=options, hook=hook)
        return seen, [(r.id, r.first_start, r.finish) for r in result.records]

    held = run()
    monkeypatch.setattr(Engine, "_holds_until", lambda *_: 0.0)  # no prediction held: the predictor every time
    asked = run()
    assert len(held[0]) > 1000
    assert held == asked
