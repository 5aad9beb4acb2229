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
from collections.abc import Sequence

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
    """Per band of predicted remaining wait: the latest outcomes of earlier estimates."""

    def __init__(self, *, window: int = 500, min_samples: int = 20, edges_s: Sequence[float] = BAND_EDGES_S) -> None:
        if window < 1 or min_samples < 1:
            raise ValueError(f"window and min_samples must be at least 1, got {window} and {min_samples}")
        self.edges = tuple(edges_s)
        self.min_samples = min_samples
        #: Band 0 keeps actual remaining waits (seconds); the others actual / predicted remaining wait.
        self._bands: list[deque[float]] = [deque(maxlen=window) for _ in range(len(self.edges) + 1)]
        self._pooled: deque[float] = deque(maxlen=window * len(self.edges))
        self._sorted: dict[int, list[float]] = {}
        self.observed = 0

    def _band(self, predicted_s: float) -> int:
        return bisect.bisect_right(self.edges, predicted_s)

    def observe(self, predicted_s: float, actual_s: float) -> None:
        """An earlier estimate of ``predicted_s`` remaining wait whose job then started ``actual_s`` after it was made."""
        predicted_s, actual_s = max(0.0, predicted_s), max(0.0, actual_s)
        band = self._band(predicted_s)
        if band == 0:
            self._bands[0].append(actual_s)
        else:
            ratio = actual_s / predicted_s
            self._bands[band].append(ratio)
            self._pooled.append(ratio)
            self._sorted.pop(-1, None)
        self._sorted.pop(band, None)
        self.observed += 1

    def _values(self, band: int) -> list[float] | None:
        """The band's sorted samples, the pooled ratios when it has too few, or None."""
        if band not in self._sorted:
            samples = self._bands[band]
            if len(samples) >= self.min_samples:
                self._sorted[band] = sorted(samples)
            elif band > 0 and len(self._pooled) >= self.min_samples:
                if -1 not in self._sorted:
                    self._sorted[-1] = sorted(self._pooled)
                return self._sorted[-1]
            else:
                return None
        return self._sorted[band]

    def interval(self, predicted_s: float, qs: Sequence[float] = QUANTILES) -> tuple[float, ...]:
        """Remaining wait (seconds) at each quantile for a raw estimate of ``predicted_s``, in ``qs`` order (non-decreasing)."""
        predicted_s = max(0.0, predicted_s)
        band = self._band(predicted_s)
        values = self._values(band)
        if values is None:
            return tuple(predicted_s for _ in qs)
        scale = 1.0 if band == 0 else predicted_s  # band 0 keeps waits, the others ratios
        out = [scale * quantile(values, q) for q in qs]
        for i in range(1, len(out)):
            out[i] = max(out[i], out[i - 1])
        return tuple(out)
