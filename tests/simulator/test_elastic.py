"""Elastic jobs in the simulator (SPEC R9.2): the same core grows and shrinks them, the engine applies and prices it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import SchedulerConfig, run_cycle
from scheduler.core.types import Snapshot
from simulator.engine import JobRecord, SimOptions, SimResult, simulate
from simulator.fleet import load_fleet
from simulator.metrics import summarize
from simulator.workload import SimJob, make_elastic, philly_workload, speed
from tests.simulator.helpers import fleet_of, job, workload

CONFIG = SchedulerConfig(elastic_grow_idle_s=300.0, elastic_resize_interval_s=600.0)
EXACT = SimOptions(cycle_s=0.0, tick_s=60.0, restart_overhead_s=0.0, strict=True, config=CONFIG)


def elastic(id: str, submit: float, lo: int, hi: int, duration: float, **kw: object) -> SimJob:
    return replace(job(id, submit, lo, duration, **kw), gpu_max=hi, topology_level="node" if hi <= 8 else "leaf")  # type: ignore[arg-type]


def record(result: SimResult, job_id: str) -> JobRecord:
    return next(r for r in result.records if r.id == job_id)


def test_an_elastic_job_starts_at_its_minimum_grows_onto_idle_gpus_and_pays_for_the_restart():
    # 8 GPUs, one job of 4-8 GPUs needing 1,000 s at 8 GPUs, checkpointing every 100 s.
    wl = workload(elastic("e", 0, 4, 8, 1000.0, ckpt=100.0))
    r = simulate(wl, fleet_of(1), run_cycle, options=EXACT)
    e = record(r, "e")
    assert e.first_start == 0 and e.resizes == 1 and r.resizes == {"grow": 1}
    # At 4 GPUs it runs at (4/8)**0.8 of its speed; it grows at 600 s (its resize interval; the node has
    # been idle since the start), keeps the 600 s of checkpointed work and finishes the rest at full speed.
    done = 600.0 * speed(4, 8)
    assert e.finish == pytest.approx(600.0 + (1000.0 - done))
    assert e.held_gpu_s == pytest.approx(600.0 * 4 + (1000.0 - done) * 8)
    assert e.resize_lost_gpu_s == pytest.approx(0.0) and e.lost_gpu_s == 0.0


def test_a_resize_loses_the_work_since_the_last_checkpoint_and_the_restart_overhead():
    options = replace(EXACT, restart_overhead_s=50.0)
    wl = workload(elastic("e", 0, 4, 8, 1000.0, ckpt=250.0))
    e = record(simulate(wl, fleet_of(1), run_cycle, options=options), "e")
    # Grown at 600 s: checkpoints at 250 and 500 s, so 100 s on 4 GPUs lost; then 50 s of restart on 8.
    assert e.resize_lost_gpu_s == pytest.approx(100.0 * 4)
    assert e.finish == pytest.approx(600.0 + 50.0 + (1000.0 - 500.0 * speed(4, 8)))


def test_a_fixed_job_takes_back_the_extra_gpus_without_preempting_anyone():
    # "e" grows to 8 GPUs, then "f" (4 GPUs) arrives: "e" shrinks back to its minimum and "f" starts.
    wl = workload(elastic("e", 0, 4, 8, 20_000.0, ckpt=300.0), job("f", 2000, 4, 500, tenant="b"))
    r = simulate(wl, fleet_of(1), run_cycle, options=EXACT)
    e, f = record(r, "e"), record(r, "f")
    assert r.resizes == {"grow": 2, "shrink": 1} and r.preemptions == 0
    assert f.first_start is not None and f.first_start <= 2000 + 60
    # Once "f" is done the idle GPUs are "e"'s again: it grows a second time.
    assert e.finish is not None and e.resizes == 3


def test_rigid_runs_the_same_jobs_fixed_at_their_maximum():
    wl = workload(elastic("e", 0, 4, 8, 1000.0, ckpt=100.0))
    r = simulate(wl, fleet_of(1), run_cycle, options=replace(EXACT, rigid=True))
    e = record(r, "e")
    assert (e.first_start, e.finish, e.resizes, e.gpu_max) == (0, 1000.0, 0, None)
    assert r.resizes == {}


_rows = st.lists(
    st.tuples(
        st.floats(0, 20_000),
        st.sampled_from([(1, 1), (2, 4), (4, 8), (8, 16), (8, 24), (16, 16), (2, 2)]),
        st.floats(60, 30_000),
        st.sampled_from(["a", "b"]),
        st.sampled_from([0, 100, 200]),
        st.sampled_from([math.inf, 600.0]),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=_rows, failures=st.booleans())
def test_elastic_runs_keep_every_job_inside_its_range_and_every_gpu_booked_once(rows: list[tuple], failures: bool):
    jobs = [
        replace(
            job(f"j{i}", submit, lo, duration, tenant=tenant, priority=priority, ckpt=ckpt),
            gpu_max=hi if hi > lo else None,
            preemptible=priority < 200,
            topology_level="node" if hi <= 8 else "leaf",
        )
        for i, (submit, (lo, hi), duration, tenant, priority, ckpt) in enumerate(rows)
    ]
    wl = workload(*jobs)
    fleet = fleet_of(4, per_leaf=2)
    seen: list[int] = []

    def audit(snap: Snapshot, now: float, new_ids: list[str]) -> None:
        held: set[tuple[str, int]] = set()
        for run in snap.running:
            gpus = {(m.node_id, g) for m in run.members for g in m.gpu_indices}
            assert not gpus & held, "a GPU is held twice"
            held |= gpus
            assert run.gpu_count == len(gpus)
            if run.elastic:
                assert run.gpu_min is not None and run.gpu_max is not None
                assert run.gpu_min <= run.gpu_count <= run.gpu_max
                seen.append(run.gpu_count)
        for n in snap.nodes:
            assert not {(n.id, g) for g in n.free} & held, "a GPU is both free and held"

    options = SimOptions(cycle_s=30.0, strict=True, node_mtbf_h=5.0 if failures else None, node_repair_h=1.0, config=CONFIG)
    r = simulate(wl, fleet, run_cycle, options=options, hook=audit)
    assert r.invalid == []
    assert all(rec.finish is not None for rec in r.records)
    for rec, j in zip(sorted(r.records, key=lambda x: x.id), sorted(wl.jobs, key=lambda x: x.id), strict=True):
        assert rec.finish is not None and rec.finish - rec.submit >= j.duration_s - 1e-6  # never faster than at its maximum
        assert rec.resizes == 0 or j.elastic


def test_make_elastic_is_seeded_halves_the_size_in_whole_nodes_and_stretches_the_limit():
    fleet = load_fleet("spec")
    base = philly_workload(fleet, seed=0, load=0.7, jobs=3000)
    wl = make_elastic(base, fleet, 0.5, seed=0)
    assert wl == make_elastic(base, fleet, 0.5, seed=0)
    assert make_elastic(base, fleet, 0.0) == base
    sizes = fleet.node_size()
    changed = [(b, e) for b, e in zip(base.jobs, wl.jobs, strict=True) if e.elastic]
    multi = [b for b in base.jobs if b.gpu_count > 1]
    assert 0.4 < len(changed) / len(multi) < 0.6
    assert all(b.gpu_count == 1 for b, e in zip(base.jobs, wl.jobs, strict=True) if b == e and b.gpu_count < 2)
    for b, e in changed:
        assert e.gpu_max == b.gpu_count and e.gpu_count < b.gpu_count
        step = sizes[b.gpu_type] if b.gpu_count > sizes[b.gpu_type] else 1
        assert e.gpu_count % step == 0 and e.gpu_count >= b.gpu_count / 2
        assert e.max_runtime_s == pytest.approx(b.max_runtime_s / speed(e.gpu_count, b.gpu_count))
        assert (e.duration_s, e.submit_s, e.tenant, e.gpu_type) == (b.duration_s, b.submit_s, b.tenant, b.gpu_type)
    with pytest.raises(ValueError, match="elastic share"):
        make_elastic(base, fleet, 1.5)


def test_the_summary_counts_elastic_jobs_resizes_and_their_cost():
    wl = workload(elastic("e", 0, 4, 8, 20_000.0, ckpt=300.0), job("f", 2000, 4, 500, tenant="b"))
    s = summarize(simulate(wl, fleet_of(1), run_cycle, options=replace(EXACT, restart_overhead_s=60.0)))
    assert s.elastic_jobs == 1 and s.resizes.get("grow", 0) >= 1 and s.resizes.get("shrink") == 1
    assert s.resize_lost_gpu_h > 0 and s.lost_gpu_h == 0
