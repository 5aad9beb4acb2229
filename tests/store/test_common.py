"""The job event log's one-per-key append, on both backends."""

from __future__ import annotations

from store import common, jobs
from store.db import Database
from tests.builders import job_spec


async def test_an_event_is_added_once_per_dedupe_key(seeded: Database) -> None:
    job, _ = await jobs.create_job(seeded, spec=job_spec(name="a"), tenant="alpha")
    for expected in (True, False):
        async with seeded.transaction() as session:
            assert await common.add_event_once(session, common.new_event(job.id, 1, "NOTE", "once", "note-1", 5.0, n=1)) is expected
    async with seeded.transaction() as session:
        assert await common.add_event_once(session, common.new_event(job.id, 1, "NOTE", "other key", "note-2", 6.0))
    notes = [(e.message, e.data, e.dedupe_key) for e in await jobs.job_events(seeded, job.id) if e.kind == "NOTE"]
    assert notes == [("once", {"n": 1}, "note-1"), ("other key", {}, "note-2")]
