"""Fair order: weighted fair share per GPU type with decayed usage, then priority with aging, then age, then id."""

from __future__ import annotations

import math

from scheduler.core import Quota, SchedulerConfig, TenantView, run_cycle
from scheduler.core.order import dominant_share, victim_cost_key, within_tenant_key
from scheduler.core.quota import QuotaBook
from tests.scheduler.test_core_builders import H, job, leaf_nodes, placed, running, snap, tenant


def test_the_tenant_with_the_lower_dominant_share_goes_first() -> None:
    busy = running("a-run", {"l1-n0": (0, 1, 2, 3)}, tenant="a")
    # Same priority, and a's job is older; b uses nothing, so b is first.
    pending = [job("a1", 4, tenant="a", queued_at=0), job("b1", 4, tenant="b", queued_at=5)]
    decisions = run_cycle(snap(leaf_nodes("l1", 1), pending, running_jobs=[busy]), 10.0)
    assert list(placed(decisions)) == ["b1"]


def test_a_tenant_with_twice_the_weight_may_use_twice_as_much_before_yielding() -> None:
    tenants = [
        TenantView(name="a", weight=2.0, quotas=(("H100", Quota(nominal=64)),)),
        TenantView(name="b", weight=1.0, quotas=(("H100", Quota(nominal=64)),)),
    ]
    used = [running("a-run", {"l1-n0": tuple(range(8))}, tenant="a"), running("b-run", {"l1-n1": (0, 1, 2, 3, 4)}, tenant="b")]
    pending = [job("b1", 3, tenant="b", queued_at=0), job("a1", 3, tenant="a", queued_at=5)]
    # Shares: a 8/24/2 = 0.167 < b 5/24 = 0.208, so a goes first although b's job is older.
    decisions = run_cycle(snap(leaf_nodes("l1", 3), pending, running_jobs=used, tenants=tenants), 10.0)
    assert [b.job_id for b in decisions.binds] == ["a1", "b1"]


def test_heavy_use_of_one_gpu_type_does_not_push_back_a_tenant_on_another() -> None:
    """Per-type fair share: a holds a whole L40S node, but on H100 both use nothing, so age decides (a's job is older).
    Under DRF's max over types, a's L40S share would put b first."""
    nodes = leaf_nodes("l1", 1) + leaf_nodes("l2", 1, gpu_type="L40S")
    busy = running("a-l40s", {"l2-n0": tuple(range(8))}, tenant="a", gpu_type="L40S")
    pending = [job("a1", 8, tenant="a", queued_at=0), job("b1", 8, tenant="b", queued_at=5)]
    decisions = run_cycle(snap(nodes, pending, running_jobs=[busy], config=SchedulerConfig(short_job_boost=0.0)), 10.0)
    assert list(placed(decisions)) == ["a1"]
    # On the type a uses, it yields: b goes first there.
    pending = [job("a2", 8, tenant="a", queued_at=0, gpu_type="L40S"), job("b2", 8, tenant="b", queued_at=5, gpu_type="L40S")]
    nodes = leaf_nodes("l1", 1) + leaf_nodes("l2", 2, gpu_type="L40S")
    decisions = run_cycle(snap(nodes, pending, running_jobs=[busy], config=SchedulerConfig(short_job_boost=0.0)), 10.0)
    assert list(placed(decisions)) == ["b2"]


def test_decayed_usage_counts_as_gpus_through_the_half_life() -> None:
    half_life = 3600.0
    tenants = (TenantView(name="past", decayed_usage=(("H100", 8 * half_life / math.log(2)),)), TenantView(name="now"))
    book = QuotaBook(tenants, (running("r", {"n": tuple(range(8))}, tenant="now"),))
    capacity = {"H100": 16}
    assert math.isclose(dominant_share(book, "past", capacity, half_life), 0.5)
    assert math.isclose(dominant_share(book, "now", capacity, half_life), 0.5)


def test_heavy_past_usage_puts_a_tenant_behind_a_fresh_one() -> None:
    tenants = [tenant("a", decayed=1e6, nominal=16), tenant("b", nominal=16)]
    pending = [job("a1", 8, tenant="a", queued_at=0), job("b1", 8, tenant="b", queued_at=50)]
    decisions = run_cycle(snap(leaf_nodes("l1", 1), pending, tenants=tenants, config=SchedulerConfig(usage_half_life_s=H)), 100.0)
    assert list(placed(decisions)) == ["b1"]


def test_drf_alternates_between_equal_tenants_within_one_cycle() -> None:
    pending = [job(f"{t}{i}", 8, tenant=t, queued_at=i) for t in "ab" for i in range(3)]
    decisions = run_cycle(snap(leaf_nodes("l1", 4), pending), 10.0)
    assert [b.job_id for b in decisions.binds] == ["a0", "b0", "a1", "b1"]


def test_within_a_tenant_higher_priority_goes_before_older() -> None:
    pending = [job("old", 8, queued_at=0), job("urgent", 8, priority=300, queued_at=5)]
    decisions = run_cycle(snap(leaf_nodes("l1", 1), pending), 10.0)
    assert list(placed(decisions)) == ["urgent"]


def test_aging_lets_a_long_waiting_low_priority_job_pass_a_fresh_normal_one() -> None:
    config = SchedulerConfig(aging_per_hour=10.0)
    pending = [job("fresh", 8, priority=100, queued_at=11 * H), job("low", 8, priority=0, queued_at=0)]
    # low: 0 + 10 * 11 h = 110 > 100.
    decisions = run_cycle(snap(leaf_nodes("l1", 1), pending, config=config), 11 * H)
    assert list(placed(decisions)) == ["low"]


def test_aging_counts_from_first_submission_across_attempts() -> None:
    config = SchedulerConfig(aging_per_hour=10.0)
    retried = job("retried", 8, priority=0, queued_at=10 * H, submitted_at=0.0, attempt=2)
    decisions = run_cycle(snap(leaf_nodes("l1", 1), [job("fresh", 8, queued_at=10 * H), retried], config=config), 11 * H)
    assert list(placed(decisions)) == ["retried"]


def test_equal_jobs_are_ordered_by_id() -> None:
    key = within_tenant_key
    config = SchedulerConfig()
    assert key(job("a", 1), 0.0, config) < key(job("b", 1), 0.0, config)
    decisions = run_cycle(snap(leaf_nodes("l1", 1), [job("z", 8), job("m", 8)]), 0.0)
    assert list(placed(decisions)) == ["m"]


def test_victim_cost_orders_by_work_lost_then_priority_then_recency() -> None:
    now = 10 * H
    fresh_ckpt = running("fresh-ckpt", {"n": (0,)}, started_at=0, checkpoint=now - 60)
    no_ckpt = running("no-ckpt", {"n": (1,)}, started_at=now - 0.5 * H)
    # Equal loss (1 GPU-hour since the checkpoint) and priority: the one started later goes first.
    older = running("older", {"n": (2,)}, started_at=0, checkpoint=now - H)
    later = running("later", {"n": (3,)}, started_at=100, checkpoint=now - H)
    high = running("high", {"n": (4,)}, started_at=200, checkpoint=now - H, priority=200)
    ranked = sorted([high, older, no_ckpt, later, fresh_ckpt], key=lambda r: victim_cost_key(r, now))
    assert [r.id for r in ranked] == ["fresh-ckpt", "no-ckpt", "later", "older", "high"]
