"""Hand-checked single cycles of each baseline policy."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.types import Member
from simulator.policies import POLICIES
from simulator.policies.drf import Drf
from simulator.policies.las import TwoDLas
from simulator.policies.multifactor import MultifactorEasy
from simulator.policies.simple import Fifo, Sjf, StrictPriority
from tests.simulator.helpers import node, pending, running, snapshot


def _hole_case(candidate_runtime: float):
    # n0: 4 GPUs free, the other 4 held until t=100. n1: full until t=1000.
    # The head needs a whole node: its reservation is n0 at t=100; the 4 free GPUs on n0 are the hole.
    nodes = [node("n0", {4, 5, 6, 7}), node("n1", 0)]
    run = [running("r0", "n0", (0, 1, 2, 3), end=100.0), running("r1", "n1", tuple(range(8)), end=1000.0)]
    queue = [pending("head", 8, at=0.0), pending("small", 4, at=1.0, runtime=candidate_runtime)]
    return snapshot(nodes, queue, run)


def test_easy_backfill_fills_the_hole_when_the_job_ends_before_the_reservation():
    d = MultifactorEasy()(_hole_case(candidate_runtime=90.0), 0.0)
    assert [b.job_id for b in d.binds] == ["small"]
    assert d.binds[0].members[0].node_id == "n0"
    assert [(r.job_id, r.node_ids, r.start_at) for r in d.reservations] == [("head", ("n0",), 100.0)]


def test_easy_backfill_leaves_the_hole_when_the_job_would_delay_the_reservation():
    d = MultifactorEasy()(_hole_case(candidate_runtime=101.0), 0.0)
    assert d.binds == ()
    assert d.reservations[0].job_id == "head"


def test_easy_backfill_uses_nodes_outside_the_reservation_whatever_the_runtime():
    snap = _hole_case(candidate_runtime=10_000.0)
    snap = snap.__class__(
        nodes=(*snap.nodes, node("n2", 4)), pending=snap.pending, running=snap.running, tenants=snap.tenants, config=snap.config
    )
    d = MultifactorEasy()(snap, 0.0)
    assert [(b.job_id, b.members[0].node_id) for b in d.binds] == [("small", "n2")]


def test_fifo_head_blocks_the_jobs_behind_it_but_not_other_gpu_types():
    nodes = [node("n0", 4), node("l0", 4, gpus=4, gpu_type="L40S")]
    queue = [pending("big", 8, at=0.0), pending("small", 1, at=1.0), pending("other", 2, at=2.0, gpu_type="L40S")]
    d = Fifo()(snapshot(nodes, queue), 0.0)
    assert [b.job_id for b in d.binds] == ["other"]


def test_strict_priority_starts_high_first_and_blocks_lower_priorities():
    nodes = [node("n0", 4)]
    queue = [pending("low", 1, at=0.0, priority=0), pending("high", 4, at=5.0, priority=200), pending("high2", 8, at=6.0, priority=200)]
    d = StrictPriority()(snapshot(nodes, queue), 10.0)
    assert [b.job_id for b in d.binds] == ["high"]


def test_sjf_picks_the_shortest_expected_job():
    nodes = [node("n0", 2)]
    queue = [pending("long", 2, at=0.0, runtime=500.0), pending("short", 2, at=1.0, runtime=50.0)]
    d = Sjf()(snapshot(nodes, queue), 0.0)
    assert [b.job_id for b in d.binds] == ["short"]


def test_best_fit_packs_single_node_jobs_onto_the_fullest_node_that_holds_them():
    nodes = [node("n0", 8), node("n1", 3), node("n2", 2)]
    d = Sjf()(snapshot(nodes, [pending("j", 2)]), 0.0)
    assert d.binds[0].members[0].node_id == "n2"


def test_multi_node_gang_takes_whole_nodes_inside_one_leaf():
    nodes = [node("a0", 8, leaf="la"), node("b0", 8, leaf="lb"), node("b1", 8, leaf="lb"), node("a1", 4, leaf="la")]
    d = Fifo()(snapshot(nodes, [pending("g", 16)]), 0.0)
    assert sorted(m.node_id for m in d.binds[0].members) == ["b0", "b1"]


def test_drf_offers_gpus_to_the_tenant_with_the_smaller_dominant_share():
    nodes = [node("n0", 2), node("n1", 0)]
    run = [running("r", "n1", tuple(range(8)), end=1e9, tenant="rich")]
    queue = [pending("rich-job", 2, at=0.0, tenant="rich"), pending("poor-job", 2, at=5.0, tenant="poor")]
    d = Drf()(snapshot(nodes, queue, run, tenants=("rich", "poor")), 10.0)
    assert [b.job_id for b in d.binds] == ["poor-job"]


def test_las_preempts_a_long_runner_for_a_fresh_job_and_gives_it_the_gpus():
    nodes = [node("n0", 0)]
    long_runner = running("old", "n0", tuple(range(8)), start=0.0, end=1e9)
    policy = TwoDLas()
    policy(snapshot(nodes, [], [long_runner]), 0.0)
    d = policy(snapshot(nodes, [pending("new", 8, at=7000.0)], [long_runner]), 7200.0)
    assert [(p.job_id, p.for_job) for p in d.preemptions] == [("old", "new")]
    assert [b.job_id for b in d.binds] == ["new"]
    assert d.binds[0].members == (Member(node_id="n0", gpu_indices=tuple(range(8)), rank=0),)


def test_las_does_not_preempt_within_the_minimum_runtime():
    nodes = [node("n0", 0)]
    young = running("young", "n0", tuple(range(8)), start=7000.0, end=1e9)
    d = TwoDLas()(snapshot(nodes, [pending("new", 8, at=7100.0)], [young]), 7200.0)
    assert d.preemptions == () and d.binds == ()


def test_every_policy_places_a_gang_whole_or_not_at_all():
    # A 16-GPU gang needs two wholly free 8-GPU nodes. Quotas are off (no tenants), so only room decides.
    gang = pending("g", 16)
    scattered = [node("n0", 8), node("n1", 4), node("n2", 4), node("n3", 4)]  # 20 GPUs free, one whole node
    whole = [node("n0", 8), node("n1", 4), node("n2", 8)]
    for name, spec in POLICIES.items():
        d = spec.make()(snapshot(scattered, [gang], tenants=()), 0.0)
        assert d.binds == (), name
        d = spec.make()(snapshot(whole, [gang], tenants=()), 0.0)
        assert [(m.node_id, m.gpu_indices) for b in d.binds for m in b.members] == [("n0", tuple(range(8))), ("n2", tuple(range(8)))], name


def _state(index):
    return (
        {k: set(v) for k, v in index.free.items()},
        {t: [set(b) for b in bs] for t, bs in index.buckets.items()},
        dict(index.total),
    )


@settings(max_examples=40, deadline=None)
@given(
    frees=st.lists(st.lists(st.integers(0, 8), min_size=4, max_size=4), min_size=2, max_size=5),
    takes=st.lists(st.sampled_from([1, 2, 4, 8, 16]), max_size=4),
)
def test_a_kept_index_after_sync_equals_a_fresh_one(frees, takes):
    from simulator.policies.placement import FreeIndex

    kept = FreeIndex()
    views = {}
    for step in frees:
        nodes = []
        for i, f in enumerate(step):
            old = views.get(i)
            # Reuse the unchanged view object, as the simulator does.
            views[i] = old if old is not None and len(old.free) == f else node(f"n{i}", f, leaf=f"l{i // 2}")
            nodes.append(views[i])
        snap = snapshot(nodes, [])
        kept.sync(snap)
        assert _state(kept) == _state(FreeIndex(snap))
        for gpus in takes:
            members = kept.place(pending("t", gpus))
            if members is not None:
                assert sum(len(m.gpu_indices) for m in members) == gpus
