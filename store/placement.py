"""Allocations: the placement service's leader lease, its committed bindings, and each allocation's end.

A binding is committed under the lease's epoch (:func:`commit_bindings`), signalled to its workflow until acknowledged
(:func:`unacked_allocations`, :func:`mark_signalled`), then either revoked (a lost node) or released, which ends its
GPUs' hold and its usage in the ledgers (store/usage.py). An elastic job's resize (:func:`resize_allocation`) ends
its allocation and makes the next one for the same attempt in one transaction: the GPUs it keeps stay held throughout,
and every allocation row keeps one set of GPUs from its start to its end, which the ledgers and the accounting read.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import BindParameter
from sqlmodel import col

from fairgang.members import PlacedMember
from fairgang.spec import JobState
from store import usage
from store.common import LIVE_ALLOCATION_STATES, REVOKED, add_event_once, held, new_event, new_id
from store.db import Database, bump_change_feed
from store.models import Allocation, AllocationGpu, ChangeFeed, Gpu, Job, Node, SchedulerLease


@dataclass(frozen=True)
class BindingRow:
    """A binding the placement service wants to commit."""

    job_id: str
    attempt: int
    members: list[PlacedMember]


class LeaseLost(Exception):
    """The caller no longer holds the leader lease; nothing was committed."""


async def acquire_lease(db: Database, *, name: str, holder: str, ttl_s: float, now: float | None = None) -> int | None:
    """Take or renew the leader lease. Returns the epoch held, or None if another holds it.

    The epoch grows each time the lease changes hands, so a stale leader's commits
    (checked against the epoch) fail.
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        lease = await session.get(SchedulerLease, name, with_for_update=True)
        if lease is None:
            session.add(SchedulerLease(name=name, holder=holder, epoch=1, expires_at=now + ttl_s))
            return 1
        if lease.holder == holder and lease.expires_at >= now:
            lease.expires_at = now + ttl_s
            return lease.epoch
        if lease.expires_at < now:
            lease.holder, lease.epoch, lease.expires_at = holder, lease.epoch + 1, now + ttl_s
            return lease.epoch
        return None


async def release_lease(db: Database, *, name: str, holder: str) -> bool:
    """Give the leader lease up (a leader that stops): a standby takes it at its next cycle instead of waiting out
    the lease. True if ``holder`` held it; the epoch stays, so the next holder's is greater."""
    async with db.transaction() as session:
        lease = await session.get(SchedulerLease, name, with_for_update=True)
        if lease is None or lease.holder != holder:
            return False
        lease.expires_at = 0.0
        return True


