"""Anti-starvation: EASY reservations with backfill, standing reservations, aging, max wait."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core import Pending, Reservation, SchedulerConfig, run_cycle
from tests.scheduler.test_core_builders import H, Sim, job, leaf_nodes, placed, running, snap, tenant

MIN = 60.0
#: These tests are about reservations and backfill, with the queue in age order: no short-job boost.
#: Age order within a tenant, and no fast lane: these tests are about backfill mechanics on two or three nodes,
#: where the lane's bound (a quarter of the GPUs) would decide which job goes first.
AGE_ORDER = SchedulerConfig(short_job_boost=0.0, fast_lane_gpu_h=0.0)


def _two_nodes_busy(n1_busy: tuple[int, ...] = (0, 1, 2, 3, 4, 5)) -> tuple[list, list]:
    nodes = leaf_nodes("l1", 2)
    jobs = [running("r0", {"l1-n0": tuple(range(8))}, end=2 * H), running("r1", {"l1-n1": n1_busy}, end=H)]
    return nodes, jobs


def test_a_head_that_cannot_fit_reserves_the_node_that_frees_earliest() -> None:
    nodes, busy = _two_nodes_busy()
    decisions = run_cycle(snap(nodes, [job("big", 8)], running_jobs=busy), 0.0)
    assert decisions.reservations == (Reservation(job_id="big", node_ids=("l1-n1",), start_at=H),)
    assert decisions.pending_codes["big"] == Pending.NO_FREE_NODE
    assert decisions.pending_reasons["big"] == "no H100 node has 8 free GPUs; holds a reservation on l1-n1 from 01:00 UTC, in 1 h"


def test_a_job_that_ends_before_the_shadow_time_backfills_onto_reserved_gpus() -> None:
    nodes, busy = _two_nodes_busy()
    pending = [job("big", 8, queued_at=0), job("short", 2, queued_at=1, runtime=0.5 * H)]
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy), 10.0)
    assert placed(decisions) == {"short": [("l1-n1", (6, 7))]}


def test_a_job_that_would_delay_the_reservation_waits_behind_it() -> None:
    nodes, busy = _two_nodes_busy()
    pending = [job("big", 8, queued_at=0), job("long", 2, queued_at=1, runtime=4 * H)]
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy, config=AGE_ORDER), 10.0)
    assert decisions.binds == ()
    assert decisions.pending_codes["long"] == Pending.RESERVED and decisions.pending_reasons["long"] == "reserved behind job big"


def test_a_long_job_may_use_gpus_the_reservation_does_not_need() -> None:
    nodes, busy = _two_nodes_busy(n1_busy=(0, 1, 2, 3))
    pending = [job("six", 6, queued_at=0), job("long", 2, queued_at=1, runtime=4 * H), job("long2", 1, queued_at=2, runtime=4 * H)]
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy, config=AGE_ORDER), 10.0)
    # At t=1h l1-n1 has 8 free, "six" needs 6: 2 spare GPUs for jobs that run past the shadow time.
    assert placed(decisions) == {"long": [("l1-n1", (4, 5))]}
    assert decisions.pending_codes["long2"] == Pending.RESERVED and decisions.pending_reasons["long2"] == "reserved behind job six"


def test_a_long_job_may_use_nodes_outside_the_reservation() -> None:
    nodes, busy = _two_nodes_busy()
    nodes = [*nodes, *leaf_nodes("l2", 1)]
    busy.append(running("r2", {"l2-n0": (0, 1, 2, 3, 4, 5, 6)}, end=3 * H))
    pending = [job("big", 8, queued_at=0), job("long", 1, queued_at=1, runtime=4 * H)]
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy), 10.0)
    assert placed(decisions) == {"long": [("l2-n0", (7,))]}


def test_without_backfill_nothing_passes_a_blocked_head() -> None:
    nodes, busy = _two_nodes_busy()
    pending = [job("big", 8, queued_at=0), job("short", 2, queued_at=1, runtime=0.5 * H)]
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy, config=replace(AGE_ORDER, backfill=False)), 10.0)
    assert decisions.binds == ()
    assert decisions.pending_codes["short"] == Pending.BACKFILL_OFF
    assert decisions.pending_reasons["short"] == "reserved behind job big (backfill is off)"


def test_a_standing_reservation_goes_before_fair_share_next_cycle() -> None:
    tenants = [tenant("heavy", decayed=1e7, nominal=16), tenant("fresh", nominal=16)]
    pending = [job("gang", 8, tenant="heavy", queued_at=0), job("fresh1", 8, tenant="fresh", queued_at=5)]
    without = run_cycle(snap(leaf_nodes("l1", 1), pending, tenants=tenants), 10.0)
    assert list(placed(without)) == ["fresh1"]
    standing = (Reservation(job_id="gang", node_ids=("l1-n0",), start_at=10.0),)
    decisions = run_cycle(snap(leaf_nodes("l1", 1), pending, tenants=tenants, reservations=standing), 10.0)
    assert list(placed(decisions)) == ["gang"]


def _held_by_other() -> tuple[list, list]:
    """Two nodes of one leaf, held by a third tenant until 7 h and 6 h."""
    busy = [
        running("r0", {"l1-n0": tuple(range(8))}, tenant="other", started_at=4 * H, end=7 * H),
        running("r1", {"l1-n1": tuple(range(8))}, tenant="other", started_at=4 * H, end=6 * H),
    ]
    return leaf_nodes("l1", 2), busy


def test_the_reservation_carried_to_the_next_cycle_goes_to_the_tenant_furthest_below_its_share() -> None:
    tenants = [tenant("heavy", decayed=1e7, nominal=64), tenant("fresh", nominal=64), tenant("other", nominal=64)]
    nodes, busy = _held_by_other()
    # heavy's short job is in the fast lane (first in queue order) and has waited 5 h; fresh's gang, 1 min.
    pending = [
        job("short", 4, tenant="heavy", queued_at=0, runtime=0.5 * H),
        job("gang", 16, tenant="fresh", level="leaf", queued_at=5 * H - MIN, runtime=10 * H),
    ]
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy, tenants=tenants), 5 * H)
    # short held the reservation during the cycle; fresh is below its share (heavy far above), so its gang keeps it.
    assert decisions.reservations == (Reservation(job_id="gang", node_ids=("l1-n0", "l1-n1"), start_at=7 * H),)
    assert (decisions.pending_codes["gang"], decisions.pending_codes["short"]) == (Pending.NO_FREE_DOMAIN, Pending.NO_FREE_NODE)
    assert decisions.pending_reasons["gang"] == (
        "no topology domain fits: not enough wholly free H100 nodes in one leaf for 16 GPUs; "
        "holds a reservation on l1-n0, l1-n1 from 07:00 UTC, in 2 h"
    )
    assert decisions.pending_reasons["short"] == "no H100 node has 4 free GPUs"


def test_a_job_waiting_past_the_age_threshold_takes_the_reservation_from_a_tenant_further_below_its_share() -> None:
    """A burst's backlog drains oldest first once its jobs have waited a day, whoever's they are."""
    tenants = [tenant("heavy", decayed=1e7, nominal=64), tenant("fresh", nominal=64), tenant("other", nominal=64)]
    nodes, busy = _held_by_other()

    def head(heavy_waited: float, config: SchedulerConfig = SchedulerConfig()) -> list[str]:
        now = 30 * H
        pending = [
            job("old", 4, tenant="heavy", queued_at=now - heavy_waited, runtime=0.5 * H),
            job("gang", 16, tenant="fresh", level="leaf", queued_at=now - 2 * H, runtime=10 * H),
        ]
        decisions = run_cycle(snap(nodes, pending, running_jobs=busy, tenants=tenants, config=config), now)
        return [r.job_id for r in decisions.reservations]

    assert SchedulerConfig().reservation_by_age_after_s == 24 * H
    assert head(24 * H) == ["old"]  # past the threshold: the longest waiter, though its tenant is far above its share
    assert head(24 * H - MIN) == ["gang"]  # below it: fair share, as before
    assert head(29 * H, SchedulerConfig(reservation_by_age_after_s=0.0)) == ["gang"]  # 0: never by age
    # Two jobs past the threshold: the older one, whatever the shares.
    now = 30 * H
    pending = [
        job("old", 4, tenant="heavy", queued_at=now - 25 * H, runtime=0.5 * H),
        job("older", 16, tenant="fresh", level="leaf", queued_at=now - 26 * H, runtime=10 * H),
        job("oldest", 4, tenant="heavy", queued_at=now - 27 * H, runtime=0.5 * H),
    ]
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy, tenants=tenants), now)
    assert [r.job_id for r in decisions.reservations] == ["oldest"]


def test_within_a_tenant_the_reservation_carried_to_the_next_cycle_goes_to_its_longest_waiter() -> None:
    tenants = [tenant("t", nominal=64), tenant("other", nominal=64)]
    nodes, busy = _held_by_other()
    # The short job (fast lane, first in queue order) has waited 1 min; the gang, 5 h.
    pending = [
        job("short", 4, tenant="t", queued_at=5 * H - MIN, runtime=0.5 * H),
        job("gang", 16, tenant="t", level="leaf", queued_at=0, runtime=10 * H),
    ]
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy, tenants=tenants), 5 * H)
    assert [r.job_id for r in decisions.reservations] == ["gang"]


def test_a_standing_holder_still_blocked_keeps_the_reservation_against_a_tenant_further_below_its_share() -> None:
    tenants = [tenant("heavy", decayed=1e7, nominal=64), tenant("fresh", nominal=64), tenant("other", nominal=64)]
    nodes, busy = _held_by_other()
    pending = [
        job("short", 4, tenant="heavy", queued_at=0, runtime=0.5 * H),
        job("gang", 16, tenant="fresh", level="leaf", queued_at=5 * H - MIN, runtime=10 * H),
    ]
    standing = (Reservation(job_id="short", node_ids=("l1-n1",), start_at=6 * H),)
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy, tenants=tenants, reservations=standing), 5 * H)
    assert [r.job_id for r in decisions.reservations] == ["short"]


def test_a_borrowing_standing_holder_keeps_its_drained_node_from_an_owner_that_would_run_past_it() -> None:
    # "small" has no H100 quota of its own: its gang borrows owner's unused guarantee. l1-n1 is draining for it
    # (6 GPUs free, the last 2 at 30 min); owner's 6-GPU job, within its guarantee, would run 4 h on them.
    tenants = [tenant("owner", cohort="c", nominal=32), tenant("small", cohort="c", nominal=0)]
    busy = [
        running("r0", {"l1-n0": tuple(range(8))}, tenant="owner", end=3 * H),
        running("r1", {"l1-n1": (6, 7)}, tenant="owner", end=0.5 * H),
        running("r2", {"l1-n2": tuple(range(8))}, tenant="owner", end=3 * H),
    ]
    pending = [job("gang", 8, tenant="small", queued_at=0), job("own", 6, tenant="owner", queued_at=60.0, runtime=4 * H)]
    nodes = leaf_nodes("l1", 3)
    # Without a reservation, the owner's job goes first (borrowers wait for the second pass) and takes l1-n1.
    fresh = run_cycle(snap(nodes, pending, running_jobs=busy, tenants=tenants), 120.0)
    assert placed(fresh) == {"own": [("l1-n1", (0, 1, 2, 3, 4, 5))]}
    # The gang's standing reservation on l1-n1 is held before the owner's job is placed: it waits, the node drains.
    standing = (Reservation(job_id="gang", node_ids=("l1-n1",), start_at=0.5 * H),)
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy, tenants=tenants, reservations=standing), 120.0)
    assert decisions.binds == ()
    assert decisions.reservations == (Reservation(job_id="gang", node_ids=("l1-n1",), start_at=0.5 * H),)
    assert decisions.pending_codes["own"] == Pending.RESERVED and decisions.pending_reasons["own"] == "reserved behind job gang"


def test_past_max_wait_a_job_preempts_a_lower_priority_job_when_quotas_are_off() -> None:
    config = SchedulerConfig(max_wait_s=6 * H, aging_per_hour=10.0)
    busy = [running("r", {"l1-n0": tuple(range(8))}, tenant="x", started_at=0.0, end=60 * H)]
    early = run_cycle(snap(leaf_nodes("l1", 1), [job("w", 1, tenant="y", queued_at=0)], running_jobs=busy, config=config), 5 * H)
    assert early.preemptions == ()
    late = run_cycle(snap(leaf_nodes("l1", 1), [job("w", 1, tenant="y", queued_at=0)], running_jobs=busy, config=config), 7 * H)
    assert [(p.job_id, p.reason) for p in late.preemptions] == [("r", "max_wait")]


def test_a_stream_of_small_jobs_cannot_starve_a_64_gpu_gang() -> None:
    sim = Sim(
        nodes=[*leaf_nodes("l1", 8), *leaf_nodes("l2", 8)], tenants=(tenant("big", decayed=1e8, nominal=128), tenant("small", nominal=128))
    )
    serial = 0
    gang_submitted = None
    small_started_while_waiting = 0
    for step in range(int(8 * H / MIN)):
        sim.now = step * MIN
        if step % 5 == 0:
            for _ in range(6):
                serial += 1
                sim.submit(job(f"s{serial:05d}", 2, tenant="small", runtime=H), actual=40 * MIN + (serial % 20) * MIN)
        if sim.now == 30 * MIN:
            # The fleet is saturated by the stream: no leaf has 8 whole free nodes.
            assert sum(len(r.members) for r in sim.running.values()) > 16
            sim.submit(job("gang", 64, tenant="big", level="leaf", runtime=2 * H))
            gang_submitted = sim.now
        sim.step()
        if gang_submitted is not None and "gang" not in sim.started:
            small_started_while_waiting += sum(1 for b in (sim.last.binds if sim.last else ()) if b.job_id != "gang")
    wait = sim.wait_of("gang")
    assert wait is not None, "the gang never started"
    # Head after a few minutes, then the shadow time is at most the small jobs' 1 h max runtime away.
    assert wait <= H + 10 * MIN
    assert small_started_while_waiting >= 20, "the stream kept running (backfill) while the gang waited"


def _waits(sim: Sim, sweeps: list[str]) -> list[float]:
    """Each sweep job's wait: until it started, or until now for one still waiting."""
    return [sim.wait_of(s) or (sim.now - sim.submitted[s]) for s in sweeps]


