"""Properties over random fleets, quotas, running jobs and queues."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler.core import Decisions, NodeView, Pending, Quota, RunningJob, SchedulerConfig, Snapshot, TenantView, run_cycle
from tests.scheduler.test_core_builders import H, job, node, running

TYPES = {"H100": 8, "L40S": 4}
TENANTS = ("t0", "t1", "t2", "t3")
LEVELS = ("any", "node", "leaf", "spine")


@st.composite
def worlds(draw: st.DrawFn) -> Snapshot:
    nodes: list[NodeView] = []
    for gpu_type, size in TYPES.items():
        for i in range(draw(st.integers(0, 8))):
            leaf = draw(st.integers(0, 2))
            nodes.append(
                node(
                    f"{gpu_type[0]}{i}",
                    size,
                    leaf=f"l{leaf}",
                    spine=f"s{leaf // 2}",
                    gpu_type=gpu_type,
                    free=set(draw(st.sets(st.integers(0, size - 1), min_size=size - 2, max_size=size))),  # some GPUs unhealthy
                    schedulable=draw(st.booleans()) or draw(st.booleans()),
                )
            )
    now = 10 * H
    jobs_running: list[RunningJob] = []
    free = {n.id: sorted(n.free) for n in nodes}
    for i in range(draw(st.integers(0, 10))):
        if not nodes:
            break
        where = draw(st.sampled_from(nodes))
        count = draw(st.integers(1, 8))
        gpus = free[where.id][:count]
        if not gpus:
            continue
        free[where.id] = free[where.id][len(gpus) :]
        jobs_running.append(
            running(
                f"r{i}",
                {where.id: tuple(gpus)},
                tenant=draw(st.sampled_from(TENANTS)),
                priority=draw(st.sampled_from((0, 100, 200))),
                started_at=now - draw(st.floats(0, 8 * H)),
                end=now + draw(st.floats(0, 4 * H)),
                checkpoint=None if draw(st.booleans()) else now - draw(st.floats(0, H)),
                preemptible=draw(st.booleans()),
                gpu_type=where.gpu_type,
            )
        )
    tenants: list[TenantView] = []
    if draw(st.booleans()):
        for name in TENANTS:
            quotas = tuple(
                (
                    t,
                    Quota(
                        nominal=draw(st.integers(0, 24)),
                        borrow_limit=draw(st.none() | st.integers(0, 16)),
                        lend_limit=draw(st.none() | st.integers(0, 16)),
                    ),
                )
                for t in sorted(TYPES)
            )
            tenants.append(
                TenantView(
                    name=name, weight=draw(st.sampled_from((1.0, 2.0))), cohort=draw(st.sampled_from((None, "c1", "c2"))), quotas=quotas
                )
            )
    pending = [
        job(
            f"p{i}",
            draw(st.sampled_from((1, 1, 2, 3, 4, 8, 12, 16, 24))),
            tenant=draw(st.sampled_from(TENANTS)),
            priority=draw(st.sampled_from((0, 100, 200))),
            queued_at=now - draw(st.floats(0, 8 * H)),
            level=draw(st.sampled_from(LEVELS)),
            required=draw(st.booleans()),
            runtime=draw(st.sampled_from((0.25 * H, H, 48 * H))),
            gpu_type=draw(st.sampled_from(sorted(TYPES))),
            preemptible=draw(st.booleans()),
        )
        for i in range(draw(st.integers(0, 25)))
    ]
    config = SchedulerConfig(max_wait_s=draw(st.sampled_from((H, 6 * H))), backfill=draw(st.booleans()))
    views = tuple(replace(n, free=frozenset(free[n.id])) for n in nodes)
    return Snapshot(nodes=views, pending=tuple(pending), tenants=tuple(tenants), running=tuple(jobs_running), config=config)


def check_invariants(snapshot: Snapshot, decisions: Decisions, now: float) -> None:
    nodes = {n.id: n for n in snapshot.nodes}
    pending = {p.id: p for p in snapshot.pending}
    held = {(m.node_id, g) for r in snapshot.running for m in r.members for g in m.gpu_indices}
    taken: set[tuple[str, int]] = set()
    for bind in decisions.binds:
        want = pending[bind.job_id]
        assert bind.attempt == want.attempt
        # Gangs whole, ranks in order, distinct nodes of the right type.
        assert sum(len(m.gpu_indices) for m in bind.members) == want.gpu_count
        assert [m.rank for m in bind.members] == list(range(len(bind.members)))
        assert len({m.node_id for m in bind.members}) == len(bind.members)
        for m in bind.members:
            view = nodes[m.node_id]
            assert view.schedulable and view.gpu_type == want.gpu_type
            for g in m.gpu_indices:
                # No GPU double-booked: free, not a running job's, not bound twice.
                assert g in view.free and (m.node_id, g) not in held and (m.node_id, g) not in taken
                taken.add((m.node_id, g))
        if len(bind.members) > 1:
            assert all(len(m.gpu_indices) == nodes[m.node_id].gpu_count for m in bind.members[:-1]), "multi-node gangs take whole nodes"
        # Required topology honoured.
        if want.topology_required and want.topology_level == "node":
            assert len(bind.members) == 1
        elif want.topology_required and want.topology_level != "any":
            assert len({nodes[m.node_id].domain(want.topology_level) for m in bind.members}) == 1
    # Every pending job is bound or has a reason, never both.
    bound = {b.job_id for b in decisions.binds}
    assert bound.isdisjoint(decisions.pending_reasons) and bound | set(decisions.pending_reasons) == set(pending)
    # Each has a code beside its text.
    assert decisions.pending_codes.keys() == decisions.pending_reasons.keys()
    assert all(isinstance(code, Pending) for code in decisions.pending_codes.values())
    # Non-preemptible jobs untouched; victims past their minimum runtime; each victim preempted once.
    by_id = {r.id: r for r in snapshot.running}
    victims = [p.job_id for p in decisions.preemptions]
    assert len(victims) == len(set(victims))
    for p in decisions.preemptions:
        victim = by_id[p.job_id]
        assert victim.preemptible and now - victim.started_at >= snapshot.config.min_runtime_before_preempt_s
        assert p.for_job in pending and p.for_job not in bound
        assert p.reason in ("priority", "reclaim", "max_wait")
    # Nominated GPUs are nobody else's binding.
    for res in decisions.reservations:
        for m in res.members:
            assert not any((m.node_id, g) in taken for g in m.gpu_indices)
    _check_quota(snapshot, decisions)


def _check_quota(snapshot: Snapshot, decisions: Decisions) -> None:
    """Guarantees and limits, from the quota rules themselves (not the core's code)."""
    if not snapshot.tenants:
        return
    pending = {p.id: p for p in snapshot.pending}
    tenants = {t.name: t for t in snapshot.tenants}
    before: dict[tuple[str, str], int] = {}
    for r in snapshot.running:
        before[(r.tenant, r.gpu_type)] = before.get((r.tenant, r.gpu_type), 0) + r.gpu_count
    after = dict(before)
    for b in decisions.binds:
        p = pending[b.job_id]
        after[(p.tenant, p.gpu_type)] = after.get((p.tenant, p.gpu_type), 0) + p.gpu_count
    for (name, gpu_type), used in after.items():
        if used == before.get((name, gpu_type), 0):
            continue
        view = tenants.get(name)
        assert view is not None, f"{name} has no quota but got GPUs"
        quota = dict(view.quotas).get(gpu_type, Quota() if view.cohort else Quota(nominal=0, borrow_limit=0))
        if used <= quota.nominal:
            continue
        assert view.cohort is not None
        assert quota.borrow_limit is None or used <= quota.nominal + quota.borrow_limit
        members = [t for t in snapshot.tenants if t.cohort == view.cohort]
        borrowed = lendable = 0
        for t in members:
            q = dict(t.quotas).get(gpu_type, Quota())
            u = after.get((t.name, gpu_type), 0)
            borrowed += max(0, u - q.nominal)
            idle = max(0, q.nominal - u)
            lendable += idle if q.lend_limit is None else min(q.lend_limit, idle)
        assert borrowed <= lendable, f"cohort {view.cohort} borrows {borrowed} > lends {lendable} of {gpu_type}"
    # A job that fits its own tenant's guarantee is never told it is over quota.
    for job_id, code in decisions.pending_codes.items():
        p = pending[job_id]
        nominal = dict(tenants[p.tenant].quotas).get(p.gpu_type, Quota()).nominal if p.tenant in tenants else 0
        if after.get((p.tenant, p.gpu_type), 0) + p.gpu_count <= nominal:
            assert code != Pending.OVER_QUOTA, (job_id, decisions.pending_reasons[job_id])


def _shuffled(snapshot: Snapshot) -> Snapshot:
    return replace(
        snapshot,
        nodes=tuple(reversed(snapshot.nodes)),
        pending=tuple(reversed(snapshot.pending)),
        running=tuple(reversed(snapshot.running)),
        tenants=tuple(reversed(snapshot.tenants)),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_invariants_hold_and_output_is_deterministic(snapshot: Snapshot) -> None:
    now = 10 * H
    decisions = run_cycle(snapshot, now)
    check_invariants(snapshot, decisions, now)
    assert run_cycle(_shuffled(snapshot), now) == decisions
    assert run_cycle(snapshot, now) == decisions


#: A world whose first cycle surely nominates: "p" (priority 200) needs the GPUs of "low" (priority 0).
NOMINATING = Snapshot(
    nodes=(node("n", free=set()),),
    pending=(job("p", 8, priority=200),),
    running=(running("low", {"n": tuple(range(8))}, priority=0, started_at=0.0),),
)


def test_invariants_hold_across_cycles_with_fed_back_reservations() -> None:
    carried: list[str] = []

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(worlds())
    @example(NOMINATING)
    def two_cycles(snapshot: Snapshot) -> None:
        now = 10 * H
        first = run_cycle(snapshot, now)
        pending = {p.id: p for p in snapshot.pending}
        started = [RunningJob.started(pending[b.job_id], b.members, now) for b in first.binds]
        used = {(m.node_id, g) for b in first.binds for m in b.members for g in m.gpu_indices}
        nodes = tuple(replace(n, free=frozenset(g for g in n.free if (n.id, g) not in used)) for n in snapshot.nodes)
        bound = {b.job_id for b in first.binds}
        second_snapshot = replace(
            snapshot,
            nodes=nodes,
            pending=tuple(p for p in snapshot.pending if p.id not in bound),
            running=(*snapshot.running, *started),
            reservations=first.reservations,
        )
        second = run_cycle(second_snapshot, now + 30)
        check_invariants(second_snapshot, second, now + 30)
        # A nomination whose victims still run (they all do: the second snapshot keeps every running job)
        # keeps its victims and its GPUs.
        for res in first.reservations:
            if res.victims:
                assert res.job_id in {p.id for p in second_snapshot.pending}
                assert res in second.reservations
                carried.append(res.job_id)

    two_cycles()
    assert carried, "no nomination was carried into a second cycle"


def test_the_property_checker_catches_a_double_booking() -> None:
    snapshot = Snapshot(nodes=(node("n"),), pending=(job("a", 4), job("b", 4)))
    good = run_cycle(snapshot, 0.0)
    check_invariants(snapshot, good, 0.0)
    bad = replace(good, binds=(good.binds[0], replace(good.binds[1], members=good.binds[0].members)))
    try:
        check_invariants(snapshot, bad, 0.0)
    except AssertionError:
        return
    raise AssertionError("a double booking went unnoticed")
