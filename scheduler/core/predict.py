"""Learned run times (Tsafrir, Etsion and Feitelson, 2007): a job runs about as long as its owner's last runs.

A job's prediction is the mean of the last ``history`` successful runs of the most specific of its keys
that has any (e.g. ``(tenant, job name)``, then ``(tenant,)``), else its max runtime: the user's limit is
kept apart from the prediction, and is only its cap. Every prediction lies in
``[min(min_runtime_s, max_runtime_s), max_runtime_s]``.

**Correction** once a job outlives its prediction ``p`` (``elapsed_s >= p``): the prediction doubles,
``p, 2p, 4p, ...``, to the first value beyond ``elapsed_s``, capped at the max runtime. This is the
paper's stepped correction with geometric steps: a job that overran a short prediction is soon predicted
to run a long time, and the prediction changes only when a step is crossed (a running job's expected end
moves a few times in its life, not every cycle). It is monotone in ``elapsed_s`` and never below
``elapsed_s`` unless that is past the max runtime (then it is the max runtime).

**Errors**: each observed run first records ``runtime / prediction`` (what would have been predicted just
before it), over a bounded window of the latest ``ratio_window`` runs; their quantiles scale the expected
remaining run time into intervals (``remaining(..., q=0.9)``).

Pure and deterministic; ``predict`` and ``observe`` cost O(``history``), ``quantiles`` sorts the window once after
new observations (then O(1)); memory is bounded by ``history`` runs per key and the ratio window.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

Key = tuple[str, ...]

#: Error ratios are kept at most this large (a run of days predicted at a minute's floor says no more).
MAX_RATIO = 1e6

__all__ = ["Key", "RuntimePredictor"]


class RuntimePredictor:
    """Per-key run-time history, predictions and their error distribution."""

    def __init__(self, *, history: int = 2, min_runtime_s: float = 60.0, ratio_window: int = 2000) -> None:
        if history < 1:
            raise ValueError(f"history must be at least 1, got {history}")
        if ratio_window < 1:
            raise ValueError(f"ratio_window must be at least 1, got {ratio_window}")
        if not min_runtime_s >= 0.0 or math.isinf(min_runtime_s):
            raise ValueError(f"min_runtime_s must be a finite number >= 0, got {min_runtime_s}")
        self.history = history
        self.min_runtime_s = float(min_runtime_s)
        self.ratio_window = ratio_window
        #: Key -> its latest runs (seconds), oldest first, and their sum.
        self._runs: dict[Key, deque[float]] = {}
        self._sums: dict[Key, float] = {}
        #: The latest error ratios (actual / predicted), oldest first.
        self._ratios: deque[float] = deque(maxlen=ratio_window)
        self._sorted: list[float] | None = None
        #: How many runs were observed: a prediction made at one version holds until the next.
        self.version = 0

    def __len__(self) -> int:
        """How many runs were observed."""
        return self.version

    def _base(self, keys: Sequence[Key], max_runtime_s: float) -> float:
        for key in keys:
            runs = self._runs.get(key)
            if runs:
                return self._sums[key] / len(runs)
        return max_runtime_s

    def predict(self, keys: Sequence[Key], max_runtime_s: float, elapsed_s: float = 0.0) -> float:
        """The expected run time (seconds) of a job with these keys (most specific first), ``elapsed_s`` into its run."""
        cap = max(0.0, float(max_runtime_s))
        floor = min(self.min_runtime_s, cap)
        p = min(max(self._base(keys, cap), floor), cap)
        if elapsed_s >= p:
            if elapsed_s >= cap or p <= 0.0:
                return cap
            # The first doubling beyond elapsed: p * 2**k > elapsed_s.
            k = math.floor(math.log2(elapsed_s / p)) + 1
            p = p * 2.0**k
            while p <= elapsed_s:  # rounding of log2
                p *= 2.0
            p = min(p, cap)
        return p

    def observe(self, keys: Sequence[Key], runtime_s: float, max_runtime_s: float) -> None:
        """A finished successful run: records its error against what would have been predicted, then learns it."""
        runtime = max(0.0, float(runtime_s))
        predicted = self.predict(keys, max_runtime_s)
        if predicted > 0.0:
            self._ratios.append(min(runtime / predicted, MAX_RATIO))
            self._sorted = None
        for key in keys:
            runs = self._runs.get(key)
            if runs is None:
                runs = self._runs[key] = deque(maxlen=self.history)
                self._sums[key] = 0.0
            runs.append(runtime)
            self._sums[key] = sum(runs)  # O(history), exact (no drift from adding and subtracting)
        self.version += 1

    def quantiles(self, qs: Sequence[float] = (0.1, 0.5, 0.9)) -> tuple[float, ...]:
        """Quantiles of the observed error ratios (actual / predicted); all 1.0 before any run is observed."""
        for q in qs:
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"quantile must be within [0, 1], got {q}")
        if not self._ratios:
            return tuple(1.0 for _ in qs)
        if self._sorted is None:
            self._sorted = sorted(self._ratios)
        values = self._sorted
        last = len(values) - 1
        out = []
        for q in qs:
            # Linear interpolation between the closest ranks (numpy's default).
            pos = q * last
            low = math.floor(pos)
            high = min(low + 1, last)
            a, b = values[low], values[high]
            # Monotone in q: within a segment by construction, across segments by the clamp to [a, b].
            out.append(min(max(a + (b - a) * (pos - low), a), b))
        return tuple(out)

    def remaining(self, keys: Sequence[Key], max_runtime_s: float, elapsed_s: float, q: float | None = None) -> float:
        """The expected remaining run time; with ``q``, scaled by that quantile of the error ratios,
        never past ``max_runtime_s - elapsed_s`` (nor below 0)."""
        left = max(0.0, max_runtime_s - elapsed_s)
        rest = max(0.0, self.predict(keys, max_runtime_s, elapsed_s) - elapsed_s)
        if q is not None and rest > 0.0:
            rest *= self.quantiles((q,))[0]
        return min(rest, left)
