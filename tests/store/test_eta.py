"""The records of the queue's estimates (both backends): idempotent writes, starts filled from the job's row once,
records of jobs that ended unstarted forgotten, the calibrator's window and the error counts in SQL."""

from __future__ import annotations

import asyncio

from sqlalchemy import select
from sqlmodel import col

from store import eta
from store.db import Database
from store.models import EtaRecord, Job
from tests.store.helpers import queued_job


def estimate(job_id: str, made_at: float, median: float, *, raw: float | None = None, gpus: int = 1) -> eta.Estimate:
    return eta.Estimate(
        job_id=job_id,
        tenant="alpha",
        gpu_type="H100-80GB",
        gpu_count=gpus,
        size_class="1" if gpus == 1 else "2-8",
        made_at=made_at,
        raw_start=median if raw is None else raw,
        median=median,
        low=median - 600.0,
        high=median + 600.0,
        calibrated=False,
    )


async def set_job(db: Database, job_id: str, **values: float) -> None:
    async with db.transaction() as session:
        row = await session.get(Job, job_id)
        assert row is not None
        for name, value in values.items():
            setattr(row, name, value)


async def records(db: Database) -> list[EtaRecord]:
    async with db.sessions() as session:
        return list((await session.execute(select(EtaRecord).order_by(col(EtaRecord.job_id), col(EtaRecord.slot)))).scalars())


async def test_a_record_is_written_once_and_scored_once_its_job_starts(seeded: Database) -> None:
    job = await queued_job(seeded, "a")
    first = estimate(job.id, 1000.0, 5000.0)
    later = estimate(job.id, 4700.0, 6000.0)
    assert await eta.record_estimates(seeded, [(0, first), (eta.slot_of(4700.0), later)]) == 2
    # Again (a retry, another API process's worker, a restart): nothing changes, not even a different estimate.
    assert await eta.record_estimates(seeded, [(0, estimate(job.id, 1100.0, 9999.0))]) == 0
    assert await eta.recorded_slots(seeded, [job.id, "j-none"]) == {job.id: {0, 1}}
    assert [(r.slot, r.kind, r.median) for r in await records(seeded)] == [(0, "first", 5000.0), (1, "sample", 6000.0)]
    assert await eta.record_starts(seeded, now=5000.0) == 0  # not started yet
    await set_job(seeded, job.id, started_at=5600.0)
    assert await eta.record_starts(seeded, now=5700.0) == 2
    await set_job(seeded, job.id, started_at=9000.0)  # (never happens: started_at is the first start) kept as scored
    assert await eta.record_starts(seeded, now=9100.0) == 0
    assert [(r.started_at, r.scored_at) for r in await records(seeded)] == [(5600.0, 5700.0), (5600.0, 5700.0)]
    scored = await eta.latest_scored(seeded, limit=10)
    assert [(s.slot, s.error_s) for s in scored] == [(0, -600.0), (1, 400.0)]
    assert await eta.scored_since(seeded, scored_from=5800.0) == []
    assert len(await eta.scored_since(seeded, scored_from=5700.0)) == 2
    assert await eta.scored_records(seeded, since=5601.0) == []


async def test_the_records_of_a_job_that_ended_without_starting_are_forgotten(seeded: Database) -> None:
    gone, waiting = await queued_job(seeded, "gone"), await queued_job(seeded, "waiting")
    await eta.record_estimates(seeded, [(0, estimate(gone.id, 1000.0, 2000.0)), (0, estimate(waiting.id, 1000.0, 2000.0))])
    await set_job(seeded, gone.id, finished_at=1500.0)
    assert await eta.record_starts(seeded, now=1600.0) == 0
    assert [r.job_id for r in await records(seeded)] == [waiting.id]