def _flood(sim: Sim, hours: float) -> list[str]:
    for i in range(20):
        sim.submit(job(f"flood{i:02d}", 8, tenant="flood", runtime=48 * H))
    sweeps = []
    for step in range(int(hours * H / (5 * MIN))):
        sim.now = step * 5 * MIN
        if step % 6 == 2:
            sweeps.append(f"sweep{step:04d}")
            sim.submit(job(sweeps[-1], 1, tenant="sweep", runtime=15 * MIN))
        sim.step()
    return sweeps


def test_a_flood_of_48_hour_jobs_cannot_starve_one_gpu_jobs_of_a_tenant_within_its_guarantee() -> None:
    tenants = (tenant("flood", cohort="c", nominal=16), tenant("sweep", cohort="c", nominal=16))
    sim = Sim(nodes=leaf_nodes("l1", 4), tenants=tenants)
    sweeps = _flood(sim, hours=6)
    assert all(w <= 15 * MIN for w in _waits(sim, sweeps)), _waits(sim, sweeps)
    assert sum(s in sim.started for s in sweeps) >= len(sweeps) - 1
    assert any(p.startswith("flood") for p in sim.preempted), "borrowed GPUs were reclaimed"


def test_a_flood_of_48_hour_jobs_cannot_starve_one_gpu_jobs_past_the_max_wait_without_quotas() -> None:
    sim = Sim(nodes=leaf_nodes("l1", 4), config=SchedulerConfig(max_wait_s=3 * H))
    sweeps = _flood(sim, hours=12)
    waits = _waits(sim, sweeps)
    assert all(w <= 3 * H + 10 * MIN for w in waits), waits
    assert sum(s in sim.started for s in sweeps) >= 12
    assert max(waits) >= 2 * H, "the bound came from max_wait, not from free capacity"
    assert len(sim.preempted) <= 4, "time slicing: no ping-pong of preemptions"


