"""Small steps the store tests share: a queued job, a binding committed under the lease."""

from __future__ import annotations

from fairgang.members import PlacedMember
from store import jobs, placement
from store.db import Database
from store.models import Allocation, Job
from tests.builders import job_spec


async def bind(db: Database, job_id: str, members: list[PlacedMember], epoch: int, now: float | None = None) -> list[Allocation]:
    return await placement.commit_bindings(
        db,
        bindings=[placement.BindingRow(job_id=job_id, attempt=1, members=members)],
        pending_reasons={},
        lease_name="placement",
        epoch=epoch,
        now=now,
    )


async def queued_job(db: Database, name: str, tenant: str = "alpha") -> Job:
    job, created = await jobs.create_job(db, spec=job_spec(name=name), tenant=tenant)
    assert created
    await jobs.mark_queued(db, job_id=job.id, attempt=1)
    return job
