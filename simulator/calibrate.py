"""Honest start intervals: forward-simulated estimates calibrated by how earlier estimates turned out.

The forward simulation (:mod:`simulator.estimate`) predicts when a waiting job starts from the
queue as it is, with learned run times; it cannot know the jobs that will arrive meanwhile
(a fairer tenant's job, a higher priority) nor which run times will be off. Like QBETS
(Nurmi, Brevik and Wolski), the calibrator does not model those: it keeps, for earlier
estimates whose jobs have started since, the ratio of the actual remaining wait to the
predicted one, per band of predicted remaining wait, and turns a new raw estimate into

    low, median, high = now + predicted x (p10, p50, p90 of the band's ratios)

so the median is corrected for the estimator's bias and the interval holds the actual start as
often as its quantiles say, as long as the queue behaves as it did (the window forgets the old).
A raw estimate of (nearly) now has no useful ratio: its band keeps the actual remaining waits
themselves (additive). Bands with too few samples borrow from all bands together; with none at
all the raw estimate is given as it is (low = median = high).

Pure and deterministic; the simulator feeds it from its own past (no peeking at the future) and
the live API from the store's records of estimates and starts.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from scheduler.core.types import PendingJob
from simulator.workload import size_class

#: Upper edges (seconds of predicted remaining wait) of the bands; the last band is open.
BAND_EDGES_S: tuple[float, ...] = (60.0, 1800.0, 3 * 3600.0, 12 * 3600.0)
#: The quantiles of an interval: low, median, high.
QUANTILES: tuple[float, float, float] = (0.1, 0.5, 0.9)


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted ``values`` (numpy's default rule)."""
    pos = q * (len(values) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(values) - 1)
    return values[low] * (1.0 - (pos - low)) + values[high] * (pos - low)


class WaitCalibrator:
    """Per group (e.g. the job's size class) and band of predicted remaining wait: the latest outcomes of earlier estimates.

    A band with too few samples of its own borrows the group's ratios (all its bands together), then
    every group's; with none at all, the raw estimate stands.
    """

    def __init__(self, *, window: int = 500, min_samples: int = 20, edges_s: Sequence[float] = BAND_EDGES_S) -> None:
        if window < 1 or min_samples < 1:
            raise ValueError(f"window and min_samples must be at least 1, got {window} and {min_samples}")
        self.edges = tuple(edges_s)
        self.window = window
        self.min_samples = min_samples
        #: (group, band) -> samples: band 0 keeps actual remaining waits (seconds), the others actual / predicted.
        self._bands: dict[tuple[str, int], deque[float]] = {}
        #: Ratios of every band but 0, per group ("" for every group together).
        self._pooled: dict[str, deque[float]] = {}
        self._sorted: dict[tuple[str, int], list[float]] = {}
        self.observed = 0

    def _band(self, predicted_s: float) -> int:
        return bisect.bisect_right(self.edges, predicted_s)

    def _keep(self, key: tuple[str, int], value: float) -> None:
        samples = self._bands.get(key)
        if samples is None:
            samples = self._bands[key] = deque(maxlen=self.window)
        samples.append(value)
        self._sorted.pop(key, None)

    def observe(self, predicted_s: float, actual_s: float, group: str = "") -> None:
        """An earlier estimate of ``predicted_s`` remaining wait whose job then started ``actual_s`` after it was made."""
        predicted_s, actual_s = max(0.0, predicted_s), max(0.0, actual_s)
        band = self._band(predicted_s)
        if band == 0:
            for pool in {group, ""}:
                self._keep((pool, 0), actual_s)
        else:
            ratio = actual_s / predicted_s
            self._keep((group, band), ratio)
            for pool in {group, ""}:
                samples = self._pooled.get(pool)
                if samples is None:
                    samples = self._pooled[pool] = deque(maxlen=self.window * (len(self.edges) + 1))
                samples.append(ratio)
                self._sorted.pop((pool, -1), None)
        self.observed += 1

    def _sorted_of(self, key: tuple[str, int]) -> list[float] | None:
        cached = self._sorted.get(key)
        if cached is None:
            samples = self._bands.get(key) if key[1] >= 0 else self._pooled.get(key[0])
            if samples is None or len(samples) < self.min_samples:
                return None
            cached = self._sorted[key] = sorted(samples)
        return cached

    def _keys(self, predicted_s: float, group: str) -> tuple[int, list[tuple[str, int]]]:
        band = self._band(max(0.0, predicted_s))
        return band, ([(group, 0), ("", 0)] if band == 0 else [(group, band), (group, -1), ("", -1)])

    def calibrates(self, predicted_s: float, group: str = "") -> bool:
        """Whether :meth:`interval` has samples enough for this estimate (its band's, else those it borrows);
        if not, it gives the raw estimate as it is."""
        return any(self._sorted_of(key) is not None for key in self._keys(predicted_s, group)[1])

    def interval(self, predicted_s: float, group: str = "", qs: Sequence[float] = QUANTILES) -> tuple[float, ...]:
        """Remaining wait (seconds) at each quantile for a raw estimate of ``predicted_s``, in ``qs`` order (non-decreasing)."""
        predicted_s = max(0.0, predicted_s)
        band, keys = self._keys(predicted_s, group)
        values = next((v for v in map(self._sorted_of, keys) if v is not None), None)
        if values is None:
            return tuple(predicted_s for _ in qs)
        scale = 1.0 if band == 0 else predicted_s  # band 0 keeps waits, the others ratios
        out = [scale * quantile(values, q) for q in qs]
        for i in range(1, len(out)):
            out[i] = max(out[i], out[i - 1])
        return tuple(out)


def calibrated_start(calibrator: WaitCalibrator, raw_start: float, now: float, group: str) -> tuple[float, float, float] | None:
    """(low, median, high) start, UNIX seconds, from a raw forward-simulated start made at ``now``: its remaining wait
    calibrated; None while the calibrator has too few samples for its band (:meth:`WaitCalibrator.calibrates`)."""
    wait = max(raw_start, now) - now
    if not calibrator.calibrates(wait, group):
        return None
    low, median, high = calibrator.interval(wait, group)
    return now + low, now + median, now + high


def calibrate_starts(
    pending: Iterable[PendingJob], raw: Mapping[str, float], now: float, calibrator: WaitCalibrator | None
) -> tuple[dict[str, tuple[float, float, float]], list[str]]:
    """Each waiting job's calibrated (low, median, high) start from its raw forward-simulated one, grouped by its
    size class; and, in ``pending`` order, the jobs left for a cold-start fallback (no raw start, no calibrator, or
    too few samples for the job's band)."""
    done: dict[str, tuple[float, float, float]] = {}
    rest: list[str] = []
    for job in pending:
        start = raw.get(job.id)
        got = None
        if start is not None and calibrator is not None:
            got = calibrated_start(calibrator, start, now, size_class(job.gpu_count))
        if got is None:
            rest.append(job.id)
        else:
            done[job.id] = got
    return done, rest