def test_a_job_expected_to_end_before_the_shadow_time_backfills_though_its_limit_would_not() -> None:
    # Learned run times plan backfill: "learned" may run 4 h (its limit) but is expected to run 30 min.
    nodes, busy = _two_nodes_busy()
    learned = replace(job("learned", 2, queued_at=1, runtime=4 * H), expected_runtime_s=0.5 * H)
    pending = [job("big", 8, queued_at=0), learned]
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy, config=AGE_ORDER), 10.0)
    assert placed(decisions) == {"learned": [("l1-n1", (6, 7))]}
    # Without the learned time it would delay the reservation, so it waits.
    unknown = job("learned", 2, queued_at=1, runtime=4 * H)
    decisions = run_cycle(snap(nodes, [pending[0], unknown], running_jobs=busy, config=AGE_ORDER), 10.0)
    assert decisions.binds == ()


def test_a_reservation_slips_and_is_planned_again_when_a_backfilled_job_outlives_its_prediction() -> None:
    # "learned" was backfilled onto l1-n1 expecting to end at 0.5 h; at 0.75 h it still runs, and its expected end
    # (corrected by the predictor) is now 3 h: "big"'s reservation moves to the later of l1-n1's ends, not before.
    nodes = leaf_nodes("l1", 2)
    busy = [
        running("r0", {"l1-n0": tuple(range(8))}, end=5 * H),
        running("r1", {"l1-n1": (0, 1, 2, 3, 4, 5)}, end=H),
        running("learned", {"l1-n1": (6, 7)}, started_at=10.0, end=3 * H),
    ]
    standing = (Reservation(job_id="big", node_ids=("l1-n1",), start_at=H),)
    decisions = run_cycle(snap(nodes, [job("big", 8)], running_jobs=busy, reservations=standing, config=AGE_ORDER), 0.75 * H)
    assert decisions.reservations == (Reservation(job_id="big", node_ids=("l1-n1",), start_at=3 * H),)


