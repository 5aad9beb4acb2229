"""Allocations on both backends: bindings committed under the lease, one live allocation per GPU, releases."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError

from fairgang.members import PlacedMember, members_of
from fairgang.spec import JobState
from store import jobs, placement
from store.db import Database
from store.models import Allocation, AllocationGpu
from store.snapshot import allocation_members
from tests.store.helpers import bind, queued_job


async def test_store_refuses_a_second_live_allocation_of_the_same_gpu(seeded: Database) -> None:
    a = await queued_job(seeded, "a")
    b = await queued_job(seeded, "b")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    assert len(await bind(seeded, a.id, [PlacedMember(node_id="h1", gpu_indices=[0, 1], rank=0)], epoch)) == 1
    # Through the repository: the conflicting binding is skipped, not committed.
    assert await bind(seeded, b.id, [PlacedMember(node_id="h1", gpu_indices=[1, 2], rank=0)], epoch) == []
    assert (await jobs.get_job(seeded, b.id)).state == "QUEUED"  # type: ignore[union-attr]
    # Straight at the table: the partial unique index itself refuses it.
    async with seeded.sessions() as session:
        session.add(Allocation(id="a-raw", job_id=b.id, attempt=1, members=[], created_at=0.0))
        await session.flush()
        session.add(AllocationGpu(allocation_id="a-raw", node_id="h1", gpu_index=0))
        with pytest.raises(IntegrityError):
            await session.flush()
        await session.rollback()


async def test_a_bindings_members_are_stored_and_read_back_as_placed(seeded: Database) -> None:
    """The JSON column keeps each member as ``{"node_id", "gpu_indices", "rank"}`` (the API shows it so), the
    reads hand back the same PlacedMembers, and the PLACED event names each member's node and GPUs."""
    job = await queued_job(seeded, "gang")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    members = [PlacedMember(node_id="h1", gpu_indices=[0, 1], rank=0), PlacedMember(node_id="h2", gpu_indices=[6, 7], rank=1)]
    [alloc] = await bind(seeded, job.id, members, epoch)
    [stored] = await jobs.job_allocations(seeded, job.id)
    assert stored.members == [{"node_id": "h1", "gpu_indices": [0, 1], "rank": 0}, {"node_id": "h2", "gpu_indices": [6, 7], "rank": 1}]
    assert members_of(stored.members) == members
    async with seeded.sessions() as session:
        assert await allocation_members(session, [alloc.id]) == {alloc.id: members}
    [placed] = [e for e in await jobs.job_events(seeded, job.id) if e.kind == "PLACED"]
    assert placed.message == "placed on h1[0,1], h2[6,7]"


async def test_released_gpus_can_be_allocated_again(seeded: Database) -> None:
    a = await queued_job(seeded, "a")
    b = await queued_job(seeded, "b")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    [alloc] = await bind(seeded, a.id, [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)], epoch)
    await jobs.record_transition(seeded, job_id=a.id, attempt=1, state=JobState.SUCCEEDED, event_key="end-1", exit_code=0)
    assert await placement.live_allocation_gpus(seeded) == []
    assert len(await bind(seeded, b.id, [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)], epoch)) == 1
    assert (await jobs.job_allocations(seeded, a.id))[0].state == "RELEASED"
    assert alloc.id != (await jobs.job_allocations(seeded, b.id))[0].id


async def test_stale_leader_cannot_commit(seeded: Database) -> None:
    job = await queued_job(seeded, "a")
    old = await placement.acquire_lease(seeded, name="placement", holder="old", ttl_s=5, now=1000.0)
    assert old == 1
    assert await placement.acquire_lease(seeded, name="placement", holder="new", ttl_s=5, now=1001.0) is None
    new = await placement.acquire_lease(seeded, name="placement", holder="new", ttl_s=5, now=1010.0)
    assert new == 2
    with pytest.raises(placement.LeaseLost):
        await placement.commit_bindings(
            seeded,
            bindings=[placement.BindingRow(job_id=job.id, attempt=1, members=[PlacedMember(node_id="h1", gpu_indices=[0], rank=0)])],
            pending_reasons={},
            lease_name="placement",
            epoch=old,
            now=1011.0,
        )
    assert await placement.live_allocation_gpus(seeded) == []


async def test_binding_a_cancelled_job_is_skipped(seeded: Database) -> None:
    job = await queued_job(seeded, "a")
    await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.CANCELLED, event_key="cancel-1")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    assert await bind(seeded, job.id, [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)], epoch) == []
    assert await placement.live_allocation_gpus(seeded) == []


