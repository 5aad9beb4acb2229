"""The estimator study's parts: the engine's true-run-time view, the probe shown it, and the section it renders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.types import PendingJob, Snapshot
from simulator.compare import EstimatorProbe
from simulator.engine import Engine, SimOptions
from simulator.estimator_study import VARIANTS, section
from simulator.metrics import estimate_accuracy
from simulator.policies.simple import Fifo, Sjf
from tests.simulator.helpers import fleet_of, job, workload


def test_shown_the_true_run_times_the_probe_forecasts_what_the_limits_hide() -> None:
    # Limits are 6x the run times. Told the limits, the forward simulation says each job waits for the limits of
    # those before it; shown the true run times (running jobs' true ends too), it says exactly what happens.
    wl = workload(*(job(f"j{i}", 0.0, 8, 600.0, limit=3600.0) for i in range(4)))
    engine = Engine(wl, fleet_of(1), Fifo(), "fifo", SimOptions(cycle_s=0.0, strict=True))
    told = EstimatorProbe(Fifo, every_s=1e9, step_s=0.0, max_steps=1000)
    shown = EstimatorProbe(Fifo, every_s=1e9, step_s=0.0, max_steps=1000, view=engine.with_true_runtimes)
    seen: list[Snapshot] = []

    def hook(snapshot: Snapshot, now: float, new_ids: list[str]) -> None:
        if snapshot.running and not seen:
            seen.append(engine.with_true_runtimes(snapshot))
        told(snapshot, now, new_ids)
        shown(snapshot, now, new_ids)

    result = engine.run(hook=hook)
    starts = {r.id: r.first_start for r in result.records}
    assert starts == {"j0": 0.0, "j1": 600.0, "j2": 1200.0, "j3": 1800.0}
    assert {p[0]: p[2] for p in shown.raw_predictions} == starts
    assert {p[0]: p[2] for p in told.raw_predictions} == {"j0": 0.0, "j1": 3600.0, "j2": 7200.0, "j3": 10800.0}
    # The view: waiting jobs' expected run time is the true one, a running job's expected end its true end.
    view = seen[0]
    assert [r.expected_end for r in view.running] == [600.0]
    assert {j.id: j.expected_runtime_s for j in view.pending} == {"j1": 600.0, "j2": 600.0, "j3": 600.0}
    assert estimate_accuracy(shown.raw_predictions, result.records).at_submit_p90_abs_h == pytest.approx(0.0)


def test_the_section_shows_every_variant_raw_and_calibrated_and_marks_a_stale_core(tmp_path: Path) -> None:
    rows = [
        {"variant": v, "calibrated": c, "estimates": 10, "median_abs_rel": 0.5 if v == "learned" else 0.25,
         "median_signed_rel": -0.4, "coverage": 0.7 if c else None}
        for v in VARIANTS for c in (False, True)
    ]  # fmt: skip
    path = tmp_path / "estimator-70.json"
    data = {"core_sha256": "old", "load": 0.7, "seed": 1, "command": "python -m simulator.evaluation estimator --load 0.7 --seed 1"}
    path.write_text(json.dumps({**data, "rows": rows}))
    text = "\n".join(section([path], "new"))
    assert "| 0.7 | 1 | learned | 10 | 50.0% | -40.0% | 50.0% | -40.0% | 70.0% |" in text
    assert "| 0.7 | 1 | true run times and arrivals | 10 | 25.0% | -40.0% | 25.0% | -40.0% | 70.0% |" in text
    assert text.count("| 0.7 | 1 |") == len(VARIANTS)
    assert "the core has changed since estimator-70.json" in text
    assert section([], "new") == []


def test_told_the_true_run_times_and_arrivals_the_probe_forecasts_a_later_shorter_job_going_first() -> None:
    # SJF on one node: "b" waits for "a"; "c", shorter, arrives later and goes before "b". Told nothing of "c",
    # the forecast for "b" is the end of "a"; told the future, it is exact. The replay of the past (here: "a"
    # again) is a guess, and the arrivals are copies with their own ids and times.
    wl = workload(job("a", 0.0, 8, 1000.0), job("b", 1.0, 8, 500.0), job("c", 100.0, 8, 50.0))
    engine = Engine(wl, fleet_of(1), Sjf(), "sjf", SimOptions(cycle_s=0.0, oracle_runtime=True, strict=True))

    def future(now: float) -> list[PendingJob]:
        return engine.arrivals(now, now + 1e6, true_runtimes=True)

    blind = EstimatorProbe(Sjf, every_s=1e9, step_s=0.0, max_steps=1000, view=engine.with_true_runtimes)
    told = EstimatorProbe(Sjf, every_s=1e9, step_s=0.0, max_steps=1000, view=engine.with_true_runtimes, arrivals=future)
    copies: list[list[PendingJob]] = []

    def hook(snapshot: Snapshot, now: float, new_ids: list[str]) -> None:
        if now < 1.0:  # probed once "b" waits
            return
        blind(snapshot, now, new_ids)
        told(snapshot, now, new_ids)
        if not copies:
            copies.append(engine.arrivals(now - 10.0, now, true_runtimes=False, shift_s=10.0, prefix="replay:"))

    result = engine.run(hook=hook)
    starts = {r.id: r.first_start for r in result.records}
    assert starts == {"a": 0.0, "b": 1050.0, "c": 1000.0}
    assert {p[0]: p[2] for p in blind.raw_predictions} == {"b": 1000.0}
    assert {p[0]: p[2] for p in told.raw_predictions} == {"b": 1050.0}
    # At the probe (t = 1, "b" just submitted) the last 10 s, (-9, 1], replayed: both jobs as new ones 10 s after
    # their submission; nothing has finished yet, so their learned run times are their limits.
    (replayed,) = copies
    assert [(j.id, j.queued_at, j.attempt, j.expected_runtime_s) for j in replayed] == [
        ("replay:a", 10.0, 1, 1000.0),
        ("replay:b", 11.0, 1, 500.0),
    ]


def test_the_true_future_decided_on_learned_run_times_replays_the_run_exactly() -> None:
    # SJF decides on learned run times (here each job's limit: every job has its own tenant, so none learns from
    # another's; what the run learns later is a future no replay knows), jobs end at their true times and arrive
    # when they do. Shown the learned run times and told the true ends and arrivals, every forecast made along the
    # way is the start that happened; shown the true run times instead, some are not.
    rows = [(0.0, 8, 900.0, 3000.0), (5.0, 4, 300.0, 3000.0), (7.0, 4, 2000.0, 2500.0), (50.0, 8, 100.0, 3000.0)]
    rows += [(400.0 + 97.0 * i, 4 if i % 2 else 8, 200.0 + 150.0 * (i % 3), 3000.0) for i in range(8)]
    wl = workload(*(job(f"j{i:02d}", at, gpus, run, limit=limit, tenant=f"t{i}") for i, (at, gpus, run, limit) in enumerate(rows)))
    engine = Engine(wl, fleet_of(1), Sjf(), "sjf", SimOptions(cycle_s=0.0, tick_s=60.0, learned_runtimes=True, strict=True))

    def learned_arrivals(now: float) -> list[PendingJob]:
        return engine.arrivals(now, now + 1e6, true_runtimes=False)

    def true_arrivals(now: float) -> list[PendingJob]:
        return engine.arrivals(now, now + 1e6, true_runtimes=True)

    kw: dict[str, Any] = {"every_s": 1.0, "step_s": 0.0, "max_steps": 10_000}
    replay = EstimatorProbe(Sjf, **kw, arrivals=learned_arrivals, replay=engine.true_times)
    told_true = EstimatorProbe(Sjf, **kw, view=engine.with_true_runtimes, arrivals=true_arrivals)

    def hook(snapshot: Snapshot, now: float, new_ids: list[str]) -> None:
        replay(snapshot, now, new_ids)
        told_true(snapshot, now, new_ids)

    result = engine.run(hook=hook)
    starts = {r.id: r.first_start for r in result.records}
    assert len(replay.raw_predictions) >= 10
    assert [(p[0], p[2]) for p in replay.raw_predictions] == [(p[0], starts[p[0]]) for p in replay.raw_predictions]
    assert any(p[2] != starts[p[0]] for p in told_true.raw_predictions)