def test_short_jobs_go_first_within_a_tenant_and_priority_class_but_not_across_classes() -> None:
    """The short-job boost alone (no fast lane): shortest first within a class, never across classes."""
    from scheduler.core.cycle import queue_order

    nodes = leaf_nodes("l1", 1)
    old_long = job("old-long", 8, queued_at=0, runtime=8 * H)  # 64 GPU-hours: no boost
    new_short = job("new-short", 1, queued_at=3600, runtime=0.5 * H)  # half a GPU-hour: the full boost
    low_short = job("low-short", 1, queued_at=0, runtime=0.5 * H, priority=0)
    now = 2 * H
    no_lane = SchedulerConfig(fast_lane_gpu_h=0.0)
    assert queue_order(snap(nodes, [old_long, new_short, low_short], config=no_lane), now) == ["new-short", "old-long", "low-short"]
    off = SchedulerConfig(short_job_boost=0.0, fast_lane_gpu_h=0.0)
    assert queue_order(snap(nodes, [old_long, new_short, low_short], config=off), now) == ["old-long", "new-short", "low-short"]
    # Bounded: the boost is worth 9 h of aging, so a short job submitted more than 9 h later queues behind.
    later_short = job("later-short", 1, queued_at=9.5 * H, runtime=0.5 * H)
    assert queue_order(snap(nodes, [old_long, later_short], config=no_lane), 11 * H) == ["old-long", "later-short"]