async def test_the_window_is_the_latest_starts_and_errors_are_counted_by_group(seeded: Database) -> None:
    ids = [(await queued_job(seeded, f"j{i}")).id for i in range(4)]
    # Errors (median - start): -100, +700, +4000 (1 GPU), and -2000 for a 4-GPU job.
    cases = [(ids[0], 2000.0, 2100.0, 1), (ids[1], 3000.0, 2300.0, 1), (ids[2], 9000.0, 5000.0, 1), (ids[3], 1000.0, 3000.0, 4)]
    for job_id, median, start, gpus in cases:
        await eta.record_estimates(seeded, [(0, estimate(job_id, 100.0, median, gpus=gpus))])
        await set_job(seeded, job_id, started_at=start)
    await eta.record_starts(seeded, now=6000.0)
    assert [r.job_id for r in await eta.latest_scored(seeded, limit=2)] == [ids[3], ids[2]]  # oldest first
    counts = {c.size_class: c for c in await eta.error_counts(seeded, (600.0, 3600.0))}
    one = counts["1"]
    assert (one.gpu_type, one.kind, one.count, one.sum_abs_s, one.at_most) == ("H100-80GB", "first", 3, 4800.0, (1, 2))
    assert (one.covered, one.late) == (1, 1)  # within +-600: only the first; started later than said: only the first
    assert (counts["2-8"].count, counts["2-8"].at_most, counts["2-8"].late) == (1, (0, 1), 1)


async def test_records_past_the_retention_are_folded_into_totals_and_the_counts_never_change(seeded: Database) -> None:
    ids = [(await queued_job(seeded, f"j{i}")).id for i in range(5)]
    # (median, start, GPUs): two old 1-GPU records, an old 4-GPU one, a recent 1-GPU one, and one still waiting.
    cases = [(ids[0], 2000.0, 2100.0, 1), (ids[1], 9000.0, 5000.0, 1), (ids[2], 1000.0, 3000.0, 4), (ids[3], 9000.0, 8000.0, 1)]
    for job_id, median, start, gpus in cases:
        await eta.record_estimates(seeded, [(0, estimate(job_id, 100.0, median, gpus=gpus))])
        await set_job(seeded, job_id, started_at=start)
    await eta.record_estimates(seeded, [(0, estimate(ids[4], 100.0, 9500.0))])
    await eta.record_starts(seeded, now=8500.0)
    bounds = (600.0, 3600.0)
    before = await eta.error_counts(seeded, bounds)
    assert await eta.prune_scored(seeded, before=6000.0, bounds=bounds) == 3
    assert sorted(r.job_id for r in await records(seeded)) == sorted([ids[3], ids[4]])  # the recent one, the waiting one
    assert [r.job_id for r in await eta.latest_scored(seeded, limit=10)] == [ids[3]]
    assert await eta.error_counts(seeded, bounds) == before  # the metrics' counters are the same
    # Again: nothing left to fold, and nothing is counted twice.
    assert await eta.prune_scored(seeded, before=6000.0, bounds=bounds) == 0
    assert await eta.error_counts(seeded, bounds) == before
    # Folding into existing totals adds up: the recent record now goes too.
    assert await eta.prune_scored(seeded, before=9000.0, bounds=bounds) == 1
    assert await eta.error_counts(seeded, bounds) == before
    counts = {c.size_class: c for c in await eta.error_counts(seeded, bounds)}
    assert (counts["1"].count, counts["1"].sum_abs_s, counts["1"].at_most, counts["1"].covered, counts["1"].late) == (
        3,
        100.0 + 4000.0 + 1000.0,
        (1, 2),
        1,
        1,
    )


async def test_two_pruners_at_once_count_each_record_once(seeded: Database) -> None:
    ids = [(await queued_job(seeded, f"j{i}")).id for i in range(6)]
    for i, job_id in enumerate(ids):
        await eta.record_estimates(seeded, [(0, estimate(job_id, 100.0, 2000.0 + 300.0 * i, gpus=1 + i % 2 * 3))])
        await set_job(seeded, job_id, started_at=2500.0)
    await eta.record_starts(seeded, now=3000.0)
    before = await eta.error_counts(seeded)
    folded = await asyncio.gather(*(eta.prune_scored(seeded, before=6000.0) for _ in range(3)), return_exceptions=True)
    assert sum(n for n in folded if isinstance(n, int)) == 6  # a pruner that clashed (if any) folded nothing
    assert await records(seeded) == []
    assert await eta.error_counts(seeded) == before
