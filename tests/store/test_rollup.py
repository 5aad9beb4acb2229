"""The fleet rollup: each bucket's figures from a fleet and a queue whose values are known, written once, pruned."""

from __future__ import annotations

from sqlalchemy import update
from sqlmodel import col

from fairgang.members import PlacedMember
from store import health, nodes, placement, rollup
from store.db import Database
from store.models import Job
from tests.store.helpers import bind, queued_job

SPAN = 60.0
BUCKET = 600_000  # a multiple of SPAN


async def _started(db: Database, name: str, *, queued_at: float, started_at: float) -> Job:
    """A job whose current attempt was queued and started at these times."""
    job = await queued_job(db, name)
    async with db.transaction() as session:
        await session.execute(update(Job).where(col(Job.id) == job.id).values(state="RUNNING", queued_at=queued_at, started_at=started_at))
    return job


async def _scenario(db: Database) -> None:
    """16 GPUs in the fleet (g1 retired), one unhealthy, 3 held; two jobs queued; five started at known times."""
    for node_id, gpu_type, count in (("h1", "H100-80GB", 8), ("h2", "H100-80GB", 8), ("g1", "L40S", 4)):
        await nodes.register_node(db, node_id=node_id, gpu_type=gpu_type, gpu_count=count, labels={}, boot_id="b", gpus=[])
    assert await nodes.retire_node(db, node_id="g1") is not None
    await health.set_gpu_health(db, node_id="h2", index=5, healthy=False)
    held = await queued_job(db, "held-three")
    epoch = await placement.acquire_lease(db, name="placement", holder="t", ttl_s=600)
    assert epoch is not None
    await bind(db, held.id, [PlacedMember(node_id="h1", gpu_indices=[0, 1, 2], rank=0)], epoch)
    await queued_job(db, "waiting-1")
    await queued_job(db, "waiting-2")
    # Started in the bucket before BUCKET, [BUCKET - 60, BUCKET): waits 10, 20, 30 and 100 s.
    for i, (wait, at) in enumerate(((10, 5), (20, 15), (30, 30), (100, 59.5))):
        start = BUCKET - SPAN + at
        await _started(db, f"before-{i}", queued_at=start - wait, started_at=start)
    # Outside that window: one two buckets back, one in BUCKET itself (wait 7 s).
    await _started(db, "long-ago", queued_at=BUCKET - 200, started_at=BUCKET - SPAN - 1)
    await _started(db, "this-bucket", queued_at=BUCKET + 3, started_at=BUCKET + 10)


async def test_a_rollup_row_counts_the_fleet_the_queue_and_the_waits_of_the_bucket_before(seeded: Database) -> None:
    await _scenario(seeded)
    assert await rollup.record_rollup(seeded, now=BUCKET + 30, span_s=SPAN)
    [row] = await rollup.rollup_rows(seeded, since=0, until=BUCKET + SPAN)
    assert (row.bucket, row.span_s, row.at) == (BUCKET, SPAN, BUCKET + 30)
    assert (row.gpus_total, row.gpus_allocated, row.gpus_unhealthy) == (16, 3, 1)
    assert row.utilisation_pct == 18.75  # 3 of 16
    # "held-three" was bound (PLACED), the two others wait.
    assert row.queue_length == 2
    # Nearest rank over 10, 20, 30, 100: the 2nd, the 4th and the 4th value.
    assert (row.jobs_started, row.wait_p50_s, row.wait_p90_s, row.wait_p99_s) == (4, 20.0, 100.0, 100.0)


async def test_a_bucket_is_written_once_and_the_next_one_counts_its_own_window(seeded: Database) -> None:
    await _scenario(seeded)
    assert await rollup.record_rollup(seeded, now=BUCKET + 30, span_s=SPAN)
    # Later in the same bucket (another cycle, or a new leader): nothing more is written, the first row stays.
    assert not await rollup.record_rollup(seeded, now=BUCKET + 50, span_s=SPAN)
    assert [r.at for r in await rollup.rollup_rows(seeded, since=0, until=BUCKET + SPAN)] == [BUCKET + 30]
    assert await rollup.record_rollup(seeded, now=BUCKET + SPAN + 2, span_s=SPAN)
    first, second = await rollup.rollup_rows(seeded, since=0, until=BUCKET + 10 * SPAN)
    assert (first.bucket, second.bucket) == (BUCKET, BUCKET + SPAN)
    assert (second.jobs_started, second.wait_p50_s, second.wait_p99_s) == (1, 7.0, 7.0)
    # A bucket in which no job started has no percentiles.
    assert await rollup.record_rollup(seeded, now=BUCKET + 2 * SPAN + 1, span_s=SPAN)
    third = (await rollup.rollup_rows(seeded, since=BUCKET + 2 * SPAN, until=BUCKET + 3 * SPAN))[0]
    assert (third.jobs_started, third.wait_p50_s, third.wait_p90_s, third.wait_p99_s) == (0, None, None, None)


async def test_rows_older_than_the_retention_are_pruned(seeded: Database) -> None:
    for k in range(3):
        assert await rollup.record_rollup(seeded, now=BUCKET + k * SPAN, span_s=SPAN, retention_s=3600)
    assert len(await rollup.rollup_rows(seeded, since=0, until=BUCKET + 10_000)) == 3
    # An hour and a minute after the second bucket: the first two are past the retention.
    later = BUCKET + SPAN + 3600 + 1
    assert await rollup.record_rollup(seeded, now=later, span_s=SPAN, retention_s=3600)
    assert [r.bucket for r in await rollup.rollup_rows(seeded, since=0, until=later + SPAN)] == [
        BUCKET + 2 * SPAN,
        rollup.bucket_of(later, SPAN),
    ]


def test_percentiles_are_nearest_rank() -> None:
    assert rollup.wait_percentiles([]) == (None, None, None)
    assert rollup.wait_percentiles([5.0]) == (5.0, 5.0, 5.0)
    assert rollup.wait_percentiles([float(i) for i in range(1, 101)]) == (50.0, 90.0, 99.0)