async def commit_bindings(
    db: Database,
    *,
    bindings: Sequence[BindingRow],
    pending_reasons: dict[str, str],
    pending_codes: dict[str, str] | None = None,
    predictions: dict[str, tuple[int, float]] | None = None,
    lease_name: str,
    epoch: int,
    now: float | None = None,
) -> list[Allocation]:
    """Commit a cycle's bindings in one transaction guarded by the lease epoch.

    Each binding is a compare-and-set on the job (still QUEUED at that attempt) plus one
    ``allocation_gpu`` row per GPU; a binding that lost a race (job cancelled, GPU taken)
    is skipped through a savepoint and the rest commit. Each binding's GPUs start counting in the
    usage ledgers (store/usage.py) in the same transaction. ``pending_reasons`` are written in one
    statement to the jobs still queued, each with its code from ``pending_codes`` (none: no code):
    pass only those that changed. ``predictions`` (job id -> (attempt, predicted run time)) are kept with the jobs
    still queued at that attempt that have none for it yet (the first one written stays).

    Raises:
        LeaseLost: when ``epoch`` is no longer the lease's epoch.
    """
    now = time.time() if now is None else now
    committed: list[Allocation] = []
    async with db.transaction() as session:
        lease = await session.get(SchedulerLease, lease_name, with_for_update=True)
        if lease is None or lease.epoch != epoch or lease.expires_at < now:
            raise LeaseLost(f"lease {lease_name} epoch {epoch} is no longer held")
        for binding in bindings:
            alloc = Allocation(
                id=new_id("a"),
                job_id=binding.job_id,
                attempt=binding.attempt,
                epoch=epoch,
                members=[m.stored() for m in binding.members],
                created_at=now,
            )
            try:
                async with session.begin_nested():
                    owner = (
                        await session.execute(
                            update(Job)
                            .where(
                                col(Job.id) == binding.job_id, col(Job.state) == JobState.QUEUED.value, col(Job.attempt) == binding.attempt
                            )
                            .values(state=JobState.PLACED.value, pending_reason=None, pending_code=None, updated_at=now)
                            .returning(col(Job.tenant), col(Job.gpu_type))
                        )
                    ).first()
                    if owner is None:
                        raise _SkipBinding
                    session.add(alloc)
                    await session.flush()
                    for member in binding.members:
                        for index in member.gpu_indices:
                            session.add(AllocationGpu(allocation_id=alloc.id, node_id=member.node_id, gpu_index=index))
                    await session.flush()
                    await usage.allocation_started(
                        session, tenant=owner[0], gpu_type=owner[1], gpus=usage.gpus_of(alloc.members), start=now
                    )
                    nodes = ", ".join(map(str, binding.members))
                    session.add(
                        new_event(
                            binding.job_id,
                            binding.attempt,
                            "PLACED",
                            f"placed on {nodes}",
                            f"placed-{binding.attempt}",
                            now,
                            allocation_id=alloc.id,
                        )
                    )
                    await session.flush()
                committed.append(alloc)
            except (_SkipBinding, IntegrityError):
                continue
        # Each in one statement for all the jobs it names, to the jobs still queued.
        table = Job.__table__  # type: ignore[attr-defined]
        if pending_reasons:
            # The caller passes only the reasons that changed.
            await session.execute(
                update(table)
                .where(table.c.id == bindparam("job"), table.c.state == JobState.QUEUED.value)
                .values(pending_reason=bindparam("reason"), pending_code=bindparam("code")),
                [
                    {"job": job_id, "reason": reason, "code": (pending_codes or {}).get(job_id)}
                    for job_id, reason in sorted(pending_reasons.items())
                ],
            )
        if predictions:
            at: BindParameter[int] = bindparam("at")
            await session.execute(
                update(table)
                .where(
                    table.c.id == bindparam("job"),
                    table.c.attempt == at,
                    table.c.state == JobState.QUEUED.value,
                    or_(table.c.predicted_attempt.is_(None), table.c.predicted_attempt != at),
                )
                .values(predicted_attempt=at, predicted_runtime_s=bindparam("runtime")),
                [{"job": job_id, "at": attempt, "runtime": runtime} for job_id, (attempt, runtime) in sorted(predictions.items())],
            )
    return committed


class _SkipBinding(Exception):
    pass


async def unacked_allocations(
    db: Database, *, older_than: float, now: float | None = None, limit: int | None = None
) -> Sequence[Allocation]:
    """Bindings committed but not acknowledged by their workflow, last signalled before ``older_than``.

    With ``now``, each is signalled again with backoff: only once it has waited since its last signal at
    least as long as it had waited before that signal (so the gaps double while Temporal lags). Oldest
    first, at most ``limit``.
    """
    last = func.coalesce(col(Allocation.signalled_at), col(Allocation.created_at))
    query = select(Allocation).where(col(Allocation.state) == "BOUND", last < older_than)
    if now is not None:
        signalled = col(Allocation.signalled_at)
        query = query.where(or_(signalled.is_(None), now - signalled >= signalled - col(Allocation.created_at)))
    async with db.sessions() as session:
        return (await session.execute(query.order_by(last, col(Allocation.id)).limit(limit))).scalars().all()


async def mark_signalled(db: Database, allocation_ids: Sequence[str], now: float | None = None) -> None:
    if not allocation_ids:
        return
    now = time.time() if now is None else now
    async with db.transaction() as session:
        await session.execute(update(Allocation).where(col(Allocation.id).in_(allocation_ids)).values(signalled_at=now))


