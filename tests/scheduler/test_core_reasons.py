"""Pending reasons: each code's text as shown, and the rank that says which reason a job gets when several apply."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core import Decisions, Pending, Reservation, SchedulerConfig, reason_text, run_cycle
from tests.scheduler.test_core_builders import H, job, leaf_nodes, node, running, snap, tenant

TEXTS: list[tuple[Pending, dict[str, Any], str]] = [
    (Pending.NO_GPU_TYPE, {"gpu_type": "B200"}, "node shape can never fit: no B200 node in the fleet"),
    (Pending.NO_GPUS, {}, "node shape can never fit: a job needs at least one GPU"),
    (
        Pending.UNKNOWN_LEVEL,
        {"level": "leaf", "levels": ("rack", "pod")},
        "node shape can never fit: unknown topology level 'leaf' (levels: node, rack, pod)",
    ),
    (
        Pending.NODE_TOO_SMALL,
        {"count": 6, "gpu_type": "L40S", "largest": 4},
        "node shape can never fit: 6 GPUs on one node, the largest L40S node has 4",
    ),
    (
        Pending.DOMAIN_TOO_SMALL,
        {"level": "leaf", "largest": 16, "gpu_type": "H100", "count": 24},
        "node shape can never fit: the largest leaf has 16 H100 GPUs, the job needs 24",
    ),
    (
        Pending.FLEET_TOO_SMALL,
        {"largest": 32, "gpu_type": "H100", "count": 64},
        "node shape can never fit: the fleet has 32 H100 GPUs in big nodes, it needs 64",
    ),
    (Pending.BACKFILL_OFF, {"holder": "big"}, "reserved behind job big (backfill is off)"),
    (Pending.PREEMPTING, {"victims": ("v0", "v1")}, "waiting for preemption of v0, v1"),
    (Pending.SHRINKING, {"donors": ("e1",)}, "waiting for elastic jobs to give back GPUs above their minimum: e1"),
    (Pending.NO_SCHEDULABLE_NODE, {"gpu_type": "H100"}, "no schedulable H100 node"),
    (Pending.NO_FREE_NODE, {"gpu_type": "H100", "count": 8}, "no H100 node has 8 free GPUs"),
    (
        Pending.NO_FREE_NODE,
        {"gpu_type": "H100", "count": 8, "holds": ("l1-n1",), "start_at": 3600.4, "now": 1800.0},
        "no H100 node has 8 free GPUs; holds a reservation on l1-n1 from 01:00 UTC, in 30 min",
    ),
    (
        Pending.NO_FREE_DOMAIN,
        {"gpu_type": "H100", "count": 16, "level": "leaf"},
        "no topology domain fits: not enough wholly free H100 nodes in one leaf for 16 GPUs",
    ),
    (
        Pending.NO_FREE_DOMAIN,
        {"gpu_type": "H100", "count": 40, "level": None, "holds": ("a", "b", "c", "d", "e", "f"), "start_at": 25200.0, "now": 0.0},
        "no topology domain fits: not enough wholly free H100 nodes for 40 GPUs; holds a reservation on a, b, c, d and 2 more "
        "from 07:00 UTC, in 7 h",
    ),
    (
        Pending.NO_FREE_NODE,
        {"gpu_type": "H100", "count": 8, "holds": ("n1",), "start_at": 1796263200.0, "now": 1796212500.0},
        "no H100 node has 8 free GPUs; holds a reservation on n1 from 2026-12-03 02:00 UTC, in 14 h 5 min",
    ),
    (
        Pending.OVER_QUOTA,
        {"tenant": "a", "used": 8, "count": 8, "gpu_type": "H100", "nominal": 8, "cohort": None, "borrow_limit": None},
        "over quota: tenant a uses 8 H100 GPUs and asks for 8 more; its guarantee is 8 and it has no cohort to borrow from",
    ),
    (
        Pending.OVER_QUOTA,
        {"tenant": "a", "used": 16, "count": 8, "gpu_type": "H100", "nominal": 8, "cohort": "c", "borrow_limit": 8},
        "over quota: tenant a uses 16 H100 GPUs and asks for 8 more; its guarantee of 8 plus its borrowing limit of 8 allow 16",
    ),
    (
        Pending.OVER_QUOTA,
        {"tenant": "a", "used": 8, "count": 4, "gpu_type": "H100", "nominal": 8, "cohort": "c", "borrow_limit": 8},
        "over quota: tenant a uses 8 H100 GPUs and asks for 4 more; beyond its guarantee of 8, cohort c has no idle H100 quota to lend",
    ),
    (
        Pending.OVER_QUOTA,
        {"tenant": "b", "used": 3, "count": 1, "gpu_type": "L40S", "nominal": 0, "cohort": "c", "borrow_limit": None},
        "over quota: tenant b uses 3 L40S GPUs and asks for 1 more; beyond its guarantee of 0, cohort c has no idle L40S quota to lend",
    ),
    (Pending.RESERVED, {"holder": "gang"}, "reserved behind job gang"),
]


@pytest.mark.parametrize(("code", "facts", "text"), TEXTS)
def test_each_code_reads_as_it_is_shown(code: Pending, facts: dict[str, Any], text: str) -> None:
    assert reason_text(code, **facts) == text


def test_every_code_has_a_text_and_codes_are_stable_strings() -> None:
    assert {code for code, _, _ in TEXTS} == set(Pending)
    assert [code.rank for code in Pending] == list(range(len(Pending)))
    assert Pending.OVER_QUOTA == "over_quota" and Pending("no_free_node") is Pending.NO_FREE_NODE


def _first(decisions: Decisions, job_id: str, *applicable: Pending) -> None:
    """``job_id`` waits for the best ranked of the reasons that apply to it."""
    code = decisions.pending_codes[job_id]
    assert code == min(applicable, key=lambda c: c.rank), (job_id, code, decisions.pending_reasons[job_id])


def test_no_room_is_said_before_over_quota() -> None:
    full = [running("a-1", {"n": tuple(range(8))}, tenant="a")]
    decisions = run_cycle(snap([node("n")], [job("j", 8)], running_jobs=full, tenants=[tenant("a", nominal=8)]), 0.0)
    _first(decisions, "j", Pending.NO_FREE_NODE, Pending.OVER_QUOTA)
    # With room, the quota alone holds it back.
    roomy = run_cycle(snap([node("n"), node("m")], [job("j", 8)], running_jobs=full, tenants=[tenant("a", nominal=8)]), 0.0)
    assert roomy.pending_codes["j"] == Pending.OVER_QUOTA


def _behind_a_reservation(config: SchedulerConfig) -> Decisions:
    """A standing reservation of job big holds l1-n1 from 1 h; job over (tenant a, no quota) and job behind
    (tenant c) would fit on l1-n1 but run past that."""
    nodes = leaf_nodes("l1", 2)
    busy = [
        running("r0", {"l1-n0": tuple(range(8))}, tenant="z", end=2 * H),
        running("r1", {"l1-n1": (0, 1, 2, 3, 4, 5)}, tenant="z", end=H),
    ]
    pending = [
        job("big", 8, tenant="b"),
        job("over", 2, tenant="a", queued_at=1, runtime=4 * H),
        job("behind", 2, tenant="c", runtime=4 * H),
    ]
    tenants = [tenant("a", nominal=0), tenant("b", nominal=16), tenant("c", nominal=16), tenant("z", nominal=16)]
    standing = (Reservation(job_id="big", node_ids=("l1-n1",), start_at=H),)
    return run_cycle(snap(nodes, pending, running_jobs=busy, tenants=tenants, reservations=standing, config=config), 10.0)


def test_over_quota_is_said_before_a_reservation_in_the_way() -> None:
    decisions = _behind_a_reservation(SchedulerConfig())
    assert decisions.binds == () and decisions.pending_codes["behind"] == Pending.RESERVED
    _first(decisions, "over", Pending.RESERVED, Pending.OVER_QUOTA)


def test_backfill_off_is_said_before_no_room_and_quota() -> None:
    decisions = _behind_a_reservation(SchedulerConfig(backfill=False))
    _first(decisions, "over", Pending.BACKFILL_OFF, Pending.RESERVED, Pending.OVER_QUOTA)
    _first(decisions, "behind", Pending.BACKFILL_OFF, Pending.RESERVED)


def test_a_shape_that_can_never_fit_is_said_before_anything_else() -> None:
    nodes = leaf_nodes("l1", 2)
    busy = [running("r0", {"l1-n0": tuple(range(8))}, end=2 * H), running("r1", {"l1-n1": tuple(range(8))}, end=H)]
    pending = [job("big", 8), job("odd", 16, level="rack", queued_at=1), job("none", 0, queued_at=2)]
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy, config=SchedulerConfig(backfill=False)), 0.0)
    _first(decisions, "odd", Pending.UNKNOWN_LEVEL, Pending.BACKFILL_OFF, Pending.NO_FREE_DOMAIN)
    _first(decisions, "none", Pending.NO_GPUS, Pending.BACKFILL_OFF)


def test_a_nominated_job_says_it_waits_for_preemption_rather_than_no_room() -> None:
    low = [running("low", {"n": tuple(range(8))}, priority=0, started_at=0.0)]
    decisions = run_cycle(snap([node("n")], [job("urgent", 8, priority=200)], running_jobs=low), 10 * H)
    _first(decisions, "urgent", Pending.PREEMPTING, Pending.NO_FREE_NODE)
    assert decisions.pending_reasons["urgent"] == "waiting for preemption of low"