def test_the_fast_lane_goes_before_longer_jobs_of_every_class_and_tenant() -> None:
    """Jobs expected to use at most ``fast_lane_gpu_h`` GPU-hours come first (in fair order among themselves),
    whatever the class, age or tenant share of the longer jobs; a learned run time counts, not the limit."""
    from scheduler.core.cycle import queue_order

    nodes = leaf_nodes("l1", 8)  # 64 GPUs: the lane may hold 16
    old_long = job("old-long", 8, queued_at=0, runtime=8 * H)  # 64 GPU-hours
    high_long = job("high-long", 2, queued_at=0, runtime=8 * H, priority=200)  # 16 GPU-hours
    low_short = job("low-short", 1, queued_at=H, runtime=0.5 * H, priority=0)  # half a GPU-hour
    # Limit 24 h (192 GPU-hours), but learned: 30 min on 8 GPUs (4 GPU-hours): in the lane.
    learned = replace(job("learned", 8, queued_at=H, runtime=24 * H), expected_runtime_s=0.5 * H)
    got = queue_order(snap(nodes, [old_long, high_long, low_short, learned]), 2 * H)
    assert got[:2] == ["learned", "low-short"] and got[2:] == ["high-long", "old-long"]
    # A tenant that holds a lot of the type still gets its short job in ahead of another tenant's long one.
    heavy = running("heavy-run", {"l1-n0": tuple(range(8))}, tenant="b")
    mine = [job("a-long", 4, tenant="a", queued_at=0, runtime=4 * H), job("b-short", 4, tenant="b", queued_at=H, runtime=H)]
    assert queue_order(snap(leaf_nodes("l1", 2), mine, running_jobs=[heavy]), 2 * H) == ["b-short", "a-long"]
    # Off: fair share decides (a uses nothing).
    off = SchedulerConfig(fast_lane_gpu_h=0.0)
    assert queue_order(snap(leaf_nodes("l1", 2), mine, running_jobs=[heavy], config=off), 2 * H) == ["a-long", "b-short"]