async def test_change_feed_moves_when_an_allocation_is_released(seeded: Database) -> None:
    """Freed capacity wakes the placement service: ending a bound job moves the change feed."""
    job = await queued_job(seeded, "a")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    await bind(seeded, job.id, [PlacedMember(node_id="g1", gpu_indices=[0, 1, 2, 3], rank=0)], epoch)
    before = await placement.change_version(seeded)
    await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.SUCCEEDED, event_key="end-1", exit_code=0)
    assert await placement.change_version(seeded) > before


async def test_a_pending_reason_is_stored_with_its_code_and_both_go_when_the_job_moves_on(seeded: Database) -> None:
    a = await queued_job(seeded, "a")
    b = await queued_job(seeded, "b")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None

    async def write(reasons: dict[str, str], codes: dict[str, str] | None) -> None:
        await placement.commit_bindings(
            seeded, bindings=[], pending_reasons=reasons, pending_codes=codes, lease_name="placement", epoch=epoch
        )

    async def stored(job_id: str) -> tuple[str | None, str | None]:
        job = await jobs.get_job(seeded, job_id)
        assert job is not None
        return job.pending_reason, job.pending_code

    await write({a.id: "no H100-80GB node has 8 free GPUs", b.id: "reserved behind job x"}, {a.id: "no_free_node", b.id: "reserved"})
    assert await stored(a.id) == ("no H100-80GB node has 8 free GPUs", "no_free_node")
    assert await stored(b.id) == ("reserved behind job x", "reserved")
    # A text given without a code has none.
    await write({b.id: "waiting"}, None)
    assert await stored(b.id) == ("waiting", None)
    # Bound, or ended while queued: neither text nor code stays.
    await bind(seeded, a.id, [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)], epoch)
    assert await stored(a.id) == (None, None)
    await write({b.id: "reserved behind job x"}, {b.id: "reserved"})
    await jobs.record_transition(seeded, job_id=b.id, attempt=1, state=JobState.CANCELLED, event_key="cancel-1")
    assert await stored(b.id) == (None, None)


async def test_a_resize_replaces_the_allocation_keeping_its_gpus_held_and_the_ledger_exact(seeded: Database) -> None:
    from store import health, nodes, usage
    from store.models import Node

    for node_id in ("h1", "h2"):
        await nodes.register_node(seeded, node_id=node_id, gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b", gpus=[], now=50.0)
    job = await queued_job(seeded, "elastic")
    other = await queued_job(seeded, "other")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    [alloc] = await bind(seeded, job.id, [PlacedMember(node_id="h1", gpu_indices=[0, 1], rank=0)], epoch, now=100.0)
    grown = [PlacedMember(node_id="h1", gpu_indices=[0, 1, 2, 3], rank=0)]
    new = await placement.resize_allocation(
        seeded, job_id=job.id, attempt=1, allocation_id=alloc.id, members=grown, reason="idle", now=200.0
    )
    # Idempotent: the same call again answers the allocation it made.
    again = await placement.resize_allocation(
        seeded, job_id=job.id, attempt=1, allocation_id=alloc.id, members=grown, reason="idle", now=250.0
    )
    assert again.id == new.id and new.resized_from == alloc.id and new.attempt == 1
    held = {(g.node_id, g.gpu_index, g.allocation_id) for g in await placement.live_allocation_gpus(seeded)}
    assert held == {("h1", i, new.id) for i in range(4)}
    # A GPU another allocation holds, a broken GPU, a node taking no new work: each refuses the whole resize.
    [taken] = await bind(seeded, other.id, [PlacedMember(node_id="h1", gpu_indices=[4], rank=0)], epoch, now=210.0)
    for members, why in (
        ([PlacedMember(node_id="h1", gpu_indices=[0, 1, 2, 3, 4], rank=0)], "held by another allocation"),
        ([PlacedMember(node_id="h1", gpu_indices=[0, 1, 2, 3, 5], rank=0)], "not healthy"),
        (
            [PlacedMember(node_id="h1", gpu_indices=[0, 1, 2, 3], rank=0), PlacedMember(node_id="h2", gpu_indices=[0], rank=1)],
            "no new work",
        ),
    ):
        await health.set_gpu_health(seeded, node_id="h1", index=5, healthy=False)
        await nodes.set_node_state(seeded, node_id="h2", state="CORDONED")
        with pytest.raises(placement.ResizeRefused, match=why):
            await placement.resize_allocation(
                seeded, job_id=job.id, attempt=1, allocation_id=new.id, members=members, reason="idle", now=300.0
            )
    # Nothing of a refused resize was written.
    assert {(g.node_id, g.gpu_index) for g in await placement.live_allocation_gpus(seeded) if g.allocation_id == new.id} == {
        ("h1", i) for i in range(4)
    }
    # A stale allocation (already replaced) is refused too.
    with pytest.raises(placement.ResizeRefused, match="not the live allocation"):
        await placement.resize_allocation(seeded, job_id=job.id, attempt=1, allocation_id=taken.id, members=grown, reason="idle", now=300.0)
    shrunk = [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)]
    last = await placement.resize_allocation(
        seeded, job_id=job.id, attempt=1, allocation_id=new.id, members=shrunk, reason="waiting_job", now=400.0
    )
    async with seeded.sessions() as session:
        node = await session.get(Node, "h1")
        assert node is not None and node.freed_at == 400.0  # the GPUs given back are free from now
    events = [e for e in await jobs.job_events(seeded, job.id) if e.kind == "RESIZED"]
    assert [(e.data["from_gpus"], e.data["to_gpus"], e.data["replaced"]) for e in events] == [(2, 4, alloc.id), (4, 1, new.id)]
    # The decayed usage kept by the ledger equals the integral over the allocation rows: 2 GPUs for 100 s, 4 for 200 s, 1 since.
    ledger = await usage.usage(seeded, half_life=1e9, now=500.0)
    history = await usage.from_history(seeded, half_life=1e9, now=500.0)
    assert ledger["alpha"]["H100-80GB"] == pytest.approx(history["alpha"]["H100-80GB"])
    assert history["alpha"]["H100-80GB"] == pytest.approx(2 * 100 + 4 * 200 + 1 * 100 + 1 * 290, rel=1e-6)
    assert last.state == "ACKED"