async def revoke_allocation(db: Database, *, job_id: str, allocation_id: str, reason: str, now: float | None = None) -> bool:
    """Stop holding a live allocation for its agents, keeping its GPUs until it is released (idempotent).

    From then on no heartbeat answer holds it, so its agents stop renewing its members' leases and kill
    them (see worker_agent/shim.py); the workflow waits out the lease before it queues the job again.
    Returns True when it was live.
    """
    now = time.time() if now is None else now
    async with db.transaction() as session:
        alloc = await session.get(Allocation, allocation_id)
        if alloc is None or alloc.job_id != job_id or alloc.state not in LIVE_ALLOCATION_STATES:
            return False
        alloc.state = REVOKED
        session.add(new_event(job_id, alloc.attempt, "REVOKED", reason, f"revoke-{allocation_id}", now, allocation_id=allocation_id))
        return True


async def release_allocation(db: Database, *, job_id: str, allocation_id: str, now: float | None = None) -> bool:
    """Release one allocation (idempotent). Returns True when it was live."""
    now = time.time() if now is None else now
    async with db.transaction() as session:
        return bool(await release_live(session, job_id, now, only=allocation_id))


async def release_live(session: AsyncSession, job_id: str, now: float, *, only: str | None = None) -> list[str]:
    """Release the job's live allocations (all, or just ``only``); returns their ids."""
    query = select(Allocation).where(col(Allocation.job_id) == job_id, col(Allocation.state).in_((*LIVE_ALLOCATION_STATES, REVOKED)))
    if only is not None:
        query = query.where(col(Allocation.id) == only)
    released = []
    owner: tuple[str, str] | None = None
    for alloc in (await session.execute(query)).scalars().all():
        alloc.state, alloc.released_at = "RELEASED", now
        await session.execute(update(AllocationGpu).where(col(AllocationGpu.allocation_id) == alloc.id).values(live=False))
        await _freed(session, {m["node_id"] for m in alloc.members}, now)
        if owner is None:
            row = (await session.execute(select(col(Job.tenant), col(Job.gpu_type)).where(col(Job.id) == job_id))).one()
            owner = (row[0], row[1])
        await usage.allocation_released(
            session, tenant=owner[0], gpu_type=owner[1], gpus=usage.gpus_of(alloc.members), start=alloc.created_at, end=now
        )
        released.append(alloc.id)
    if released:
        await bump_change_feed(session)
    return released


async def _freed(session: AsyncSession, node_ids: set[str], now: float) -> None:
    """GPUs of these nodes were released at ``now`` (what elastic growth's idle time counts from)."""
    if node_ids:
        await session.execute(update(Node).where(col(Node.id).in_(sorted(node_ids))).values(freed_at=now))


class ResizeRefused(Exception):
    """A resize that cannot be committed: the allocation is no longer the job's live one, or a GPU it adds is taken,
    unhealthy, or on a node that takes no new work."""


async def _check_usable(session: AsyncSession, job_id: str, gpus: Sequence[tuple[str, int]]) -> None:
    """Refuse a resize onto GPUs that went bad or whose node was cordoned, lost or retired since it was decided."""
    node_ids = sorted({node_id for node_id, _ in gpus})
    rows = (await session.execute(select(col(Node.id), col(Node.state)).where(col(Node.id).in_(node_ids)))).all()
    states: dict[str, str] = {row[0]: row[1] for row in rows}
    healthy = {
        (n, i)
        for n, i, ok in (
            await session.execute(select(col(Gpu.node_id), col(Gpu.index), col(Gpu.healthy)).where(col(Gpu.node_id).in_(node_ids)))
        ).all()
        if ok
    }
    for node_id, index in gpus:
        if states.get(node_id) != "READY":
            raise ResizeRefused(f"node {node_id} takes no new work ({states.get(node_id, 'unknown')}): {job_id} is not resized onto it")
        if (node_id, index) not in healthy:
            raise ResizeRefused(f"GPU {node_id}/{index} is not healthy: {job_id} is not resized onto it")


