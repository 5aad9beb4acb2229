"""The engine on hand-checked workloads, and invariants under random ones for every policy."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.types import Snapshot
from simulator.engine import Engine, SimOptions, SimResult, simulate
from simulator.fleet import Fleet, TenantSpec
from simulator.policies import POLICIES
from simulator.policies.las import TwoDLas
from simulator.policies.multifactor import MultifactorEasy
from simulator.policies.simple import Fifo
from simulator.workload import SimJob, Workload
from tests.simulator.helpers import fleet_of, job, workload

EXACT = SimOptions(cycle_s=0.0, tick_s=60.0, restart_overhead_s=0.0, strict=True)


def _by_id(result: SimResult) -> dict[str, tuple[float | None, float | None]]:
    return {r.id: (r.first_start, r.finish) for r in result.records}


def test_fifo_runs_a_single_node_queue_back_to_back():
    wl = workload(job("a", 0, 8, 100), job("b", 10, 4, 50), job("c", 20, 4, 30))
    r = simulate(wl, fleet_of(1), Fifo(), options=EXACT)
    assert _by_id(r) == {"a": (0, 100), "b": (100, 150), "c": (100, 130)}
    assert [rec.queued_s for rec in r.records] == [0, 90, 80]


def test_easy_backfill_in_a_run_starts_the_short_job_in_the_hole_and_keeps_the_head_on_time():
    # One node. "a" holds 4 GPUs until 100; "head" needs all 8; "short" (limit 90) fits the hole, "long" does not.
    wl = workload(job("a", 0, 4, 100), job("head", 1, 8, 50), job("short", 2, 4, 80, limit=90), job("long", 3, 4, 80, limit=200))
    r = simulate(wl, fleet_of(1), MultifactorEasy(), options=EXACT)
    got = _by_id(r)
    assert got["short"] == (2, 82)
    assert got["head"] == (100, 150)
    assert got["long"][0] == 150


def test_fifo_does_not_backfill_the_same_hole():
    wl = workload(job("a", 0, 4, 100), job("head", 1, 8, 50), job("short", 2, 4, 80, limit=90))
    got = _by_id(simulate(wl, fleet_of(1), Fifo(), options=EXACT))
    assert got["short"][0] == 150


def test_a_preempted_job_loses_the_work_since_its_checkpoint_and_pays_the_restart():
    # "old" checkpoints every 1,000 s; LAS preempts it at 7,200 s for "new" (it has run 7,200 s on 8 GPUs).
    options = SimOptions(cycle_s=0.0, tick_s=60.0, restart_overhead_s=100.0, strict=True)
    wl = workload(job("old", 0, 8, 20_000, ckpt=1000.0), job("new", 7200, 8, 500))
    r = simulate(wl, fleet_of(1), TwoDLas(), options=options)
    old = next(x for x in r.records if x.id == "old")
    assert r.preemptions == 1 and old.preemptions == 1
    # Lost: 200 s since the checkpoint at 7,000 s, on 8 GPUs.
    assert old.lost_gpu_s == pytest.approx(200 * 8)
    # Restarted at 7,700 after "new"; needs 100 s overhead + 13,000 s of work left.
    assert old.finish == pytest.approx(7700 + 100 + 13_000)


def test_node_failures_requeue_jobs_and_every_job_still_finishes():
    wl = workload(*(job(f"j{i}", i * 100.0, 4, 5000, ckpt=600.0) for i in range(20)))
    options = SimOptions(cycle_s=0.0, node_mtbf_h=2.0, node_repair_h=0.5, strict=True, seed=3)
    r = simulate(wl, fleet_of(4), Fifo(), options=options)
    assert r.failures > 0
    assert all(x.finish is not None for x in r.records)
    _check_work_conserved(wl, r, options)


def _check_work_conserved(wl: Workload, r: SimResult, options: SimOptions) -> None:
    jobs = {j.id: j for j in wl.jobs}
    for rec in r.records:
        j = jobs[rec.id]
        assert rec.finish is not None, rec.id
        assert rec.first_start is not None and rec.first_start >= j.submit_s
        restarted = rec.preemptions + rec.failures > 0
        useful = rec.held_gpu_s - rec.lost_gpu_s
        expected = j.gpu_count * (j.duration_s + (options.restart_overhead_s if restarted else 0.0))
        assert useful == pytest.approx(expected, rel=1e-6, abs=1e-3), rec.id
        assert rec.finish - rec.submit >= j.duration_s - 1e-6


class _Audit:
    """A cycle hook that checks the snapshot: no GPU both free and held, none held twice, capacity adds up."""

    def __init__(self, fleet: Fleet) -> None:
        self.size = {n.id: n.gpus for n in fleet.nodes}
        self.cycles = 0

    def __call__(self, snap: Snapshot, now: float, new_ids: list[str]) -> None:
        self.cycles += 1
        held: dict[str, set[int]] = {}
        for r in snap.running:
            assert r.started_at <= now
            for m in r.members:
                gpus = held.setdefault(m.node_id, set())
                assert not gpus & set(m.gpu_indices), f"GPU held twice on {m.node_id}"
                gpus |= set(m.gpu_indices)
        for n in snap.nodes:
            assert not n.free & held.get(n.id, set()), f"GPU both free and held on {n.id}"
            assert len(n.free) + len(held.get(n.id, ())) <= self.size[n.id]
        for p in snap.pending:
            assert p.submitted_at is not None and p.submitted_at <= now


_jobs = st.lists(
    st.tuples(
        st.floats(0, 20_000),
        st.sampled_from([1, 1, 2, 4, 8, 16]),
        st.floats(60, 30_000),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from([0, 100, 200]),
        st.sampled_from([math.inf, 600.0, 1800.0]),
        st.floats(1.0, 2.0),
    ),
    min_size=1,
    max_size=40,
)


@pytest.mark.parametrize("policy", [p for p in POLICIES])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=_jobs, failures=st.booleans())
def test_invariants_hold_for_random_workloads(policy: str, rows: list[tuple], failures: bool):
    jobs = [
        SimJob(
            id=f"j{i}",
            tenant=tenant,
            submit_s=submit,
            gpu_type="H100",
            gpu_count=gpus,
            duration_s=duration,
            max_runtime_s=duration * slack,
            priority=priority,
            preemptible=priority < 200,
            checkpoint_interval_s=ckpt,
            topology_level="node" if gpus <= 8 else "leaf",
        )
        for i, (submit, gpus, duration, tenant, priority, ckpt, slack) in enumerate(rows)
    ]
    wl = workload(*jobs)
    fleet = fleet_of(4, per_leaf=2)
    spec = POLICIES[policy]
    options = SimOptions(
        cycle_s=30.0,
        strict=True,
        oracle_runtime=spec.oracle_runtime,
        fresh_checkpoints=spec.needs_checkpoints,
        node_mtbf_h=5.0 if failures else None,
        node_repair_h=1.0,
    )
    audit = _Audit(fleet)
    r = simulate(wl, fleet, spec.make(), name=policy, options=options, hook=audit)
    assert r.invalid == []
    _check_work_conserved(wl, r, options)
    for used, cap in zip(r.samples.used, r.samples.capacity, strict=True):
        assert all(u <= c for u, c in zip(used, cap, strict=True))


def test_ours_backfills_the_hole_only_with_the_job_that_ends_before_the_reservation():
    # The production core states EASY backfill behind the head's reservation. The tenant's quota is set
    # above the fleet so that only capacity (not quota admission) blocks the head.
    from scheduler.core import Quota, run_cycle

    wl = workload(job("a", 0, 4, 100), job("head", 1, 8, 50), job("short", 2, 4, 80, limit=90), job("long", 3, 4, 80, limit=200))
    fleet = fleet_of(1)
    fleet = Fleet(nodes=fleet.nodes, tenants=(TenantSpec(name="a", quotas=(("H100", Quota(nominal=16)),)),))
    got = _by_id(simulate(wl, fleet, run_cycle, options=EXACT))
    assert got["short"] == (2, 82)
    assert got["head"] == (100, 150)
    assert got["long"][0] == 150


def test_gpu_faults_take_the_gpu_away_and_requeue_its_job():
    wl = workload(*(job(f"j{i}", i * 50.0, 1, 4000, ckpt=900.0) for i in range(12)))
    options = SimOptions(cycle_s=0.0, gpu_mtbf_h=5.0, gpu_repair_h=1.0, strict=True, seed=1)
    fleet = fleet_of(4)  # 32 GPUs for 12 one-GPU jobs: faults hit running jobs and idle GPUs
    engine = Engine(wl, fleet, Fifo(), "fifo", options)
    seen_broken: set[tuple[str, int]] = set()

    def no_broken_gpu_in_use(snap: Snapshot, now: float, new_ids: list[str]) -> None:
        broken = {(n.id, g) for i, n in enumerate(fleet.nodes) for g in engine.broken[i]}
        seen_broken.update(broken)
        for view in snap.nodes:
            assert not {(view.id, g) for g in view.free} & broken, f"a broken GPU is offered on {view.id}"
        for run in snap.running:
            assert not {(m.node_id, g) for m in run.members for g in m.gpu_indices} & broken, f"{run.id} runs on a broken GPU"

    r = engine.run(hook=no_broken_gpu_in_use)
    assert seen_broken, "no cycle ran while a GPU was broken"
    # Some fault hit a running job: it lost its attempt, was queued again and still finished.
    hit = [rec for rec in r.records if rec.failures]
    assert hit and r.failures == sum(rec.failures for rec in r.records)
    assert all(rec.lost_gpu_s > 0 and rec.finish is not None for rec in hit)
    # While GPUs are out, the fleet's capacity counts them out.
    assert min(cap[0] for cap in r.samples.capacity) < fleet.total_gpus()
    _check_work_conserved(wl, r, options)
