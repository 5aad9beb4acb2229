"""Quotas per tenant and GPU type, cohorts that lend idle quota, reclaim by preemption."""

from __future__ import annotations

from scheduler.core import Pending, Preempt, SchedulerConfig, run_cycle
from tests.scheduler.test_core_builders import H, job, leaf_nodes, placed, running, snap, tenant


def test_a_job_within_nominal_quota_is_bound() -> None:
    decisions = run_cycle(snap(leaf_nodes("l1", 1), [job("j", 8)], tenants=[tenant("a", nominal=8)]), 0.0)
    assert list(placed(decisions)) == ["j"]


def test_a_tenant_without_cohort_cannot_go_beyond_nominal_even_on_an_idle_fleet() -> None:
    decisions = run_cycle(snap(leaf_nodes("l1", 2), [job("j1", 8), job("j2", 8, queued_at=1)], tenants=[tenant("a", nominal=8)]), 0.0)
    assert list(placed(decisions)) == ["j1"]
    assert decisions.pending_codes["j2"] == Pending.OVER_QUOTA
    assert (
        decisions.pending_reasons["j2"]
        == "over quota: tenant a uses 8 H100 GPUs and asks for 8 more; its guarantee is 8 and it has no cohort to borrow from"
    )


def test_a_tenant_unknown_to_a_snapshot_with_tenants_gets_nothing() -> None:
    decisions = run_cycle(snap(leaf_nodes("l1", 1), [job("j", 1, tenant="ghost")], tenants=[tenant("a", nominal=8)]), 0.0)
    assert decisions.binds == () and decisions.pending_codes["j"] == Pending.OVER_QUOTA
    assert (
        decisions.pending_reasons["j"]
        == "over quota: tenant ghost uses 0 H100 GPUs and asks for 1 more; its guarantee is 0 and it has no cohort to borrow from"
    )


def test_a_tenant_borrows_idle_cohort_quota_up_to_its_borrow_limit() -> None:
    tenants = [tenant("a", cohort="c", nominal=8, borrow_limit=8), tenant("b", cohort="c", nominal=16)]
    pending = [job(f"a{i}", 8, queued_at=i) for i in range(3)]
    decisions = run_cycle(snap(leaf_nodes("l1", 4), pending, tenants=tenants), 0.0)
    assert sorted(placed(decisions)) == ["a0", "a1"]
    assert decisions.pending_codes["a2"] == Pending.OVER_QUOTA
    assert decisions.pending_reasons["a2"] == (
        "over quota: tenant a uses 16 H100 GPUs and asks for 8 more; its guarantee of 8 plus its borrowing limit of 8 allow 16"
    )


def test_the_lend_limit_caps_what_a_cohort_member_lends() -> None:
    tenants = [tenant("a", cohort="c", nominal=8), tenant("b", cohort="c", nominal=16, lend_limit=4)]
    pending = [job("a0", 8), job("a1", 4, queued_at=1), job("a2", 1, queued_at=2)]
    # In age order (no short-job boost): a0 and a1 take the 4 GPUs b may lend, none is left for a2.
    decisions = run_cycle(snap(leaf_nodes("l1", 4), pending, tenants=tenants, config=SchedulerConfig(short_job_boost=0.0)), 0.0)
    assert sorted(placed(decisions)) == ["a0", "a1"]
    assert decisions.pending_codes["a2"] == Pending.OVER_QUOTA
    assert decisions.pending_reasons["a2"] == (
        "over quota: tenant a uses 12 H100 GPUs and asks for 1 more; beyond its guarantee of 8, cohort c has no idle H100 quota to lend"
    )


def test_only_idle_quota_is_lent_and_never_across_cohorts() -> None:
    tenants = [tenant("a", cohort="c", nominal=8), tenant("b", cohort="c", nominal=8), tenant("x", cohort="other", nominal=16)]
    busy = running("b-run", {"l1-n0": tuple(range(8))}, tenant="b")
    decisions = run_cycle(snap(leaf_nodes("l1", 4), [job("a0", 8), job("a1", 8, queued_at=1)], running_jobs=[busy], tenants=tenants), 0.0)
    assert list(placed(decisions)) == ["a0"]
    assert decisions.pending_codes["a1"] == Pending.OVER_QUOTA
    assert decisions.pending_reasons["a1"] == (
        "over quota: tenant a uses 8 H100 GPUs and asks for 8 more; beyond its guarantee of 8, cohort c has no idle H100 quota to lend"
    )


def test_an_owner_with_queued_work_within_its_guarantee_reclaims_borrowed_gpus() -> None:
    tenants = [tenant("a", cohort="c", nominal=8), tenant("b", cohort="c", nominal=8)]
    borrowed = [
        running("a-1", {"l1-n0": tuple(range(8))}, tenant="a"),
        running("a-2", {"l1-n1": tuple(range(8))}, tenant="a", started_at=-2 * H),
    ]
    decisions = run_cycle(snap(leaf_nodes("l1", 2), [job("b0", 8, tenant="b")], running_jobs=borrowed, tenants=tenants), 0.0)
    assert decisions.binds == ()
    # a-1 started later (1 h ago, no checkpoint: 8 GPU-hours at risk) is cheaper than a-2 (16 GPU-hours).
    assert decisions.preemptions == (Preempt(job_id="a-1", attempt=1, for_job="b0", reason="reclaim"),)
    [nomination] = [r for r in decisions.reservations if r.job_id == "b0"]
    assert nomination.victims == ("a-1",) and nomination.node_ids == ("l1-n0",)
    assert decisions.pending_codes["b0"] == Pending.PREEMPTING and decisions.pending_reasons["b0"] == "waiting for preemption of a-1"


def test_no_reclaim_from_a_tenant_that_uses_only_its_own_nominal() -> None:
    tenants = [tenant("a", cohort="c", nominal=8), tenant("b", cohort="c", nominal=8)]
    own = [running("a-1", {"l1-n0": tuple(range(8))}, tenant="a")]
    decisions = run_cycle(snap(leaf_nodes("l1", 1), [job("b0", 8, tenant="b")], running_jobs=own, tenants=tenants), 0.0)
    assert decisions.preemptions == ()
    assert decisions.pending_codes["b0"] == Pending.NO_FREE_NODE


def test_a_borrower_beyond_its_nominal_does_not_reclaim() -> None:
    tenants = [tenant("a", cohort="c", nominal=8), tenant("b", cohort="c", nominal=8)]
    jobs = [running("a-1", {"l1-n0": tuple(range(8))}, tenant="a"), running("b-1", {"l1-n1": tuple(range(8))}, tenant="b")]
    decisions = run_cycle(snap(leaf_nodes("l1", 2), [job("b1", 8, tenant="b")], running_jobs=jobs, tenants=tenants), 0.0)
    assert decisions.preemptions == () and decisions.binds == ()