async def begin_resize(
    db: Database, *, job_id: str, attempt: int, allocation_id: str, from_gpus: int, to_gpus: int, reason: str, now: float | None = None
) -> bool:
    """Record that the job's members are stopping to resize (the RESIZING event, once per allocation). True when new."""
    now = time.time() if now is None else now
    async with db.transaction() as session:
        event = new_event(
            job_id,
            attempt,
            "RESIZING",
            f"resizing from {from_gpus} to {to_gpus} GPUs ({reason}): stopping every member",
            f"resizing-{allocation_id}",
            now,
            allocation_id=allocation_id,
            from_gpus=from_gpus,
            to_gpus=to_gpus,
            reason=reason,
        )
        return await add_event_once(session, event)


async def resize_allocation(
    db: Database, *, job_id: str, attempt: int, allocation_id: str, members: Sequence[PlacedMember], reason: str, now: float | None = None
) -> Allocation:
    """Replace the job's live allocation by one holding ``members``, in one transaction (idempotent: the same call
    again returns the allocation it made). The GPUs both hold stay held throughout; those only the old one held are
    released, those only the new one holds are taken (a GPU taken meanwhile refuses the whole resize).

    Raises:
        ResizeRefused: the allocation is not the live one of that job and attempt, or an added GPU is held.
    """
    now = time.time() if now is None else now
    try:
        async with db.transaction() as session:
            done = (await session.execute(select(Allocation).where(col(Allocation.resized_from) == allocation_id))).scalars().first()
            if done is not None:
                return done
            old = await session.get(Allocation, allocation_id)
            if old is None or old.job_id != job_id or old.attempt != attempt or old.state not in LIVE_ALLOCATION_STATES:
                raise ResizeRefused(f"allocation {allocation_id} is not the live allocation of {job_id} attempt {attempt}")
            job = await session.get(Job, job_id)
            assert job is not None
            had = {(m["node_id"], g) for m in old.members for g in m["gpu_indices"]}
            added = sorted({(m.node_id, g) for m in members for g in m.gpu_indices} - had)
            if added:
                await _check_usable(session, job_id, added)
            before = usage.gpus_of(old.members)
            new = Allocation(
                id=new_id("a"),
                job_id=job_id,
                attempt=attempt,
                epoch=old.epoch,
                state="ACKED",
                members=[m.stored() for m in members],
                created_at=now,
                acked_at=now,
                signalled_at=now,
                resized_from=old.id,
            )
            after = usage.gpus_of(new.members)
            old.state, old.released_at = "RELEASED", now
            await session.execute(update(AllocationGpu).where(col(AllocationGpu.allocation_id) == old.id).values(live=False))
            await session.flush()
            session.add(new)
            await session.flush()
            for member in members:
                for index in member.gpu_indices:
                    session.add(AllocationGpu(allocation_id=new.id, node_id=member.node_id, gpu_index=index))
            await session.flush()
            await usage.allocation_released(session, tenant=job.tenant, gpu_type=job.gpu_type, gpus=before, start=old.created_at, end=now)
            await usage.allocation_started(session, tenant=job.tenant, gpu_type=job.gpu_type, gpus=after, start=now)
            kept = {(m.node_id, g) for m in members for g in m.gpu_indices}
            dropped = {m["node_id"] for m in old.members for g in m["gpu_indices"] if (m["node_id"], g) not in kept}
            await _freed(session, dropped, now)
            nodes = ", ".join(map(str, members))
            session.add(
                new_event(
                    job_id,
                    attempt,
                    "RESIZED",
                    f"{'grow' if after > before else 'shrink'} ({reason}): from {before} to {after} GPUs on {nodes}",
                    f"resized-{old.id}",
                    now,
                    allocation_id=new.id,
                    from_gpus=before,
                    to_gpus=after,
                    replaced=old.id,
                    reason=reason,
                )
            )
            await bump_change_feed(session)
            return new
    except IntegrityError as err:
        raise ResizeRefused(f"a GPU the resize of {job_id} adds is held by another allocation: {err.orig}") from err


async def live_allocation_gpus(db: Database) -> Sequence[AllocationGpu]:
    async with db.sessions() as session:
        return (await session.execute(select(AllocationGpu).where(held()))).scalars().all()


async def change_version(db: Database) -> int:
    async with db.sessions() as session:
        row = await session.get(ChangeFeed, 1)
        return row.version if row else 0