def test_the_fast_lane_is_fair_among_tenants_and_the_rest_starts_from_the_shares_it_left() -> None:
    from scheduler.core.cycle import queue_order

    nodes = leaf_nodes("l1", 8)
    # One tenant floods the lane with short jobs; another's short jobs still alternate with them.
    flood = [job(f"f{i}", 1, tenant="flood", queued_at=0, runtime=0.5 * H) for i in range(6)]
    other = [job(f"o{i}", 1, tenant="other", queued_at=H, runtime=0.5 * H) for i in range(2)]
    assert queue_order(snap(nodes, flood + other), 2 * H)[:4] in (["f0", "o0", "f1", "o1"], ["o0", "f0", "o1", "f1"])
    # a uses less than b before the cycle, but its lane job (4 GPU-hours on 8 GPUs) makes it the heavier one:
    # after the lane, b's long job goes before a's.
    held = running("b-run", {"l1-n0": (0, 1, 2, 3)}, tenant="b")
    pending = [
        job("a-short", 8, tenant="a", queued_at=0, runtime=0.5 * H),
        job("a-long", 8, tenant="a", queued_at=0, runtime=4 * H),
        job("b-long", 8, tenant="b", queued_at=0, runtime=4 * H),
    ]
    assert queue_order(snap(nodes, pending, running_jobs=[held]), 2 * H) == ["a-short", "b-long", "a-long"]


def test_the_fast_lane_holds_at_most_its_share_of_a_gpu_type_and_the_rest_of_its_jobs_queue_fairly() -> None:
    """A quarter of the type: running lane jobs count, and so do lane jobs listed before in the cycle."""
    from scheduler.core.cycle import queue_order

    nodes = leaf_nodes("l1", 4)  # 32 GPUs: the lane may hold 8
    # b runs 4 GPUs of short jobs (lane jobs: 4 GPUs x 1 h), a runs one long 6-GPU job.
    busy = [
        running("b-run", {"l1-n0": (0, 1, 2, 3)}, tenant="b", end=H),
        running("a-run", {"l1-n1": tuple(range(6))}, tenant="a", end=9 * H),
    ]
    pending = [
        job("b-short1", 2, tenant="b", queued_at=0, runtime=H),
        job("b-short2", 2, tenant="b", queued_at=1, runtime=H),  # 4 + 2 + 2 = 8: still in the lane
        job("b-short3", 2, tenant="b", queued_at=2, runtime=H),  # past the bound: queues with the rest
        job("a-long", 8, tenant="a", queued_at=3, runtime=4 * H),
    ]
    # In the rest, b (4 GPUs held, 8 with those listed) is now heavier than a (6): a's long job goes before b's third.
    got = queue_order(snap(nodes, pending, running_jobs=busy), 2 * H)
    assert got == ["b-short1", "b-short2", "a-long", "b-short3"]
    # With a bound of one half (16 GPUs), all three are in the lane.
    half = SchedulerConfig(fast_lane_max_share=0.5)
    assert queue_order(snap(nodes, pending, running_jobs=busy, config=half), 2 * H) == ["b-short1", "b-short2", "b-short3", "a-long"]


