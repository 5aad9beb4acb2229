"""Preemption planning and nomination, and the pending reasons (point 7)."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core import Pending, Reservation, SchedulerConfig, run_cycle
from tests.scheduler.test_core_builders import H, job, leaf_nodes, node, placed, running, snap, tenant

COHORT = [tenant("a", cohort="c", nominal=8), tenant("b", cohort="c", nominal=8)]
NOW = 10 * H


def _borrowed(**kw: object) -> list:
    """Tenant a borrows l1-n1 (nominal 8 on l1-n0)."""
    return [
        running("a-own", {"l1-n0": tuple(range(8))}, tenant="a", started_at=0.0, checkpoint=NOW - 60),
        running("a-borrow", {"l1-n1": tuple(range(8))}, tenant="a", **kw),  # type: ignore[arg-type]
    ]


def test_reclaim_takes_the_victim_that_loses_the_least_work_since_its_checkpoint() -> None:
    jobs = _borrowed(started_at=NOW - 3 * H, checkpoint=NOW - 2 * H)
    # a-own: 8 GPUs * 1 min lost is cheaper than a-borrow's 8 * 2 h, so it is the victim (a still has a-borrow).
    decisions = run_cycle(snap(leaf_nodes("l1", 2), [job("b0", 8, tenant="b")], running_jobs=jobs, tenants=COHORT), NOW)
    assert [(p.job_id, p.for_job, p.reason) for p in decisions.preemptions] == [("a-own", "b0", "reclaim")]


def test_non_preemptible_jobs_are_never_victims() -> None:
    jobs = [
        running("a-1", {"l1-n0": tuple(range(8))}, tenant="a", preemptible=False),
        running("a-2", {"l1-n1": tuple(range(8))}, tenant="a", preemptible=False),
    ]
    decisions = run_cycle(snap(leaf_nodes("l1", 2), [job("b0", 8, tenant="b")], running_jobs=jobs, tenants=COHORT), NOW)
    assert decisions.preemptions == () and decisions.pending_codes["b0"] == Pending.NO_FREE_NODE


def test_a_job_inside_its_minimum_runtime_is_not_preempted() -> None:
    config = SchedulerConfig(min_runtime_before_preempt_s=600)
    jobs = [
        running("a-1", {"l1-n0": tuple(range(8))}, tenant="a", started_at=NOW - 599),
        running("a-2", {"l1-n1": tuple(range(8))}, tenant="a", started_at=NOW - 599),
    ]
    decisions = run_cycle(snap(leaf_nodes("l1", 2), [job("b0", 8, tenant="b")], running_jobs=jobs, tenants=COHORT, config=config), NOW)
    assert decisions.preemptions == ()
    later = run_cycle(snap(leaf_nodes("l1", 2), [job("b0", 8, tenant="b")], running_jobs=jobs, tenants=COHORT, config=config), NOW + 1)
    assert len(later.preemptions) == 1


def _victims(config: SchedulerConfig, attempt: int, ran_s: float) -> list[str]:
    """Who b0 (within its nominal) takes back from a, whose two borrowed jobs are on this attempt and ran ``ran_s``."""
    jobs = [
        replace(running(f"a-{i}", {f"l1-n{i}": tuple(range(8))}, tenant="a", started_at=NOW - ran_s), attempt=attempt) for i in range(2)
    ]
    snapshot = snap(leaf_nodes("l1", 2), [job("b0", 8, tenant="b")], running_jobs=jobs, tenants=COHORT, config=config)
    return [p.job_id for p in run_cycle(snapshot, NOW).preemptions]


def test_each_restart_doubles_the_time_a_job_runs_before_it_may_be_preempted_again_up_to_the_max_wait() -> None:
    config = SchedulerConfig(min_runtime_before_preempt_s=600, preempt_backoff=2.0, max_wait_s=6 * H)
    # First attempt: 10 min. Third attempt (two restarts): 40 min.
    assert len(_victims(config, 1, 600)) == 1
    assert _victims(config, 3, 40 * 60 - 1) == []
    assert len(_victims(config, 3, 40 * 60)) == 1
    # However often it restarted, at most the max wait (and no overflow for a huge attempt number).
    assert _victims(config, 5000, 6 * H - 1) == []
    assert len(_victims(config, 5000, 6 * H)) == 1
    # A backoff of 1 turns it off.
    assert len(_victims(replace(config, preempt_backoff=1.0), 3, 600)) == 1


def test_a_higher_priority_job_preempts_its_own_tenants_lower_priority_job() -> None:
    jobs = [
        running("low", {"n": tuple(range(8))}, priority=0, started_at=0.0),
        running("same", {"m": tuple(range(8))}, priority=200, started_at=0.0),
    ]
    decisions = run_cycle(snap([node("n"), node("m")], [job("urgent", 8, priority=200)], running_jobs=jobs), NOW)
    assert [(p.job_id, p.reason) for p in decisions.preemptions] == [("low", "priority")]


def test_priority_alone_never_preempts_another_tenant() -> None:
    # "theirs" would be the cheaper victim (it started 20 min ago, "mine" at 0), but it is another tenant's.
    jobs = [
        running("theirs", {"n": tuple(range(8))}, tenant="x", priority=0, started_at=NOW - 1200),
        running("mine", {"m": tuple(range(8))}, tenant="y", priority=0, started_at=0.0),
    ]
    urgent = job("urgent", 8, tenant="y", priority=300, queued_at=NOW - H)
    decisions = run_cycle(snap([node("n"), node("m")], [urgent], running_jobs=jobs), NOW)
    assert [(p.job_id, p.reason) for p in decisions.preemptions] == [("mine", "priority")]
    alone = run_cycle(snap([node("n")], [urgent], running_jobs=jobs[:1]), NOW)
    assert alone.preemptions == () and alone.pending_codes["urgent"] == Pending.NO_FREE_NODE


def test_only_as_many_victims_as_the_preemptor_needs() -> None:
    jobs = [running(f"v{i}", {"n": (2 * i, 2 * i + 1)}, priority=0, started_at=NOW - (i + 1) * H) for i in range(4)]
    decisions = run_cycle(snap([node("n")], [job("p", 4, priority=200)], running_jobs=jobs), NOW)
    # Cheapest first: v0 (2 GPU-hours), v1 (4): exactly two victims, on whose GPUs p is nominated.
    assert [p.job_id for p in decisions.preemptions] == ["v0", "v1"]
    [nomination] = decisions.reservations
    assert nomination.victims == ("v0", "v1") and nomination.members[0].gpu_indices == (0, 1, 2, 3)


def test_nominated_gpus_are_not_given_to_anyone_else_in_the_same_cycle() -> None:
    jobs = [running("low", {"n": (0, 1, 2, 3, 4, 5)}, priority=0, started_at=0.0)]
    pending = [job("p", 8, priority=200, queued_at=0), job("other", 2, queued_at=1)]
    decisions = run_cycle(snap([node("n")], pending, running_jobs=jobs), NOW)
    assert [p.job_id for p in decisions.preemptions] == ["low"]
    assert decisions.binds == ()
    assert decisions.pending_codes["other"] == Pending.NO_FREE_NODE


def test_a_nomination_holds_while_its_victims_stop_and_binds_when_they_have() -> None:
    jobs = [running("low", {"n": (0, 1, 2, 3, 4, 5)}, priority=0, started_at=0.0)]
    pending = [job("p", 8, priority=200, queued_at=0), job("other", 2, queued_at=1)]
    first = run_cycle(snap([node("n")], pending, running_jobs=jobs), NOW)
    # Next cycle the victim is still checkpointing: same preemption, same nomination, nobody takes GPUs 6 and 7.
    second = run_cycle(snap([node("n")], pending, running_jobs=jobs, reservations=first.reservations), NOW + 30)
    assert second.preemptions == first.preemptions and second.reservations == first.reservations
    assert second.binds == () and second.pending_codes["p"] == Pending.PREEMPTING
    assert second.pending_reasons["p"] == "waiting for preemption of low"
    # The victim has stopped: p binds onto exactly the nominated GPUs.
    third = run_cycle(snap([node("n")], pending, reservations=second.reservations), NOW + 60)
    assert placed(third) == {"p": [("n", tuple(range(8)))]}


def test_every_waiting_job_has_a_reason_naming_what_it_waits_for() -> None:
    tenants = [tenant("a", nominal=8), tenant("b", nominal=16)]
    nodes = [*leaf_nodes("l1", 2), node("x", leaf="l2")]
    jobs = [running("busy", {"x": tuple(range(8))}, tenant="a", end=NOW + H)]
    pending = [
        job("over", 8, tenant="a", queued_at=0),  # a uses its 8 already, though l1 has room
        job("wide", 24, tenant="b", level="leaf", queued_at=1),  # no leaf holds 24
        job("fits", 8, tenant="b", queued_at=2),
    ]
    decisions = run_cycle(snap(nodes, pending, running_jobs=jobs, tenants=tenants), NOW)
    reasons = decisions.pending_reasons
    assert set(reasons) == {"over", "wide"} and [b.job_id for b in decisions.binds] == ["fits"]
    assert decisions.pending_codes == {"over": Pending.OVER_QUOTA, "wide": Pending.DOMAIN_TOO_SMALL}
    assert (
        reasons["over"]
        == "over quota: tenant a uses 8 H100 GPUs and asks for 8 more; its guarantee is 8 and it has no cohort to borrow from"
    )
    assert reasons["wide"] == "node shape can never fit: the largest leaf has 16 H100 GPUs, the job needs 24"


def test_a_job_behind_a_reservation_names_the_holder_and_a_gang_without_a_domain_says_so() -> None:
    nodes = [*leaf_nodes("l1", 2), *leaf_nodes("l2", 2)]
    jobs = [running("r1", {"l1-n0": (0,)}, end=H), running("r2", {"l2-n0": (0,)}, end=2 * H)]
    pending = [job("gang", 16, level="leaf", queued_at=0), job("long", 8, queued_at=1, runtime=5 * H)]
    decisions = run_cycle(snap(nodes, pending, running_jobs=jobs), 0.0)
    assert decisions.pending_codes["gang"] == Pending.NO_FREE_DOMAIN
    assert decisions.pending_reasons["gang"] == (
        "no topology domain fits: not enough wholly free H100 nodes in one leaf for 16 GPUs; "
        "holds a reservation on l1-n0, l1-n1 from 01:00 UTC, in 1 h"
    )
    assert decisions.reservations == (Reservation(job_id="gang", node_ids=("l1-n0", "l1-n1"), start_at=H),)
    assert placed(decisions) == {"long": [("l2-n1", tuple(range(8)))]}
    more = run_cycle(snap(nodes, [*pending, job("long2", 8, queued_at=2, runtime=5 * H)], running_jobs=jobs), 0.0)
    assert more.pending_codes["long2"] == Pending.RESERVED and more.pending_reasons["long2"] == "reserved behind job gang"
