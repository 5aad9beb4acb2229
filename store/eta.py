"""The queue view's estimates kept and scored (``eta_record``): the live accuracy of the predicted starts.

The API's view worker (``api.eta``) records, while a job waits in its first attempt, its first estimate and at
most one later sample per clock hour (``MAX_SAMPLES`` at most); once the job has started,
:func:`record_starts` copies its first start (``job.started_at``, set once, never reset by a requeue) into its
records. Every write is idempotent: an estimate's key is (job, slot) and a second insert of it is ignored, a start
is filled in only where none is yet, so a retry, a kill -9 between two writes or a second API process's worker
changes nothing already written. Metrics and ``GET /v1/eta-accuracy`` are computed from the scored records.

Scored records are kept for a retention (``FAIRGANG_ETA_RETENTION_S``); :func:`prune_scored` folds older ones into
per-group totals (``eta_error_total``) and deletes them in one transaction, so the table stays bounded while
:func:`error_counts` (the Prometheus counters) still counts every record ever scored, and never goes down.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, and_, case, delete, exists, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import col

from store.db import Database
from store.models import EtaErrorTotal, EtaRecord, Job

#: At most this many later samples a job (its first estimate aside): a day of hourly samples.
MAX_SAMPLES = 24
#: The kinds of record.
FIRST, SAMPLE = "first", "sample"
#: Rows written (or ids looked up) per statement.
CHUNK = 500
#: The absolute-error bounds (seconds) the error counts are bucketed by (the Prometheus histogram's buckets).
ERROR_BOUNDS_S = (60.0, 300.0, 600.0, 1800.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 12 * 3600.0, 24 * 3600.0)


def slot_of(made_at: float) -> int:
    """A later sample's slot: the UNIX hour it was made in (slot 0 is the first estimate)."""
    return max(1, int(made_at // 3600))


@dataclass(frozen=True)
class Estimate:
    """One estimate of a waiting job's start, as the queue view made it (UNIX seconds)."""

    job_id: str
    tenant: str
    gpu_type: str
    gpu_count: int
    size_class: str
    made_at: float
    raw_start: float
    median: float
    low: float
    high: float
    calibrated: bool


@dataclass(frozen=True)
class Scored:
    """A record whose job has started."""

    job_id: str
    slot: int
    kind: str
    gpu_type: str
    size_class: str
    made_at: float
    raw_start: float
    median: float
    low: float
    high: float
    started_at: float
    scored_at: float

    @property
    def error_s(self) -> float:
        """Signed error: predicted (most likely) start minus actual start; positive when it started earlier than said."""
        return self.median - self.started_at


async def recorded_slots(db: Database, job_ids: Collection[str]) -> dict[str, set[int]]:
    """The slots already recorded for these jobs (jobs with none are absent)."""
    out: dict[str, set[int]] = {}
    ids = sorted(job_ids)
    async with db.sessions() as session:
        for i in range(0, len(ids), CHUNK):
            query = select(col(EtaRecord.job_id), col(EtaRecord.slot)).where(col(EtaRecord.job_id).in_(ids[i : i + CHUNK]))
            for job_id, slot in (await session.execute(query)).all():
                out.setdefault(job_id, set()).add(int(slot))
    return out


async def record_estimates(db: Database, estimates: Sequence[tuple[int, Estimate]]) -> int:
    """Insert these (slot, estimate) records, ignoring any whose (job, slot) is already there; how many were new."""
    if not estimates:
        return 0
    dialect = postgresql if not db.sqlite else sqlite
    written = 0
    async with db.transaction() as session:
        for i in range(0, len(estimates), CHUNK):
            rows = [
                {
                    "job_id": e.job_id,
                    "slot": slot,
                    "kind": FIRST if slot == 0 else SAMPLE,
                    "tenant": e.tenant,
                    "gpu_type": e.gpu_type,
                    "gpu_count": e.gpu_count,
                    "size_class": e.size_class,
                    "made_at": e.made_at,
                    "raw_start": e.raw_start,
                    "median": e.median,
                    "low": e.low,
                    "high": e.high,
                    "calibrated": e.calibrated,
                }
                for slot, e in estimates[i : i + CHUNK]
            ]
            insert = dialect.insert(EtaRecord).values(rows).on_conflict_do_nothing(index_elements=["job_id", "slot"])
            written += max(0, cast(CursorResult[Any], await session.execute(insert)).rowcount or 0)
    return written


async def record_starts(db: Database, *, now: float) -> int:
    """Fill in the first start of every record whose job has started since; forget the records of jobs that ended
    without ever starting (nothing to score). How many records were scored."""
    started = select(col(Job.started_at)).where(col(Job.id) == col(EtaRecord.job_id)).scalar_subquery()
    has_started = exists().where(col(Job.id) == col(EtaRecord.job_id), col(Job.started_at).is_not(None))
    never = exists().where(col(Job.id) == col(EtaRecord.job_id), col(Job.started_at).is_(None), col(Job.finished_at).is_not(None))
    async with db.transaction() as session:
        result = await session.execute(
            update(EtaRecord).where(col(EtaRecord.started_at).is_(None), has_started).values(started_at=started, scored_at=now)
        )
        await session.execute(delete(EtaRecord).where(col(EtaRecord.started_at).is_(None), never))
    return max(0, cast(CursorResult[Any], result).rowcount or 0)


def _scored(row: Any) -> Scored:
    return Scored(
        job_id=row.job_id,
        slot=int(row.slot),
        kind=row.kind,
        gpu_type=row.gpu_type,
        size_class=row.size_class,
        made_at=float(row.made_at),
        raw_start=float(row.raw_start),
        median=float(row.median),
        low=float(row.low),
        high=float(row.high),
        started_at=float(row.started_at),
        scored_at=float(row.scored_at if row.scored_at is not None else row.started_at),
    )


_COLUMNS = (
    col(EtaRecord.job_id),
    col(EtaRecord.slot),
    col(EtaRecord.kind),
    col(EtaRecord.gpu_type),
    col(EtaRecord.size_class),
    col(EtaRecord.made_at),
    col(EtaRecord.raw_start),
    col(EtaRecord.median),
    col(EtaRecord.low),
    col(EtaRecord.high),
    col(EtaRecord.started_at),
    col(EtaRecord.scored_at),
)


async def latest_scored(db: Database, *, limit: int) -> list[Scored]:
    """The ``limit`` scored records whose jobs started last, oldest first (by start, job, slot): the calibrator's window."""
    order = (col(EtaRecord.started_at).desc(), col(EtaRecord.job_id).desc(), col(EtaRecord.slot).desc())
    async with db.sessions() as session:
        query = select(*_COLUMNS).where(col(EtaRecord.started_at).is_not(None)).order_by(*order).limit(limit)
        rows = [_scored(r) for r in (await session.execute(query)).all()]
    rows.reverse()
    return rows


async def scored_since(db: Database, *, scored_from: float) -> list[Scored]:
    """The records scored at or after ``scored_from`` (the view worker's incremental read)."""
    async with db.sessions() as session:
        query = select(*_COLUMNS).where(col(EtaRecord.started_at).is_not(None), col(EtaRecord.scored_at) >= scored_from)
        return [_scored(r) for r in (await session.execute(query)).all()]


async def scored_records(db: Database, *, since: float | None = None, limit: int = 200_000) -> list[Scored]:
    """Scored records whose job started at or after ``since`` (every one: None), the latest ``limit`` of them."""
    async with db.sessions() as session:
        query = select(*_COLUMNS).where(col(EtaRecord.started_at).is_not(None))
        if since is not None:
            query = query.where(col(EtaRecord.started_at) >= since)
        query = query.order_by(col(EtaRecord.started_at).desc()).limit(limit)
        return [_scored(r) for r in (await session.execute(query)).all()]


@dataclass(frozen=True)
class ErrorCounts:
    """Scored records of one (GPU type, size class, kind): their absolute errors as a histogram, and two counts."""

    gpu_type: str
    size_class: str
    kind: str
    count: int
    sum_abs_s: float
    #: How many erred by at most each of the given bounds (cumulative, as a histogram's buckets).
    at_most: tuple[int, ...]
    #: How many started within their p10-p90 interval, and how many later than the most likely start.
    covered: int
    late: int


def _bound_key(bound: float) -> str:
    return repr(float(bound))


async def error_counts(db: Database, bounds: Sequence[float] = ERROR_BOUNDS_S) -> list[ErrorCounts]:
    """Every scored record's absolute error (|most likely start - actual start|), counted in SQL by GPU type, size
    class and kind, with the totals folded from pruned records added (a bound they were not counted at adds 0)."""
    error = func.abs(col(EtaRecord.median) - col(EtaRecord.started_at))
    buckets = [func.sum(case((error <= bound, 1), else_=0)) for bound in bounds]
    inside = and_(col(EtaRecord.low) <= col(EtaRecord.started_at), col(EtaRecord.started_at) <= col(EtaRecord.high))
    keys = (col(EtaRecord.gpu_type), col(EtaRecord.size_class), col(EtaRecord.kind))
    async with db.sessions() as session:
        query = (
            select(
                *keys,
                func.count(),
                func.sum(error),
                func.sum(case((inside, 1), else_=0)),
                func.sum(case((col(EtaRecord.started_at) > col(EtaRecord.median), 1), else_=0)),
                *buckets,
            )
            .where(col(EtaRecord.started_at).is_not(None))
            .group_by(*keys)
        )
        rows = (await session.execute(query)).all()
        totals = list((await session.execute(select(EtaErrorTotal))).scalars())
    out = {
        (g, s, k): ErrorCounts(
            gpu_type=g,
            size_class=s,
            kind=k,
            count=int(n),
            sum_abs_s=float(total or 0.0),
            covered=int(c or 0),
            late=int(late or 0),
            at_most=tuple(int(b or 0) for b in rest),
        )
        for g, s, k, n, total, c, late, *rest in rows
    }
    for t in totals:
        key = (t.gpu_type, t.size_class, t.kind)
        live = out.get(key) or ErrorCounts(*key, count=0, sum_abs_s=0.0, at_most=tuple(0 for _ in bounds), covered=0, late=0)
        out[key] = ErrorCounts(
            gpu_type=t.gpu_type,
            size_class=t.size_class,
            kind=t.kind,
            count=live.count + t.count,
            sum_abs_s=live.sum_abs_s + t.sum_abs_s,
            covered=live.covered + t.covered,
            late=live.late + t.late,
            at_most=tuple(n + int(t.at_most.get(_bound_key(b), 0)) for n, b in zip(live.at_most, bounds, strict=True)),
        )
    return [out[key] for key in sorted(out)]


async def prune_scored(db: Database, *, before: float, bounds: Sequence[float] = ERROR_BOUNDS_S) -> int:
    """Fold the scored records whose job started before ``before`` into ``eta_error_total`` and delete them, in
    one transaction; how many were folded. Records are counted by the transaction that deletes them (a second
    pruner waits for the first's row locks and finds them gone), so none is counted twice or lost; a clash of two
    pruners creating the same group's totals fails one of them whole, to be tried again."""
    returned = (
        col(EtaRecord.gpu_type),
        col(EtaRecord.size_class),
        col(EtaRecord.kind),
        col(EtaRecord.median),
        col(EtaRecord.low),
        col(EtaRecord.high),
        col(EtaRecord.started_at),
    )
    async with db.transaction() as session:
        gone = (
            await session.execute(
                delete(EtaRecord).where(col(EtaRecord.started_at).is_not(None), col(EtaRecord.started_at) < before).returning(*returned)
            )
        ).all()
        if not gone:
            return 0
        folded: dict[tuple[str, str, str], list[tuple[float, float, float, float]]] = {}
        for gpu_type, size, kind, median, low, high, started in gone:
            folded.setdefault((gpu_type, size, kind), []).append((float(median), float(low), float(high), float(started)))
        kept = {(t.gpu_type, t.size_class, t.kind): t for t in (await session.execute(select(EtaErrorTotal).with_for_update())).scalars()}
        for key, rows in folded.items():
            total = kept.get(key)
            if total is None:
                total = EtaErrorTotal(
                    gpu_type=key[0], size_class=key[1], kind=key[2], count=0, sum_abs_s=0.0, covered=0, late=0, at_most={}
                )
                session.add(total)
            errors = [abs(median - started) for median, _, _, started in rows]
            total.count += len(rows)
            total.sum_abs_s += sum(errors)
            total.covered += sum(1 for _, low, high, started in rows if low <= started <= high)
            total.late += sum(1 for median, _, _, started in rows if started > median)
            # A new dict, so that the JSON column is seen to change.
            total.at_most = {
                **total.at_most,
                **{_bound_key(b): int(total.at_most.get(_bound_key(b), 0)) + sum(1 for e in errors if e <= b) for b in bounds},
            }
    return len(gone)
