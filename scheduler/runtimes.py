"""Learned run times from the store: its successful runs fed, oldest first, to one :class:`RuntimePredictor`.

The one path from the store to the predictor, used by the placement service's :class:`SnapshotReader` and
by the API's views (which read snapshots through a reader of their own): every waiting job's
``expected_runtime_s`` and every running job's ``expected_end`` come from here. A job's keys are
``(tenant, job name)``, then ``(tenant,)``.

Kept across reads: the first refresh reads the latest ``INITIAL_RUNS`` successful runs, every later one only
the runs whose SUCCEEDED event is newer than the last read (by the event's primary key), and at most once
every ``refresh_s`` seconds, so a scheduling cycle pays for history only when there is new history.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.core.predict import Key, RuntimePredictor
from store import observability
from store.db import Database

#: How many of the latest successful runs a fresh predictor learns from.
INITIAL_RUNS = 5000
#: How often (seconds of the caller's clock) a kept predictor reads the runs that ended since.
REFRESH_S = 10.0
#: Event ids below the newest read that are read again (and skipped when seen): on PostgreSQL an event may
#: commit after one with a higher id, and would otherwise be missed.
REREAD_EVENTS = 256


def runtime_keys(tenant: str, name: str) -> tuple[Key, Key]:
    """A job's predictor keys, most specific first."""
    return (tenant, name), (tenant,)


class LearnedRuntimes:
    """A predictor kept up to date from the store's successful runs (see the module docstring)."""

    def __init__(
        self, *, refresh_s: float = REFRESH_S, initial_runs: int = INITIAL_RUNS, predictor: RuntimePredictor | None = None
    ) -> None:
        self.refresh_s = refresh_s
        self.initial_runs = initial_runs
        self.predictor = predictor or RuntimePredictor()
        #: The newest SUCCEEDED event read (None: nothing read yet), the ids read near it, when it was last read.
        self._last_event: int | None = None
        self._recent: set[int] = set()
        self._refreshed_at: float | None = None
        #: Tenant -> how many of its runs were observed: a prediction for a job of the tenant made at one count holds
        #: until the next (both its keys are the tenant's), so a reader recomputes only the jobs of tenants with news.
        self.tenant_versions: dict[str, int] = {}

    def observe(self, runs: Iterable[observability.SuccessfulRun]) -> None:
        """Feed successful runs (oldest first) to the predictor."""
        versions = self.tenant_versions
        for run in runs:
            self.predictor.observe(runtime_keys(run.tenant, run.name), run.runtime_s, run.max_runtime_s)
            versions[run.tenant] = versions.get(run.tenant, 0) + 1

    async def refresh(self, db: Database, now: float, *, force: bool = False) -> bool:
        """Read the runs that ended since the last refresh, if ``refresh_s`` has passed (or ``force``); whether any was new."""
        if not force and self._refreshed_at is not None and abs(now - self._refreshed_at) < self.refresh_s:
            return False
        self._refreshed_at = now
        if self._last_event is None:
            runs = await observability.successful_runs(db, limit=self.initial_runs)
        else:
            floor = self._last_event - REREAD_EVENTS
            runs = []
            while True:  # pages, so that a long pause is caught up without one huge read
                page = await observability.successful_runs(db, after_event=floor, limit=self.initial_runs)
                runs.extend(r for r in page if r.event_id not in self._recent)
                if len(page) < self.initial_runs:
                    break
                floor = page[-1].event_id
        if not runs:
            if self._last_event is None:
                self._last_event = 0
            return False
        self.observe(runs)
        self._last_event = max(self._last_event or 0, max(r.event_id for r in runs))
        floor = self._last_event - REREAD_EVENTS
        self._recent = {i for i in self._recent if i > floor} | {r.event_id for r in runs if r.event_id > floor}
        return True
