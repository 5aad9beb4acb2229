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