async def test_a_resized_allocations_checkpoint_reports_are_newer_than_the_ones_before_it(seeded: Database) -> None:
    """A resize launches the gang again, whose reports are numbered from 1 again: they still win over the last
    report of the allocation it replaced (a late report of that one still loses)."""
    from store import nodes

    for node_id in ("h1", "h2"):
        await nodes.register_node(seeded, node_id=node_id, gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b", gpus=[], now=50.0)
    job = await queued_job(seeded, "elastic")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    [alloc] = await bind(seeded, job.id, [PlacedMember(node_id="h1", gpu_indices=[0, 1], rank=0)], epoch, now=100.0)
    for seq in range(1, 6):
        assert await jobs.report_checkpoint(seeded, node_id="h1", allocation_id=alloc.id, path=f"/ckpt/s-{seq}", seq=seq)
    members = [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)]
    new = await placement.resize_allocation(
        seeded, job_id=job.id, attempt=1, allocation_id=alloc.id, members=members, reason="x", now=200.0
    )
    assert await jobs.report_checkpoint(seeded, node_id="h1", allocation_id=new.id, path="/ckpt/s-6", seq=1)
    assert not await jobs.report_checkpoint(seeded, node_id="h1", allocation_id=alloc.id, path="/ckpt/s-5-late", seq=5)
    assert await jobs.latest_checkpoint(seeded, job.id) == "/ckpt/s-6"


async def test_a_predicted_run_time_is_kept_once_per_waiting_attempt(seeded: Database) -> None:
    """The first prediction written for a queued attempt stays; one for an attempt the job is not at, or for a job no
    longer queued, is not written."""
    waiting = await queued_job(seeded, "waiting")
    placed = await queued_job(seeded, "placed")
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=30)
    assert epoch is not None
    await bind(seeded, placed.id, [PlacedMember(node_id="h1", gpu_indices=[0], rank=0)], epoch)

    async def predict(predictions: dict[str, tuple[int, float]]) -> None:
        await placement.commit_bindings(
            seeded, bindings=[], pending_reasons={}, predictions=predictions, lease_name="placement", epoch=epoch
        )

    async def kept(job_id: str) -> tuple[int | None, float | None]:
        job = await jobs.get_job(seeded, job_id)
        assert job is not None
        return job.predicted_attempt, job.predicted_runtime_s

    await predict({waiting.id: (2, 50.0), placed.id: (1, 60.0)})
    assert await kept(waiting.id) == (None, None)  # the job is at attempt 1
    assert await kept(placed.id) == (None, None)  # no longer queued
    await predict({waiting.id: (1, 100.0)})
    await predict({waiting.id: (1, 200.0)})
    assert await kept(waiting.id) == (1, 100.0)
