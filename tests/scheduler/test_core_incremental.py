"""The long-lived ``Scheduler`` decides exactly as ``run_cycle`` does, cycle after cycle.

Random fleets evolve between cycles the way the service and the simulator see them:
bindings start, preemptions and due jobs end, GPUs fail and come back, arrivals queue,
usage decays, and now and then a node is cordoned (a change of the fleet's shape). Node
views and running jobs are sometimes passed on as the same objects (the simulator) and
sometimes rebuilt equal (the service, from the store).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core import Decisions, PendingJob, RunningJob, Scheduler, Snapshot, TenantView, run_cycle
from tests.scheduler.test_core_builders import H, job, leaf_nodes, node, running, snap, tenant
from tests.scheduler.test_core_properties import TENANTS, TYPES, check_invariants, worlds

Draw = Callable[[st.SearchStrategy[Any]], Any]


def _advance(draw: Draw, snapshot: Snapshot, decisions: Decisions, now: float, serial: int) -> tuple[Snapshot, bool]:
    """The next cycle's snapshot, and whether the fleet's shape changed."""
    pending = {p.id: p for p in snapshot.pending}
    running = {r.id: r for r in snapshot.running}
    free = {n.id: set(n.free) for n in snapshot.nodes}
    for preempt in decisions.preemptions:
        victim = running.pop(preempt.job_id, None)
        if victim is not None:
            for member in victim.members:
                free[member.node_id].update(member.gpu_indices)
            pending[victim.id] = PendingJob(
                id=victim.id,
                tenant=victim.tenant,
                attempt=victim.attempt + 1,
                gpu_type=victim.gpu_type,
                gpu_count=victim.gpu_count,
                priority=victim.priority,
                queued_at=now,
                preemptible=victim.preemptible,
                submitted_at=victim.started_at - H,
            )
    for bind in decisions.binds:
        waiting = pending.pop(bind.job_id)
        for member in bind.members:
            free[member.node_id].difference_update(member.gpu_indices)
        running[waiting.id] = RunningJob.started(waiting, bind.members, now)
    for job_id in sorted(running):
        if draw(st.integers(0, 3)) == 0:
            for member in running.pop(job_id).members:
                free[member.node_id].update(member.gpu_indices)
    shape_changed = False
    nodes = []
    for view in snapshot.nodes:
        new_free = free[view.id]
        if draw(st.integers(0, 9)) == 0:  # a GPU fails, or a failed one comes back
            gpu = draw(st.integers(0, view.gpu_count - 1))
            new_free = new_free ^ {gpu}
        schedulable = view.schedulable
        if draw(st.integers(0, 24)) == 0:
            schedulable = not schedulable
            shape_changed = True
        if frozenset(new_free) == view.free and schedulable == view.schedulable and draw(st.booleans()):
            nodes.append(view)  # passed on as the same object
        else:
            nodes.append(replace(view, free=frozenset(new_free), schedulable=schedulable))
    for i in range(draw(st.integers(0, 4))):
        new = job(
            f"a{serial}-{i}",
            draw(st.sampled_from((1, 2, 4, 8, 16))),
            tenant=draw(st.sampled_from(TENANTS)),
            priority=draw(st.sampled_from((0, 100, 200))),
            queued_at=now,
            level=draw(st.sampled_from(("any", "leaf"))),
            gpu_type=draw(st.sampled_from(sorted(TYPES))),
        )
        pending[new.id] = new
    tenants = snapshot.tenants
    if tenants and draw(st.booleans()):
        tenants = tuple(
            TenantView(
                name=t.name, weight=t.weight, cohort=t.cohort, quotas=t.quotas, decayed_usage=(("H100", draw(st.floats(0, 500 * H))),)
            )
            for t in tenants
        )
    if tenants and draw(st.integers(0, 5)) == 0:  # an admin changes a tenant's weight or cohort
        first = tenants[0]
        tenants = (replace(first, weight=first.weight + 1.0, cohort=draw(st.sampled_from((None, "c1")))), *tenants[1:])
    if draw(st.integers(0, 9)) == 0:  # the same fleet, listed in another order
        nodes.reverse()
        shape_changed = True
    keep_running = tuple(running.values()) if draw(st.booleans()) else tuple(replace(r) for r in running.values())
    changed = draw(st.sampled_from(("none", "checkpoint", "end", "tenant")))
    if keep_running and changed != "none":  # a new view of one running job: a checkpoint, a new expected end, a new owner
        job_now: RunningJob = keep_running[0]
        renewed = {
            "checkpoint": replace(job_now, last_checkpoint_at=now),
            "end": replace(job_now, expected_end=job_now.expected_end + 600.0),
            "tenant": replace(job_now, tenant=TENANTS[(TENANTS.index(job_now.tenant) + 1) % len(TENANTS)]),
        }[changed]
        keep_running = (renewed, *keep_running[1:])
    return (
        replace(
            snapshot,
            nodes=tuple(nodes),
            pending=tuple(pending.values()),
            running=keep_running,
            tenants=tenants,
            reservations=decisions.reservations,
        ),
        shape_changed,
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(worlds(), st.data())
def test_a_long_lived_scheduler_decides_as_a_fresh_cycle(snapshot: Snapshot, data: st.DataObject) -> None:
    scheduler = Scheduler()
    now = 10 * H
    shape_changed = True
    for step in range(6):
        reused = scheduler.reused
        decisions = scheduler.run_cycle(snapshot, now)
        assert decisions == run_cycle(snapshot, now), f"cycle {step}"
        check_invariants(snapshot, decisions, now)
        if not shape_changed:
            assert scheduler.reused == reused + 1, "an unchanged fleet shape reuses the workspace"
        if data.draw(st.booleans()):
            # The same snapshot again: the cycle before left nothing of its own behind.
            assert scheduler.run_cycle(snapshot, now) == decisions
        now += data.draw(st.sampled_from((1.0, 30.0, H)))
        snapshot, shape_changed = _advance(data.draw, snapshot, decisions, now, step)


def test_a_cycle_that_raises_leaves_a_scheduler_that_rebuilds(monkeypatch) -> None:
    import scheduler.core.cycle as cycle_module

    snapshot = Snapshot(nodes=(node("n1"), node("n2")), pending=(job("a", 4), job("b", 4), job("c", 8)))
    scheduler = Scheduler()
    expected = run_cycle(snapshot, 0.0)
    assert len(expected.binds) == 3
    real_admit = cycle_module.admit
    admitted: list[str] = []

    def failing_admit(cycle, pending):
        if admitted:
            raise RuntimeError("boom")  # after the first bind: the workspace holds a bind of this cycle
        admitted.append(pending.id)
        real_admit(cycle, pending)

    monkeypatch.setattr(cycle_module, "admit", failing_admit)
    try:
        scheduler.run_cycle(snapshot, 0.0)
    except RuntimeError:
        pass
    monkeypatch.setattr(cycle_module, "admit", real_admit)
    before = scheduler.rebuilt
    assert scheduler.run_cycle(snapshot, 0.0) == expected
    assert scheduler.rebuilt == before + 1


def test_a_new_checkpoint_alone_reaches_the_victims_a_long_lived_scheduler_weighs() -> None:
    """Between two cycles only a running job's checkpoint changes (the most common new view): the long-lived
    scheduler weighs a reclaim's victims by the new checkpoint, as a fresh cycle does."""
    cohort = [tenant("a", cohort="c", nominal=8), tenant("b", cohort="c", nominal=8)]
    now = 10 * H
    jobs = [
        running(f"a-{i}", {f"l1-n{i}": tuple(range(8))}, tenant="a", started_at=now - 3 * H, end=now + 5 * H, checkpoint=now - (i + 1) * H)
        for i in range(2)
    ]
    nodes = tuple(leaf_nodes("l1", 2))
    scheduler = Scheduler()
    # A job of a's waits (a has no nominal left to reclaim): the cycle walks the queue, and the workspace's
    # running jobs and victims are as it built them.
    waiting = job("a9", 1, tenant="a", queued_at=now)
    first = snap(list(nodes), [waiting], running_jobs=jobs, tenants=cohort)
    assert scheduler.run_cycle(first, now) == run_cycle(first, now)
    # a-1 (borrowed, 2 h of work at risk) checkpoints; b's job arrives and takes its nominal back.
    later = now + 60.0
    renewed = (jobs[0], replace(jobs[1], last_checkpoint_at=later - 30.0))
    second = replace(first, running=renewed, pending=(waiting, job("b0", 8, tenant="b", queued_at=later)))
    reused = scheduler.reused
    decisions = scheduler.run_cycle(second, later)
    assert scheduler.reused == reused + 1
    assert decisions == run_cycle(second, later)
    assert [p.job_id for p in decisions.preemptions] == ["a-1"]
