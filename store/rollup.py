"""The fleet rollup: one sample of the fleet per time bucket, for the dashboard's charts over the last 24 hours.

The placement service's leader calls :func:`record_rollup` from its cycles; each call writes the current
bucket's row unless it exists (insert-or-ignore on the bucket, so a leader that changes within a bucket, or a
cycle that runs twice in one, writes nothing more) and prunes the rows older than the retention. The figures
are counted in SQL, except the wait percentiles, taken (nearest rank) over the waits of the jobs that started
in the bucket before the sample's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np
from sqlalchemy import CursorResult, case, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import col

from fairgang.liveness import RETIRED
from fairgang.spec import JobState
from store.common import held
from store.db import Database
from store.models import AllocationGpu, FleetRollup, Gpu, Job, Node

#: The default bucket (a minute) and how long rows are kept (8 days: the charts show 24 hours).
BUCKET_S = 60.0
RETENTION_S = 8 * 86400.0
#: The wait percentiles each row keeps.
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class RollupRow:
    """A row of the rollup as the API serves it."""

    bucket: int
    span_s: float
    at: float
    gpus_total: int
    gpus_allocated: int
    gpus_unhealthy: int
    #: gpus_allocated / gpus_total, in percent (0 for an empty fleet).
    utilisation_pct: float
    queue_length: int
    jobs_started: int
    wait_p50_s: float | None
    wait_p90_s: float | None
    wait_p99_s: float | None

    @classmethod
    def of(cls, row: FleetRollup) -> RollupRow:
        pct = round(100.0 * row.gpus_allocated / row.gpus_total, 2) if row.gpus_total else 0.0
        return cls(
            bucket=row.bucket,
            span_s=row.span_s,
            at=row.at,
            gpus_total=row.gpus_total,
            gpus_allocated=row.gpus_allocated,
            gpus_unhealthy=row.gpus_unhealthy,
            utilisation_pct=pct,
            queue_length=row.queue_length,
            jobs_started=row.jobs_started,
            wait_p50_s=row.wait_p50_s,
            wait_p90_s=row.wait_p90_s,
            wait_p99_s=row.wait_p99_s,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bucket_of(now: float, span_s: float) -> int:
    """The start of the bucket ``now`` falls in."""
    return int(now // span_s * span_s)


def wait_percentiles(waits: Sequence[float]) -> tuple[float | None, ...]:
    """The waits' 50th, 90th and 99th percentiles by nearest rank (each one of the waits); Nones for no waits."""
    if not waits:
        return tuple(None for _ in PERCENTILES)
    values = np.percentile(np.asarray(waits, dtype=float), PERCENTILES, method="inverted_cdf")
    return tuple(round(float(v), 3) for v in values)


async def record_rollup(db: Database, *, now: float, span_s: float = BUCKET_S, retention_s: float = RETENTION_S) -> bool:
    """Write the sample of ``now``'s bucket unless it is written already; prune rows past the retention.

    Returns whether this call wrote the row.
    """
    bucket = bucket_of(now, span_s)
    async with db.transaction() as session:
        if (await session.execute(select(col(FleetRollup.bucket)).where(col(FleetRollup.bucket) == bucket))).first() is not None:
            return False
        fleet = (
            select(func.count(), func.sum(case((col(Gpu.healthy) == False, 1), else_=0)))  # noqa: E712
            .select_from(Gpu)
            .join(Node, col(Node.id) == col(Gpu.node_id))
            .where(col(Node.state) != RETIRED)
        )
        gpus_total, gpus_unhealthy = (await session.execute(fleet)).one()
        allocated = select(func.count()).select_from(AllocationGpu).where(held())
        gpus_allocated = (await session.execute(allocated)).scalar_one()
        queued = select(func.count()).select_from(Job).where(col(Job.state) == JobState.QUEUED.value)
        queue_length = (await session.execute(queued)).scalar_one()
        started = select(col(Job.started_at) - col(Job.queued_at)).where(
            col(Job.started_at) >= bucket - span_s, col(Job.started_at) < bucket, col(Job.started_at) >= col(Job.queued_at)
        )
        waits = [float(w) for (w,) in (await session.execute(started)).all()]
        p50, p90, p99 = wait_percentiles(waits)
        values = {
            "bucket": bucket,
            "span_s": span_s,
            "at": now,
            "gpus_total": int(gpus_total),
            "gpus_allocated": int(gpus_allocated),
            "gpus_unhealthy": int(gpus_unhealthy or 0),
            "queue_length": int(queue_length),
            "jobs_started": len(waits),
            "wait_p50_s": p50,
            "wait_p90_s": p90,
            "wait_p99_s": p99,
        }
        dialect = postgresql if not db.sqlite else sqlite
        insert = dialect.insert(FleetRollup).values(**values).on_conflict_do_nothing(index_elements=["bucket"])
        written = cast(CursorResult[Any], await session.execute(insert)).rowcount == 1
        await session.execute(delete(FleetRollup).where(col(FleetRollup.bucket) < now - retention_s))
    return written


async def rollup_rows(db: Database, *, since: float, until: float) -> list[RollupRow]:
    """The rows whose bucket starts in [``since``, ``until``), oldest first."""
    async with db.sessions() as session:
        query = (
            select(FleetRollup).where(col(FleetRollup.bucket) >= since, col(FleetRollup.bucket) < until).order_by(col(FleetRollup.bucket))
        )
        return [RollupRow.of(r) for r in (await session.execute(query)).scalars().all()]
