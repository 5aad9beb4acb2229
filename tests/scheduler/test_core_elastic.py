"""Elastic jobs in the pure core (SPEC R9.2): start at the minimum, grow onto idle GPUs, shrink before any preemption."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import Decisions, Member, NodeView, Pending, Resize, RunningJob, Scheduler, SchedulerConfig, Snapshot, run_cycle
from tests.scheduler.test_core_builders import H, job, leaf_nodes, node, running, snap, tenant

CONFIG = SchedulerConfig(elastic_grow_idle_s=300.0, elastic_resize_interval_s=600.0)


def idle(nodes: list[NodeView], since: float = -H) -> list[NodeView]:
    return [replace(n, free_since=since) for n in nodes]


def elastic_running(
    job_id: str, placement: dict[str, tuple[int, ...]], lo: int, hi: int, *, level: str = "any", **kw: object
) -> RunningJob:
    base = running(job_id, placement, **kw)  # type: ignore[arg-type]
    return replace(base, gpu_min=lo, gpu_max=hi, topology_level=level)


def gpus_of(members: tuple[Member, ...]) -> set[tuple[str, int]]:
    return {(m.node_id, g) for m in members for g in m.gpu_indices}


def apply_resize(job: RunningJob, resize: Resize, now: float) -> RunningJob:
    return replace(job, members=resize.members, gpu_count=resize.to_gpus, resized_at=now, started_at=now, last_checkpoint_at=now)


def test_an_elastic_job_starts_at_its_minimum_and_carries_its_range() -> None:
    nodes = leaf_nodes("l1", 4)
    decisions = run_cycle(snap(nodes, [replace(job("e", 16), gpu_max=32)], config=CONFIG), 0.0)
    (b,) = decisions.binds
    assert sum(len(m.gpu_indices) for m in b.members) == 16
    started = RunningJob.started(replace(job("e", 16), gpu_max=32), b.members, 0.0)
    assert (started.gpu_min, started.gpu_max, started.elastic, started.entitled_gpus) == (16, 32, True, 16)


def test_it_grows_onto_idle_whole_nodes_of_its_domain_only_after_the_idle_time() -> None:
    nodes = leaf_nodes("l1", 4) + leaf_nodes("l2", 4, spine="s1")
    e = elastic_running("e", {"l1-n0": tuple(range(8)), "l1-n1": tuple(range(8))}, 16, 32, level="leaf", started_at=-2 * H)
    recent = snap(idle(nodes, since=-100.0), running_jobs=[e], config=CONFIG)
    assert run_cycle(recent, 0.0).resizes == ()  # free for 100 s only
    decisions = run_cycle(snap(idle(nodes), running_jobs=[e], config=CONFIG), 0.0)
    (resize,) = decisions.resizes
    assert (resize.direction, resize.from_gpus, resize.to_gpus, resize.reason) == ("grow", 16, 32, "idle")
    assert {m.node_id for m in resize.members} == {"l1-n0", "l1-n1", "l1-n2", "l1-n3"}  # its leaf, not l2's
    assert [m.rank for m in resize.members] == [0, 1, 2, 3]
    assert gpus_of(e.members) <= gpus_of(resize.members)  # the kept GPUs stay


def test_it_does_not_grow_while_a_job_of_its_type_waits_for_capacity() -> None:
    nodes = leaf_nodes("l1", 4)
    e = elastic_running("e", {"l1-n0": tuple(range(8))}, 8, 32)
    big = job("big", 32)  # needs the whole leaf: it waits, the free nodes are its
    decisions = run_cycle(snap(idle(nodes), [big], running_jobs=[e], config=CONFIG), 0.0)
    assert decisions.resizes == ()


def test_growth_waits_out_the_interval_since_the_last_resize() -> None:
    nodes = leaf_nodes("l1", 4)
    e = replace(elastic_running("e", {"l1-n0": tuple(range(8))}, 8, 32), resized_at=-100.0)
    assert run_cycle(snap(idle(nodes), running_jobs=[e], config=CONFIG), 0.0).resizes == ()
    assert run_cycle(snap(idle(nodes), running_jobs=[replace(e, resized_at=-700.0)], config=CONFIG), 0.0).resizes != ()
    # Its start counts as its last size change: a job that has just started is not restarted to grow.
    fresh = replace(e, resized_at=None, started_at=-100.0)
    assert run_cycle(snap(idle(nodes), running_jobs=[fresh], config=CONFIG), 0.0).resizes == ()


def test_a_single_node_elastic_job_grows_by_gpus_on_its_node() -> None:
    nodes = [node("n0"), node("n1")]
    e = elastic_running("e", {"n0": (0, 1)}, 2, 6)
    (resize,) = run_cycle(snap(idle(nodes), running_jobs=[e], config=CONFIG), 0.0).resizes
    assert resize.members == (Member("n0", (0, 1, 2, 3, 4, 5), 0),)


def test_extra_gpus_are_taken_back_before_any_whole_job_is_preempted() -> None:
    nodes = leaf_nodes("l1", 4)
    fixed = running("victim", {"l1-n0": tuple(range(8))}, tenant="b", priority=10, checkpoint=-1.0)
    e = elastic_running(
        "e", {"l1-n1": tuple(range(8)), "l1-n2": tuple(range(8)), "l1-n3": tuple(range(8))}, 8, 24, tenant="b", checkpoint=-H
    )
    want = job("want", 8, tenant="a", priority=100)
    tenants = [tenant("a", cohort="c", nominal=16), tenant("b", cohort="c", nominal=16)]
    decisions = run_cycle(snap(nodes, [want], running_jobs=[fixed, e], tenants=tenants, config=CONFIG), 0.0)
    assert decisions.preemptions == ()
    (shrink,) = decisions.resizes
    assert (shrink.job_id, shrink.direction, shrink.from_gpus, shrink.to_gpus, shrink.for_job) == ("e", "shrink", 24, 16, "want")
    assert [m.rank for m in shrink.members] == [0, 1]
    assert decisions.pending_codes["want"] == Pending.SHRINKING
    (nomination,) = [r for r in decisions.reservations if r.job_id == "want"]
    # Once the shrink committed, the waiting job binds onto exactly the GPUs given back.
    shrunk = apply_resize(e, shrink, 10.0)
    after = run_cycle(snap(nodes, [want], running_jobs=[fixed, shrunk], tenants=tenants, config=CONFIG, reservations=(nomination,)), 20.0)
    (b,) = after.binds
    assert gpus_of(b.members) == gpus_of(e.members) - gpus_of(shrunk.members)
    assert after.resizes == () and after.preemptions == ()


def test_a_job_shrinking_for_one_waiting_job_is_not_also_preempted_for_another() -> None:
    # "e" gives back its 4 extra GPUs to "a1"; "a2" could only get GPUs by preempting "e" whole. One decision
    # per job per cycle: the shrink stands, "a2" waits (and may preempt "e" in a later cycle).
    nodes = leaf_nodes("l1", 1)
    e = elastic_running("e", {"l1-n0": tuple(range(8))}, 4, 8, tenant="b", priority=10, checkpoint=-H)
    tenants = [tenant("a", cohort="c", nominal=8), tenant("b", cohort="c", nominal=0)]
    decisions = run_cycle(snap(nodes, [job("a1", 4), job("a2", 4)], running_jobs=[e], tenants=tenants, config=CONFIG), 0.0)
    assert [(r.job_id, r.direction, r.for_job) for r in decisions.resizes] == [("e", "shrink", "a1")]
    assert decisions.preemptions == ()
    check_elastic(snap(nodes, [job("a1", 4), job("a2", 4)], running_jobs=[e], tenants=tenants, config=CONFIG), decisions)


def test_the_cheapest_donor_shrinks_first_and_never_below_its_minimum() -> None:
    nodes = leaf_nodes("l1", 4)
    costly = elastic_running("costly", {"l1-n0": tuple(range(8)), "l1-n1": tuple(range(8))}, 8, 16, checkpoint=-2 * H)
    cheap = elastic_running("cheap", {"l1-n2": tuple(range(8)), "l1-n3": tuple(range(8))}, 8, 16, checkpoint=-60.0)
    decisions = run_cycle(snap(nodes, [job("want", 8)], running_jobs=[costly, cheap], config=CONFIG), 0.0)
    (shrink,) = decisions.resizes
    assert shrink.job_id == "cheap" and shrink.to_gpus == 8
    # Both at their minimum: nothing to take back, the whole-job rules apply (here: same priority, no preemption).
    at_min = [replace(costly, members=costly.members[:1], gpu_count=8), replace(cheap, members=cheap.members[:1], gpu_count=8)]
    decisions = run_cycle(snap(nodes, [job("want", 24)], running_jobs=at_min, config=CONFIG), 0.0)
    assert decisions.resizes == ()


def test_gpus_above_the_minimum_do_not_count_against_the_quota() -> None:
    nodes = leaf_nodes("l1", 4)
    e = elastic_running("e", {"l1-n0": tuple(range(8)), "l1-n1": tuple(range(8)), "l1-n2": tuple(range(8))}, 8, 24, tenant="a")
    tenants = [tenant("a", nominal=16)]  # no cohort: no borrowing, yet 8 more fit its guarantee
    decisions = run_cycle(snap(nodes, [job("more", 8, tenant="a")], running_jobs=[e], tenants=tenants, config=CONFIG), 0.0)
    assert [b.job_id for b in decisions.binds] == ["more"]


# ---------------------------------------------------------------- properties


@st.composite
def elastic_worlds(draw: st.DrawFn) -> tuple[list[NodeView], list[RunningJob], list]:
    leaves = draw(st.integers(1, 2))
    per_leaf = draw(st.integers(2, 4))
    nodes = [n for i in range(leaves) for n in leaf_nodes(f"l{i}", per_leaf, spine="s1")]
    free = {n.id: set(range(8)) for n in nodes}
    jobs: list[RunningJob] = []
    for i in range(draw(st.integers(0, 4))):
        multi = draw(st.booleans())
        if multi:
            whole = [n for n in nodes if len(free[n.id]) == 8]
            if not whole:
                continue
            leaf = draw(st.sampled_from(sorted({n.labels[0][1] for n in whole})))
            mine = [n for n in whole if n.labels[0][1] == leaf]
            take = draw(st.integers(1, len(mine)))
            lo_nodes = draw(st.integers(1, take))
            hi_nodes = draw(st.integers(take, per_leaf + 1))
            placement = {n.id: tuple(range(8)) for n in mine[:take]}
            for n in mine[:take]:
                free[n.id].clear()
            lo, hi = 8 * lo_nodes, 8 * hi_nodes
            level = draw(st.sampled_from(["leaf", "any"]))
        else:
            candidates = [n for n in nodes if free[n.id]]
            if not candidates:
                continue
            n = draw(st.sampled_from(candidates))
            count = draw(st.integers(1, len(free[n.id])))
            gpus = tuple(sorted(free[n.id])[:count])
            free[n.id] -= set(gpus)
            placement = {n.id: gpus}
            lo, hi = draw(st.integers(1, count)), draw(st.integers(count, 8))
            level = "any"
        elastic = draw(st.booleans())
        r = running(f"r{i}", placement, tenant=draw(st.sampled_from(["a", "b"])), checkpoint=-draw(st.integers(0, 7200)) * 1.0)
        if elastic and hi > lo:
            r = replace(r, gpu_min=lo, gpu_max=hi, topology_level=level)
        jobs.append(r)
    pending = []
    for i in range(draw(st.integers(0, 4))):
        multi = draw(st.booleans())
        count = 8 * draw(st.integers(1, per_leaf)) if multi else draw(st.integers(1, 8))
        p = job(f"p{i}", count, tenant=draw(st.sampled_from(["a", "b"])), level="leaf" if multi else "any")
        if draw(st.booleans()):
            p = replace(p, gpu_max=count + (8 if multi else draw(st.integers(0, 8 - count) if count < 8 else st.just(0))))
        pending.append(p)
    since = draw(st.sampled_from([-H, -10.0]))
    return idle(nodes, since), jobs, pending


def check_elastic(snapshot: Snapshot, decisions: Decisions) -> None:
    running_by_id = {r.id: r for r in snapshot.running}
    by_id = {n.id: n for n in snapshot.nodes}
    owner: dict[tuple[str, int], str] = {}
    stopping = {p.job_id for p in decisions.preemptions}
    resized = [r.job_id for r in decisions.resizes]
    assert len(resized) == len(set(resized)), "at most one resize per job per cycle"
    assert not stopping & set(resized), "a job is preempted or resized in one cycle, never both"
    final: dict[str, tuple[Member, ...]] = {r.id: r.members for r in snapshot.running}
    for resize in decisions.resizes:
        job = running_by_id[resize.job_id]
        assert job.elastic
        assert job.gpu_min is not None and job.gpu_max is not None
        assert job.gpu_min <= resize.to_gpus <= job.gpu_max, "inside its range"
        assert resize.to_gpus == sum(len(m.gpu_indices) for m in resize.members)
        assert sorted(m.rank for m in resize.members) == list(range(len(resize.members)))
        if resize.direction == "grow":
            assert gpus_of(job.members) <= gpus_of(resize.members), "growth keeps every GPU"
            new = gpus_of(resize.members) - gpus_of(job.members)
            assert all(g in by_id[n].free for n, g in new), "growth only onto free GPUs"
            if job.topology_level == "leaf":
                assert len({by_id[m.node_id].domain("leaf") for m in resize.members}) == 1, "topology kept"
        else:
            assert gpus_of(resize.members) <= gpus_of(job.members), "a shrink only gives back"
        final[resize.job_id] = resize.members
    for b in decisions.binds:
        final[b.job_id] = b.members
    for job_id, members in final.items():
        for m in members:
            for g in m.gpu_indices:
                assert (m.node_id, g) not in owner, f"GPU {m.node_id}/{g} double-booked by {job_id} and {owner[(m.node_id, g)]}"
                owner[(m.node_id, g)] = job_id
    for r in snapshot.running:
        if r.elastic and r.id not in stopping:
            assert r.gpu_min is not None
            assert sum(len(m.gpu_indices) for m in final[r.id]) >= r.gpu_min


def run_to_rest(nodes: list[NodeView], jobs: list[RunningJob], pending: list, cycles: int = 4) -> None:
    """A few cycles, committing resizes at once; every cycle's decisions are checked."""
    running_now = {r.id: r for r in jobs}
    waiting = {p.id: p for p in pending}
    reservations: tuple = ()
    now = 0.0
    for _ in range(cycles):
        snapshot = snap(nodes, list(waiting.values()), running_jobs=list(running_now.values()), config=CONFIG, reservations=reservations)
        decisions = run_cycle(snapshot, now)
        assert decisions == run_cycle(snapshot, now), "deterministic"
        assert decisions == Scheduler().run_cycle(snapshot, now), "incremental core agrees"
        check_elastic(snapshot, decisions)
        for resize in decisions.resizes:
            running_now[resize.job_id] = apply_resize(running_now[resize.job_id], resize, now)
        for p in decisions.preemptions:
            running_now.pop(p.job_id, None)
        for b in decisions.binds:
            running_now[b.job_id] = RunningJob.started(waiting.pop(b.job_id), b.members, now)
        reservations = decisions.reservations
        now += 30.0
    # A waiting fixed job that would fit if elastic jobs shrank to their minimum is not left behind their extra GPUs.
    snapshot = snap(nodes, list(waiting.values()), running_jobs=list(running_now.values()), config=CONFIG, reservations=reservations)
    decisions = run_cycle(snapshot, now)
    for p in waiting.values():
        if p.id in {b.job_id for b in decisions.binds} or p.gpu_max:
            continue
        # GPUs an elastic job would give back on nodes another waiting job has reserved are that job's:
        # then p waits behind the reservation (anti-starvation), not behind the elastic job's extras.
        reserved = {n for r in decisions.reservations if r.job_id != p.id for n in r.node_ids}
        if any(m.node_id in reserved for r in running_now.values() if r.elastic for m in r.members):
            continue
        at_min = [
            replace(r, members=_minimum_members(r), gpu_count=r.gpu_min) if r.elastic and r.gpu_min is not None else r
            for r in running_now.values()
        ]
        alone = run_cycle(snap(nodes, [p], running_jobs=at_min, config=CONFIG), now)
        if alone.binds:
            assert decisions.pending_codes.get(p.id) in (Pending.SHRINKING, Pending.PREEMPTING, Pending.RESERVED) or any(
                r.job_id == p.id for r in decisions.reservations
            ), f"{p.id} waits ({decisions.pending_reasons.get(p.id)}) though shrinking elastic jobs would let it start"


def _minimum_members(r: RunningJob) -> tuple[Member, ...]:
    assert r.gpu_min is not None
    if len(r.members) == 1 and r.gpu_max is not None and r.gpu_max <= 8:
        only = r.members[0]
        return (Member(only.node_id, tuple(sorted(only.gpu_indices)[: r.gpu_min]), 0),)
    return tuple(sorted(r.members, key=lambda m: m.rank))[: r.gpu_min // 8]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elastic_worlds())
def test_elastic_invariants_hold_across_cycles(world: tuple[list[NodeView], list[RunningJob], list]) -> None:
    nodes, jobs, pending = world
    run_to_rest(nodes, jobs, pending)
