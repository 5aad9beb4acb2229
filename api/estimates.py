"""The queue view's estimates, calibrated and scored live (issue 14, points 4 and 5).

The view worker (``api.views``) that computes the queue view keeps an :class:`EtaKeeper`: before each forward
simulation it fills in the starts of the jobs whose estimates were recorded (``store.eta.record_starts``), reads
the records scored since its last read (incrementally: a window of the latest ``WINDOW_RECORDS`` kept in memory)
and rebuilds the :class:`simulator.calibrate.WaitCalibrator` from them when they changed; the queue view
calibrates each raw forward-simulated start with it (``api.insight.estimate_queue``). After the simulation it
records each waiting job's first estimate and at most one sample per clock hour (``store.eta``). The calibrator
is a function of the latest scored records alone (ordered by start, job and slot), so the what-if
(:func:`calibrator_from_store`) calibrates exactly as the queue view does.

``GET /v1/eta-accuracy`` (``api.eta``) scores the records by GPU type and size class (:func:`accuracy`).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from simulator.calibrate import WaitCalibrator, quantile
from simulator.workload import size_class
from store import eta as stored
from store.db import Database

log = logging.getLogger("fairgang.api.estimates")

#: The calibrator learns from the latest this many scored records (by their jobs' start).
WINDOW_RECORDS = 5000
#: The calibrator's settings, as the simulator's estimator probe's: the latest 500 outcomes a band, and a band
#: (or the pool it borrows from) is used from 20 samples on.
CALIBRATOR_WINDOW = 500
CALIBRATOR_MIN_SAMPLES = 20
#: Records scored up to this long before the newest one read are read again (a write may commit late).
REREAD_S = 60.0
#: The view worker prunes the scored records past the retention at most this often (seconds).
PRUNE_EVERY_S = 3600.0
#: Thresholds of the shares reported (seconds).
WITHIN_S = (600.0, 3600.0)

Key = tuple[str, int]


def _order(record: stored.Scored) -> tuple[float, str, int]:
    return record.started_at, record.job_id, record.slot


def calibrator_of(records: Iterable[stored.Scored]) -> WaitCalibrator:
    """The calibrator fed with these scored records, in order of start (then job, slot): predicted remaining wait
    = raw start - made at, actual = start - made at, grouped by size class."""
    calibrator = WaitCalibrator(window=CALIBRATOR_WINDOW, min_samples=CALIBRATOR_MIN_SAMPLES)
    for r in sorted(records, key=_order):
        calibrator.observe(r.raw_start - r.made_at, r.started_at - r.made_at, r.size_class)
    return calibrator


async def calibrator_from_store(db: Database) -> WaitCalibrator:
    """The calibrator the queue view uses, read whole from the store (the what-if's)."""
    return calibrator_of(await stored.latest_scored(db, limit=WINDOW_RECORDS))


class EtaKeeper:
    """The view worker's records of estimates and its calibrator, kept between queue views."""

    def __init__(self, *, retention_s: float = 30 * 86400.0) -> None:
        self.records: dict[Key, stored.Scored] = {}
        self.calibrator = calibrator_of(())
        self._newest: float | None = None
        #: Scored records of jobs that started longer ago than this are folded into the totals and deleted.
        self.retention_s = retention_s
        self._pruned_at = -math.inf
        #: Waiting job -> the slots already recorded for it (jobs that left the queue are forgotten).
        self.slots: dict[str, set[int]] = {}

    async def refresh(self, db: Database, now: float) -> WaitCalibrator:
        """Score what started since, read what was scored since the last read, and the calibrator of the window;
        at most every ``PRUNE_EVERY_S``, first prune the records past the retention (the window forgets them too,
        so that it stays what the store holds)."""
        await stored.record_starts(db, now=now)
        if now - self._pruned_at >= PRUNE_EVERY_S:
            before = now - self.retention_s
            try:
                pruned = await stored.prune_scored(db, before=before)
            except Exception:  # a clash with another API process's worker: tried again at the next view
                log.warning("views: cannot prune the estimates' records", exc_info=True)
            else:
                self._pruned_at = now
                old = [key for key, r in self.records.items() if r.started_at < before]
                for key in old:
                    del self.records[key]
                if old:
                    self.calibrator = calibrator_of(self.records.values())
                if pruned:
                    log.info("views: %d scored estimates past the retention folded into the totals", pruned)
        if self._newest is None:
            rows = await stored.latest_scored(db, limit=WINDOW_RECORDS)
        else:
            rows = await stored.scored_since(db, scored_from=self._newest - REREAD_S)
        new = [r for r in rows if (r.job_id, r.slot) not in self.records]
        if rows:
            self._newest = max(self._newest or -math.inf, max(r.scored_at for r in rows))
        elif self._newest is None:
            self._newest = now
        if new:
            for r in new:
                self.records[(r.job_id, r.slot)] = r
            if len(self.records) > WINDOW_RECORDS:
                kept = sorted(self.records.values(), key=_order)[-WINDOW_RECORDS:]
                self.records = {(r.job_id, r.slot): r for r in kept}
            self.calibrator = calibrator_of(self.records.values())
        return self.calibrator

    async def record(self, db: Database, waiting: Sequence[Any], view: Any, now: float) -> int:
        """Record the queue view's estimates of waiting jobs in their first attempt: a job's first, then one sample a
        clock hour (``store.eta.MAX_SAMPLES`` at most). ``waiting``: the snapshot's pending jobs; ``view``: the
        ``insight.QueueView``. How many records were written."""
        jobs = {j.id: j for j in waiting if j.attempt == 1}
        unknown = [job_id for job_id in jobs if job_id not in self.slots]
        if unknown:
            found = await stored.recorded_slots(db, unknown)
            for job_id in unknown:
                self.slots[job_id] = found.get(job_id, set())
        for job_id in [j for j in self.slots if j not in jobs]:
            del self.slots[job_id]
        rows: list[tuple[int, stored.Estimate]] = []
        for job_id, job in jobs.items():
            median, raw = view.estimated_start.get(job_id), view.raw_start.get(job_id)
            if median is None or raw is None:
                continue
            slots = self.slots[job_id]
            slot = 0 if 0 not in slots else stored.slot_of(now)
            if slot in slots or len(slots) > stored.MAX_SAMPLES:
                continue
            rows.append(
                (
                    slot,
                    stored.Estimate(
                        job_id=job_id,
                        tenant=job.tenant,
                        gpu_type=job.gpu_type,
                        gpu_count=job.gpu_count,
                        size_class=size_class(job.gpu_count),
                        made_at=now,
                        raw_start=raw,
                        median=median,
                        low=min(view.estimated_start_low.get(job_id, median), median),
                        high=max(view.estimated_start_high.get(job_id, median), median),
                        calibrated=job_id in view.calibrated,
                    ),
                )
            )
        written = await stored.record_estimates(db, rows)
        for slot, e in rows:
            self.slots[e.job_id].add(slot)
            if slot == 0:
                self.slots[e.job_id].add(stored.slot_of(now))  # no later sample in the first one's hour
        return written


# ---------------------------------------------------------------- accuracy


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def score(records: Sequence[stored.Scored]) -> dict[str, Any]:
    """How a group of scored records fared (errors in seconds; signed = most likely start - actual start, positive:
    the job started earlier than said)."""
    errors = [r.error_s for r in records]
    absolute = sorted(abs(e) for e in errors)
    n = len(records)
    return {
        "scored": n,
        "median_abs_error_s": _median(absolute) if n else None,
        "median_signed_error_s": _median(errors) if n else None,
        "p90_abs_error_s": quantile(absolute, 0.9) if n else None,
        "coverage": sum(1 for r in records if r.low <= r.started_at <= r.high) / n if n else None,
        "within_10min": sum(1 for e in absolute if e <= WITHIN_S[0]) / n if n else None,
        "within_1h": sum(1 for e in absolute if e <= WITHIN_S[1]) / n if n else None,
    }


def accuracy(records: Sequence[stored.Scored]) -> list[dict[str, Any]]:
    """Per GPU type and size class (by name), then every record together (``*``, ``*``)."""
    groups: dict[tuple[str, str], list[stored.Scored]] = {}
    for r in records:
        groups.setdefault((r.gpu_type, r.size_class), []).append(r)
    rows = [{"gpu_type": g, "size_class": s, **score(groups[(g, s)])} for g, s in sorted(groups)]
    rows.append({"gpu_type": "*", "size_class": "*", **score(records)})
    return rows
