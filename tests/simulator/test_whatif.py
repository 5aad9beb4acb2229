"""The what-if's pure part: each kind of change moves the predicted starts the right way, bad changes are refused
naming the field, and "no change" is the queue-wait estimator's own forecast."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.core import Quota, Scheduler, SchedulerConfig, TenantView
from scheduler.core.types import Snapshot
from simulator.estimate import queue_estimates
from simulator.whatif import (
    ALL,
    AddNodes,
    Proposal,
    ProposalError,
    QuotaChange,
    apply,
    compare,
    describe,
    policy_value,
    what_if,
)
from tests.simulator.helpers import node, pending, running, snapshot

STEP = 30.0
HORIZON = 24 * 3600.0


def run(snap: Snapshot, proposal: Proposal, horizon_s: float = HORIZON):
    return what_if(snap, proposal, 0.0, horizon_s=horizon_s, step_s=STEP, max_steps=2000)


def shifts(result) -> dict[str, tuple[float | None, float | None]]:
    return {j.job_id: (j.before, j.after) for j in result.jobs}


def row(result, tenant: str):
    (found,) = [t for t in result.tenants if t.tenant == tenant]
    return found


#: Enough of a guarantee that quotas never hold a job back.
PLENTY = (("H100", Quota(nominal=64)),)


def busy_fleet() -> Snapshot:
    """Two full 8-GPU nodes (n0 frees at 3000 s, n1 at 600 s) and two 8-GPU jobs of tenant a waiting."""
    snap = snapshot(
        [node("n0", 0), node("n1", 0)],
        [pending("first", 8, at=1.0, runtime=1200.0), pending("second", 8, at=2.0, runtime=1200.0)],
        [running("r0", "n0", tuple(range(8)), end=3000.0), running("r1", "n1", tuple(range(8)), end=600.0)],
    )
    return dataclasses.replace(snap, tenants=(TenantView(name="a", quotas=PLENTY),))


def test_no_change_is_the_queue_wait_estimators_forecast_twice() -> None:
    snap = busy_fleet()
    result = run(snap, Proposal())
    live = {e.job_id: e.start_at for e in queue_estimates(snap, 0.0, Scheduler().run_cycle, step_s=STEP, max_steps=400)}
    assert shifts(result) == {job_id: (start, start) for job_id, start in live.items()}
    assert shifts(result) == {"first": (600.0, 600.0), "second": (1800.0, 1800.0)}
    assert describe(snap, Proposal()) == ["no change"]


def test_draining_a_node_delays_the_jobs_that_would_have_started_on_it() -> None:
    result = run(busy_fleet(), Proposal(drain=("n1",)))
    assert shifts(result) == {"first": (600.0, 3000.0), "second": (1800.0, 4200.0)}
    a = row(result, "a")
    assert (a.waiting, a.mean_wait_before_s, a.mean_wait_after_s) == (2, 1200.0, 3600.0)
    assert (a.median_wait_before_s, a.median_wait_after_s) == (1200.0, 3600.0)
    assert row(result, ALL) == dataclasses.replace(a, tenant=ALL)


def test_adding_nodes_advances_the_waiting_jobs() -> None:
    result = run(busy_fleet(), Proposal(add_nodes=(AddNodes(count=2, gpu_type="H100", gpus=8),)))
    assert shifts(result) == {"first": (600.0, 0.0), "second": (1800.0, 0.0)}
    assert row(result, "a").mean_wait_after_s == 0.0


def test_a_job_that_starts_only_beyond_the_horizon_counts_as_waiting_the_whole_horizon() -> None:
    result = run(busy_fleet(), Proposal(drain=("n1",)), horizon_s=3600.0)
    assert shifts(result) == {"first": (600.0, 3000.0), "second": (1800.0, None)}
    a = row(result, "a")
    assert (a.started_before, a.started_after) == (2, 1)
    assert a.mean_wait_after_s == (3000.0 + 3600.0) / 2
    assert [j.shift_s for j in result.jobs] == [2400.0, None]


def two_tenants(weight_b: float = 1.0) -> Snapshot:
    """One 8-GPU node, free at 100 s; tenants a and b each with eight 1-GPU jobs of 1000 s, and the same past usage."""
    queue = [pending(f"{t}{i}", 1, tenant=t, runtime=1000.0) for t in "ab" for i in range(8)]
    past = (("H100", 8 * 3600.0 * 10),)
    tenants = (
        TenantView(name="a", quotas=PLENTY, decayed_usage=past),
        TenantView(name="b", weight=weight_b, quotas=PLENTY, decayed_usage=past),
    )
    snap = snapshot([node("n0", 0)], queue, [running("r", "n0", tuple(range(8)), end=100.0)])
    return dataclasses.replace(snap, tenants=tenants)


def test_raising_a_tenants_weight_helps_it_and_costs_the_others() -> None:
    result = run(two_tenants(), Proposal(weights=(("b", 4.0),)))
    a, b = row(result, "a"), row(result, "b")
    assert b.mean_wait_after_s < b.mean_wait_before_s
    assert a.mean_wait_after_s > a.mean_wait_before_s
    assert (b.started_before, b.started_after) == (8, 8)
    assert describe(two_tenants(), Proposal(weights=(("b", 4.0),))) == ["tenant b: weight 1 -> 4"]


def test_giving_a_tenant_a_quota_lets_its_jobs_start() -> None:
    queue = [pending("b0", 4, tenant="b", runtime=600.0)]
    tenants = (TenantView(name="a", quotas=(("H100", Quota(nominal=8)),)), TenantView(name="b"))
    snap = dataclasses.replace(snapshot([node("n0", 8)], queue), tenants=tenants)
    result = run(snap, Proposal(quotas=(QuotaChange(tenant="b", gpu_type="H100", quota=Quota(nominal=4)),)))
    assert shifts(result) == {"b0": (None, 0.0)}
    assert (row(result, "b").started_before, row(result, "b").started_after) == (0, 1)
    # And taking it away again stops them.
    changed = apply(snap, Proposal(quotas=(QuotaChange(tenant="a", gpu_type="H100", quota=None),)), now=0.0)
    assert dict((t.name, t.quotas) for t in changed.tenants)["a"] == ()


def test_turning_backfill_off_delays_a_small_job_behind_the_head() -> None:
    # Half of n0 is busy until 1000 s; the 8-GPU head waits for it; a short 2-GPU job fits in the other half now.
    snap = snapshot(
        [node("n0", {4, 5, 6, 7})],
        [pending("head", 8, at=1.0, runtime=600.0), pending("small", 2, at=2.0, runtime=300.0)],
        [running("r", "n0", (0, 1, 2, 3), end=1000.0)],
        tenants=(),
    )
    # In age order (no short-job boost, which would put the small job first anyway).
    snap = dataclasses.replace(snap, config=SchedulerConfig(short_job_boost=0.0))
    result = run(snap, Proposal(policy=(("backfill", False),)))
    before, after = shifts(result)["small"]
    assert before == 0.0 and after is not None and after > before
    assert describe(snap, Proposal(policy=(("backfill", False),))) == ["policy backfill: True -> False"]


def test_added_nodes_join_a_named_domain_with_its_wider_levels_or_a_new_one() -> None:
    snap = busy_fleet()  # n0 and n1 are on leaf l0, spine s0
    named = apply(snap, Proposal(add_nodes=(AddNodes(count=2, gpu_type="H100", gpus=4, domain=(("leaf", "l0"),)),)), now=5.0)
    added = [n for n in named.nodes if n.id not in ("n0", "n1")]
    assert [(n.gpu_count, n.labels, n.free, n.schedulable) for n in added] == [
        (4, (("leaf", "l0"), ("spine", "s0")), frozenset(range(4)), True)
    ] * 2
    assert len({n.id for n in added}) == 2
    fresh = apply(snap, Proposal(add_nodes=(AddNodes(count=1, gpu_type="A100", gpus=8),)), now=5.0)
    (new,) = [n for n in fresh.nodes if n.gpu_type == "A100"]
    assert dict(new.labels)["leaf"] not in ("l0",) and dict(new.labels)["spine"] != "s0"
    assert apply(snap, Proposal(drain=("n0",)), now=0.0).nodes[0].schedulable is False
    assert apply(snap, Proposal(), now=0.0) is snap


def test_a_changed_half_life_takes_the_usage_integrated_again() -> None:
    snap = two_tenants()
    changed = apply(snap, Proposal(policy=(("usage_half_life_s", 3600.0),)), now=0.0, decayed={"a": {"H100": 5.0}})
    assert changed.config.usage_half_life_s == 3600.0
    assert {t.name: t.decayed_usage for t in changed.tenants} == {"a": (("H100", 5.0),), "b": ()}


@pytest.mark.parametrize(
    ("proposal", "field", "words"),
    [
        (Proposal(weights=(("ghost", 2.0),)), "weights.ghost", "no tenant 'ghost'"),
        (Proposal(weights=(("a", 0.0),)), "weights.a", "above 0"),
        (Proposal(weights=(("a", float("nan")),)), "weights.a", "above 0"),
        (Proposal(drain=("n9",)), "drain", "no node 'n9'"),
        (Proposal(quotas=(QuotaChange(tenant="ghost", gpu_type="H100", quota=Quota()),)), "quotas.ghost.H100", "no tenant"),
        (Proposal(quotas=(QuotaChange(tenant="a", gpu_type="TPU", quota=Quota()),)), "quotas.a.TPU", "no GPU type 'TPU'"),
        (Proposal(quotas=(QuotaChange(tenant="a", gpu_type="H100", quota=Quota(nominal=-1)),)), "quotas.a.H100", "nominal"),
        (Proposal(add_nodes=(AddNodes(count=0, gpu_type="H100", gpus=8),)), "add_nodes[0].count", "at least 1"),
        (Proposal(add_nodes=(AddNodes(count=1, gpu_type="H100", gpus=0),)), "add_nodes[0].gpus", "at least 1"),
        (Proposal(add_nodes=(AddNodes(count=1, gpu_type="", gpus=8),)), "add_nodes[0].gpu_type", "needed"),
        (Proposal(add_nodes=(AddNodes(count=1, gpu_type="H100", gpus=8, domain=(("rack", "r1"),)),)), "add_nodes[0].domain", "'rack'"),
        (Proposal(policy=(("speed", 1.0),)), "policy.speed", "no policy setting 'speed'"),
        (Proposal(policy=(("aging_per_hour", -1.0),)), "policy.aging_per_hour", "negative"),
    ],
)
def test_a_bad_change_is_refused_naming_its_field(proposal: Proposal, field: str, words: str) -> None:
    with pytest.raises(ProposalError) as err:
        run(busy_fleet(), proposal)
    assert err.value.field == field and words in err.value.reason, err.value


def test_a_quota_can_be_set_for_a_gpu_type_only_the_added_nodes_bring() -> None:
    proposal = Proposal(
        add_nodes=(AddNodes(count=1, gpu_type="A100", gpus=8),), quotas=(QuotaChange(tenant="a", gpu_type="A100", quota=Quota(nominal=8)),)
    )
    changed = apply(busy_fleet(), proposal, now=0.0)
    assert dict(changed.tenants[0].quotas) == {"A100": Quota(nominal=8), "H100": Quota(nominal=64)}


def test_policy_values_are_checked_against_the_settings_types() -> None:
    assert policy_value("backfill", "false") is False and policy_value("backfill", True) is True
    assert policy_value("aging_per_hour", "20") == 20.0 and policy_value("max_wait_s", 3600) == 3600.0
    assert policy_value("max_preemption_plans", "4") == 4
    for name, value, words in [
        ("backfill", "maybe", "not a boolean"),
        ("aging_per_hour", "fast", "not a number"),
        ("aging_per_hour", True, "not a number"),
        ("aging_per_hour", "inf", "not a finite number"),
        ("aging_per_hour", 10**400, "not a number"),
        ("max_preemption_plans", "1.5", "not a whole number"),
    ]:
        with pytest.raises(ProposalError) as err:
            policy_value(name, value)
        assert err.value.field == f"policy.{name}" and words in err.value.reason


def test_compare_counts_starts_before_now_as_now_and_sorts_by_the_start_without_the_change() -> None:
    snap = snapshot([node("n0", 0)], [pending("x", 1), pending("y", 1, tenant="b"), pending("z", 1)], tenants=("a", "b"))
    result = compare(snap, {"x": 50.0, "y": 90.0}, {"x": 120.0, "y": 10.0, "z": 300.0}, now=60.0, horizon_s=1000.0)
    assert [(j.job_id, j.before, j.after) for j in result.jobs] == [("x", 60.0, 120.0), ("y", 90.0, 60.0), ("z", None, 300.0)]
    a = row(result, "a")
    assert (a.waiting, a.started_before, a.started_after) == (2, 1, 2)
    assert (a.mean_wait_before_s, a.mean_wait_after_s) == ((0.0 + 1000.0) / 2, (60.0 + 240.0) / 2)
    assert [t.tenant for t in result.tenants] == ["a", "b", ALL]
