"""Workload rules, the synthetic generator and fleets."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.fleet import load_fleet, spec_fleet
from simulator.workload import (
    SimJob,
    Workload,
    csv_workload,
    offered_load,
    philly_workload,
    read_philly_rows,
    resolve_tenants,
    synthetic_workload,
    type_loads,
    write_csv,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_spec_fleet_has_750_nodes_and_5000_gpus_under_leaves_and_spines():
    fleet = spec_fleet()
    assert len(fleet.nodes) == 750 and fleet.total_gpus() == 5000
    assert all(dict(n.labels).keys() == {"leaf", "spine"} for n in fleet.nodes)
    leaves = {dict(n.labels)["leaf"]: n.gpu_type for n in fleet.nodes}
    assert len(leaves) > 1


def test_a_fleet_loads_from_the_dev_cluster_config():
    fleet = load_fleet(str(ROOT / "examples" / "cluster.yaml"))
    assert {n.id for n in fleet.nodes} >= {"h100-a", "l40s-a"}
    assert {t.name for t in fleet.tenants} >= {"vision", "nlp"}


def test_the_bundled_philly_trace_is_complete():
    assert len(read_philly_rows()) == 24_743


def test_philly_rules_are_seeded_and_reach_the_target_load():
    fleet = spec_fleet()
    a = philly_workload(fleet, seed=1, load=0.9, jobs=2000)
    b = philly_workload(fleet, seed=1, load=0.9, jobs=2000)
    c = philly_workload(fleet, seed=2, load=0.9, jobs=2000)
    assert a == b and a != c
    assert offered_load(a, fleet.total_gpus()) == pytest.approx(0.9)
    sizes = fleet.node_size()
    for j in a.jobs:
        assert j.gpu_count <= sizes[j.gpu_type] or j.gpu_count % sizes[j.gpu_type] == 0
        assert 60 <= j.duration_s <= 48 * 3600 and j.max_runtime_s >= j.duration_s
    assert len({j.tenant for j in a.jobs}) >= 5


def test_philly_repeats_past_its_end():
    fleet = spec_fleet()
    rows = read_philly_rows()[:50]
    wl = philly_workload(fleet, jobs=120, rows=rows)
    assert len(wl.jobs) == 120 and len({j.id for j in wl.jobs}) == 120


def test_the_synthetic_generator_stays_within_the_spec():
    fleet = spec_fleet()
    wl = synthetic_workload(fleet, seed=4, load=0.7, jobs=3000)
    assert len({t.name for t in wl.tenants}) == 50
    assert {j.gpu_count for j in wl.jobs} <= {1, 2, 4, 8, 16, 32, 64}
    assert all(900 <= j.duration_s <= 48 * 3600 + 1e-6 for j in wl.jobs)
    span_h = (wl.jobs[-1].submit_s - wl.jobs[0].submit_s) / 3600
    assert len(wl.jobs) / span_h <= 500
    assert synthetic_workload(fleet, seed=4, load=0.7, jobs=3000) == wl


def test_a_workload_round_trips_through_csv(tmp_path: Path):
    fleet = spec_fleet()
    wl = synthetic_workload(fleet, seed=0, jobs=50)
    write_csv(wl, tmp_path / "w.csv")
    back = csv_workload(tmp_path / "w.csv", fleet)
    assert [(j.id, j.gpu_count, j.duration_s, j.priority) for j in back.jobs] == [
        (j.id, j.gpu_count, j.duration_s, j.priority) for j in wl.jobs
    ]


def test_unconfigured_tenants_get_quotas_in_proportion_to_their_weight():
    spec = spec_fleet()
    wl = philly_workload(spec, jobs=500)
    tenants = resolve_tenants(spec, wl)
    heaviest = max(tenants, key=lambda t: t.weight)
    lightest = min(tenants, key=lambda t: t.weight)
    nominal = {t.name: sum(q.nominal for _, q in t.quotas) for t in tenants}
    assert nominal[heaviest.name] > nominal[lightest.name]
    # Largest remainder: every GPU of every type lies within exactly one tenant's nominal quota.
    for gpu_type, capacity in spec.capacity().items():
        assert sum(dict(t.quotas)[gpu_type].nominal for t in tenants) == capacity
    for t in tenants:
        for gpu_type, quota in t.quotas:
            exact = spec.capacity()[gpu_type] * t.weight / sum(u.weight for u in tenants)
            assert abs(quota.nominal - exact) < 1


def test_every_gpu_type_of_a_synthetic_workload_sees_about_the_target_load():
    """A fleet at load 0.7 must not hide one type at more than 1 (its queue would grow without bound)."""
    fleet = spec_fleet()
    wl = synthetic_workload(fleet, seed=0, load=0.7, jobs=20000)
    span = wl.jobs[-1].submit_s - wl.jobs[0].submit_s
    demand: dict[str, float] = {}
    for j in wl.jobs:
        demand[j.gpu_type] = demand.get(j.gpu_type, 0.0) + j.gpu_count * j.duration_s
    per_type = {t: demand.get(t, 0.0) / span / c for t, c in fleet.capacity().items()}
    assert offered_load(wl, fleet.total_gpus()) == pytest.approx(0.7, abs=0.05)
    assert all(0.55 <= load <= 0.85 for load in per_type.values()), per_type


def _job(n: int, submit_h: float, gpu_type: str, gpus: int, hours: float, gpu_max: int | None = None) -> SimJob:
    return SimJob(
        id=f"j{n}", tenant="a", submit_s=submit_h * 3600.0, gpu_type=gpu_type, gpu_count=gpus,
        duration_s=hours * 3600.0, max_runtime_s=2 * hours * 3600.0, gpu_max=gpu_max,
    )  # fmt: skip


def test_type_loads_give_each_types_load_over_the_submissions_and_in_its_busiest_window():
    # 10 GPUs of "x" over 48 h of submissions: 240 GPU-hours in the first day (24 + 48 + 168), 60 more at 48 h
    # (the window ending there, (24 h, 48 h], holds only that job of x).
    jobs = (
        _job(0, 0.0, "x", 1, 24.0),
        _job(1, 10.0, "x", 4, 12.0),
        _job(2, 23.0, "x", 7, 24.0),
        _job(3, 30.0, "y", 2, 1.0, gpu_max=4),  # an elastic job counts at its maximum
        _job(4, 48.0, "x", 5, 12.0),
    )
    loads = type_loads(Workload(name="w", jobs=jobs, tenants=()), {"x": 10, "y": 4, "z": 8})
    assert loads["x"] == pytest.approx((300.0 / (10 * 48), 240.0 / (10 * 24)))
    assert loads["y"] == pytest.approx((4.0 / (4 * 48), 4.0 / (4 * 24)))
    assert loads["z"] == (0.0, 0.0)
    # A 20 h window ending at job 2 (23 h) no longer holds job 0: its busiest holds jobs 1 and 2.
    short = type_loads(Workload(name="w", jobs=jobs, tenants=()), {"x": 10}, window_s=20 * 3600.0)
    assert short["x"][1] == pytest.approx((48.0 + 168.0) / (10 * 20))
    # A window longer than the submissions' span is the span itself.
    assert type_loads(Workload(name="w", jobs=jobs, tenants=()), {"x": 10}, window_s=100 * 3600.0)["x"] == pytest.approx((0.625, 0.625))
    with pytest.raises(ValueError, match="window_s"):
        type_loads(Workload(name="w", jobs=jobs, tenants=()), {"x": 10}, window_s=0.0)