def test_a_standing_holder_keeps_its_nodes_though_another_is_now_expected_to_free_first() -> None:
    # big reserved l1-n0 when r0 was expected to end first; r0 ran late (learned run times), and r1 on l1-n1 is now
    # expected to end sooner. Moving would give up l1-n0, drained of new work, for a node that may run late too.
    busy = [
        running("r0", {"l1-n0": tuple(range(8))}, started_at=0.0, end=2 * H + 10 * MIN),
        running("r1", {"l1-n1": tuple(range(8))}, started_at=0.0, end=2 * H + 5 * MIN),
    ]
    standing = (Reservation(job_id="big", node_ids=("l1-n0",), start_at=H),)
    decisions = run_cycle(snap(leaf_nodes("l1", 2), [job("big", 8)], running_jobs=busy, reservations=standing), 2 * H)
    assert decisions.reservations == (Reservation(job_id="big", node_ids=("l1-n0",), start_at=2 * H + 10 * MIN),)
    # Without a standing reservation (or with one on a node that is gone), the node expected to free first.
    for fed_back in [(), (Reservation(job_id="big", node_ids=("l1-n7",), start_at=H),)]:
        fresh = run_cycle(snap(leaf_nodes("l1", 2), [job("big", 8)], running_jobs=busy, reservations=fed_back), 2 * H)
        assert fresh.reservations == (Reservation(job_id="big", node_ids=("l1-n1",), start_at=2 * H + 5 * MIN),)


def test_a_standing_holder_moves_when_its_nodes_run_hours_late_and_another_frees_much_sooner() -> None:
    # r0 on big's node keeps outliving its learned end: it is now expected to run 10 h more; r1 ends in 30 min.
    busy = [
        running("r0", {"l1-n0": tuple(range(8))}, started_at=0.0, end=12 * H),
        running("r1", {"l1-n1": tuple(range(8))}, started_at=0.0, end=2 * H + 30 * MIN),
    ]
    standing = (Reservation(job_id="big", node_ids=("l1-n0",), start_at=H),)
    decisions = run_cycle(snap(leaf_nodes("l1", 2), [job("big", 8)], running_jobs=busy, reservations=standing), 2 * H)
    assert decisions.reservations == (Reservation(job_id="big", node_ids=("l1-n1",), start_at=2 * H + 30 * MIN),)
    # Sooner, but not by an hour plus half the wait (3 h on its node against 1 h elsewhere): it stays.
    busy[0] = replace(busy[0], expected_end=5 * H)
    busy[1] = replace(busy[1], expected_end=3 * H)
    kept = run_cycle(snap(leaf_nodes("l1", 2), [job("big", 8)], running_jobs=busy, reservations=standing), 2 * H)
    assert kept.reservations == (Reservation(job_id="big", node_ids=("l1-n0",), start_at=5 * H),)


def test_a_standing_gang_reservation_keeps_its_nodes() -> None:
    nodes = leaf_nodes("l1", 3)
    busy = [
        running("r0", {"l1-n0": tuple(range(8))}, started_at=0.0, end=2 * H + 30 * MIN),
        running("r1", {"l1-n1": tuple(range(8))}, started_at=0.0, end=2 * H + 20 * MIN),
        running("r2", {"l1-n2": tuple(range(8))}, started_at=0.0, end=2 * H + 5 * MIN),
    ]
    standing = (Reservation(job_id="gang", node_ids=("l1-n0", "l1-n1"), start_at=H),)
    pending = [job("gang", 16, level="leaf")]
    decisions = run_cycle(snap(nodes, pending, running_jobs=busy, reservations=standing), 2 * H)
    assert decisions.reservations == (Reservation(job_id="gang", node_ids=("l1-n0", "l1-n1"), start_at=2 * H + 30 * MIN),)
    fresh = run_cycle(snap(nodes, pending, running_jobs=busy), 2 * H)
    assert fresh.reservations == (Reservation(job_id="gang", node_ids=("l1-n1", "l1-n2"), start_at=2 * H + 20 * MIN),)
