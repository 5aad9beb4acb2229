"""Live accuracy of the queue's predicted starts (both backends): the queue view records each waiting job's first
estimate and an hourly sample, scores them once the job starts, calibrates its starts from the scored records
(as the what-if does), and ``GET /v1/eta-accuracy`` and ``/metrics`` report the errors."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlmodel import col

from api import estimates, insight
from api import whatif as api_whatif
from api.estimates import EtaKeeper
from fairgang.settings import Settings
from simulator import whatif
from simulator.calibrate import WaitCalibrator
from simulator.estimate import INTERVAL_QUANTILES
from store import eta
from store.db import Database
from store.models import EtaRecord, Job
from tests.api.test_api import ADMIN, ALPHA
from tests.api.test_observability import queue_job
from tests.api.test_whatif import busy_fleet, contended
from tests.simulator.helpers import pending


async def records(db: Database) -> list[EtaRecord]:
    async with db.sessions() as session:
        return list((await session.execute(select(EtaRecord).order_by(col(EtaRecord.job_id), col(EtaRecord.slot)))).scalars())


async def queue(api: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    resp = await api.get("/v1/queue", headers=ADMIN)
    assert resp.status_code == 200, resp.text
    return {e["job"]["id"]: e for e in resp.json()}


async def test_the_queue_view_records_first_estimates_and_scores_them_once_the_job_starts(api: httpx.AsyncClient, seeded: Database) -> None:
    waiting = await busy_fleet(api, seeded)
    shown = await queue(api)
    rows = await records(seeded)
    assert {r.job_id for r in rows} == set(waiting.values()) and all(r.slot == 0 and r.kind == "first" for r in rows)
    for r in rows:  # what was shown, with the raw forecast; nothing scored yet (cold start: run-time quantiles)
        assert (r.median, r.low, r.high) == tuple(
            shown[r.job_id][k] for k in ("estimated_start", "estimated_start_low", "estimated_start_high")
        )
        assert r.raw_start >= r.made_at and r.started_at is None and not r.calibrated
        assert (r.size_class, r.gpu_type) == ({1: "1", 4: "2-8", 8: "2-8"}[r.gpu_count], "H100-80GB")
    await queue_job(api, seeded, ALPHA, name="later")  # the store moves: the view is computed again
    await queue(api)
    assert len(await records(seeded)) == 4  # the new job's first; no second record of the others within the hour
    # "one" starts (as the agent reports it: its row's start time); the next view scores its record.
    started = rows[0].made_at + 120.0
    async with seeded.transaction() as session:
        job = await session.get(Job, waiting["one"])
        assert job is not None
        job.started_at = started
    await queue_job(api, seeded, ALPHA, name="again")
    await queue(api)
    (scored,) = [r for r in await records(seeded) if r.started_at is not None]
    assert (scored.job_id, scored.started_at) == (waiting["one"], started)

    resp = await api.get("/v1/eta-accuracy", headers=ALPHA)
    assert resp.status_code == 200, resp.text
    groups = {(g["gpu_type"], g["size_class"]): g for g in resp.json()["groups"]}
    assert set(groups) == {("H100-80GB", "1"), ("*", "*")}
    one = groups[("H100-80GB", "1")]
    error = scored.median - started
    assert (one["scored"], one["median_abs_error_s"], one["median_signed_error_s"]) == (1, abs(error), error)
    assert one["coverage"] == float(scored.low <= started <= scored.high)
    assert (one["within_10min"], one["within_1h"]) == (float(abs(error) <= 600), float(abs(error) <= 3600))
    later = await api.get("/v1/eta-accuracy", params={"since": started + 1, "kind": "first"}, headers=ALPHA)
    assert later.json()["groups"] == [{"gpu_type": "*", "size_class": "*", **estimates.score([])}]

    text = (await api.get("/metrics")).text
    bucket = 'fairgang_eta_abs_error_seconds_bucket{gpu_type="H100-80GB",kind="first",le="+Inf",size_class="1"} 1.0'
    assert bucket in text
    assert f'fairgang_eta_abs_error_seconds_sum{{gpu_type="H100-80GB",kind="first",size_class="1"}} {abs(error)}' in text
    assert 'fairgang_eta_within_interval_total{gpu_type="H100-80GB",kind="first",size_class="1"}' in text


async def test_the_accuracy_is_for_tenants_and_admins_and_checks_its_query(api: httpx.AsyncClient) -> None:
    assert (await api.get("/v1/eta-accuracy")).status_code == 401
    assert (await api.get("/v1/eta-accuracy", headers=ADMIN)).json()["groups"][-1]["scored"] == 0
    for params, field in (({"kind": "last"}, "kind"), ({"since": "yesterday"}, "since")):
        resp = await api.get("/v1/eta-accuracy", params=params, headers=ALPHA)
        assert resp.status_code == 422 and field in resp.text, resp.text


async def test_with_enough_outcomes_the_queue_view_calibrates_its_starts(api: httpx.AsyncClient, seeded: Database) -> None:
    # 25 earlier estimates (of jobs started within the retention) of a 50-minute wait that took twice as long.
    t = time.time() - 86400.0
    async with seeded.transaction() as session:
        for i in range(25):
            session.add(
                EtaRecord(
                    job_id=f"j-old-{i}", slot=0, kind="first", tenant="alpha", gpu_type="H100-80GB", gpu_count=1, size_class="1",
                    made_at=t + i, raw_start=t + 3000.0 + i, median=t + 3000.0 + i, low=t + 3000.0 + i, high=t + 3000.0 + i,
                    started_at=t + 6000.0 + i, scored_at=t + 6100.0,
                )
            )  # fmt: skip
    waiting = await busy_fleet(api, seeded)
    shown = await queue(api)
    rows = {r.job_id: r for r in await records(seeded) if r.job_id in waiting.values()}
    assert len(rows) == 3
    for job_id, r in rows.items():  # every band borrows the 25 ratios of 2.0 (the 2-8 class has none of its own)
        assert r.calibrated
        assert r.median - r.made_at == pytest.approx(2.0 * (r.raw_start - r.made_at))
        assert shown[job_id]["estimated_start"] == r.median


async def test_a_what_if_of_no_change_forecasts_the_queue_views_starts_calibrated_or_not(
    api: httpx.AsyncClient, seeded: Database, db_url: str
) -> None:
    ids = await contended(api, seeded)
    now = time.time()
    snapshot, ratio = await api_whatif.live_snapshot(seeded, Settings(database_url=db_url), now)
    ratios = tuple(ratio for _ in INTERVAL_QUANTILES)
    calibrator = WaitCalibrator(min_samples=3)
    for wait in (60.0, 120.0, 180.0):
        calibrator.observe(0.0, wait)  # estimates of "now" took a minute or two: only the jobs that start now calibrate
    view = insight.estimate_queue(snapshot, ratios, now, calibrator)
    assert view.calibrated == set(ids["beta"])  # they start now; the others wait
    assert all(view.estimated_start[j] == now + 120.0 for j in ids["beta"])
    got = whatif.forecast(
        snapshot,
        now,
        horizon_s=insight.ESTIMATE_HORIZON_S,
        step_s=insight.ESTIMATE_STEP_S,
        max_steps=400,
        ratio=ratio,
        calibrator=calibrator,
    )
    assert got == view.estimated_start
    answer = whatif.what_if(
        snapshot,
        whatif.Proposal(),
        now,
        horizon_s=3600.0 * 168,
        step_s=insight.ESTIMATE_STEP_S,
        max_steps=400,
        ratio=ratio,
        calibrator=calibrator,
    )
    assert {j.job_id: j.before for j in answer.jobs} == {j: view.estimated_start.get(j) for j in view.position}


async def test_the_worker_records_a_sample_an_hour_at_most_and_a_bounded_number(db: Database) -> None:
    keeper = EtaKeeper()
    job = dataclasses.replace(pending("j-wait", 1, gpu_type="H100-80GB"), tenant="alpha")
    requeued = dataclasses.replace(pending("j-again", 1), attempt=2)

    def view(now: float) -> insight.QueueView:
        starts = {"j-wait": now + 900.0, "j-again": now + 60.0}
        return insight.QueueView(position={}, estimated_start=starts, raw_start=starts)

    t0 = 3600.0 * 1000 + 1800.0  # half past an hour
    assert await keeper.record(db, [job, requeued], view(t0), t0) == 1  # the first estimate; none of a second attempt
    assert await keeper.record(db, [job], view(t0 + 1200.0), t0 + 1200.0) == 0  # the first one's hour
    assert await keeper.record(db, [job], view(t0 + 1900.0), t0 + 1900.0) == 1  # the next hour
    assert await keeper.record(db, [job], view(t0 + 2000.0), t0 + 2000.0) == 0
    # A new worker (a restart) knows what is recorded.
    assert await EtaKeeper().record(db, [job], view(t0 + 2100.0), t0 + 2100.0) == 0
    for hour in range(2, 60):
        await keeper.record(db, [job], view(t0 + 3600.0 * hour), t0 + 3600.0 * hour)
    rows = await records(db)
    assert rows[0].slot == 0 and len(rows) <= 1 + eta.MAX_SAMPLES
    assert [r.job_id for r in rows] == ["j-wait"] * len(rows)


async def test_the_worker_reads_new_outcomes_incrementally_and_calibrates_as_the_store_says(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(estimates, "WINDOW_RECORDS", 30)
    monkeypatch.setattr(estimates, "CALIBRATOR_MIN_SAMPLES", 5)

    async def outcomes(first: int, count: int, ratio: float, scored_at: float) -> None:
        async with db.transaction() as session:
            for i in range(first, first + count):
                session.add(
                    EtaRecord(
                        job_id=f"j-{i:03d}", slot=0, kind="first", tenant="alpha", gpu_type="H100-80GB", gpu_count=1, size_class="1",
                        made_at=float(i), raw_start=3600.0 + i, median=3600.0 + i, low=3600.0 + i, high=3600.0 + i,
                        started_at=i + 3600.0 * ratio, scored_at=scored_at,
                    )
                )  # fmt: skip

    keeper = EtaKeeper()
    assert not (await keeper.refresh(db, 1000.0)).calibrates(3600.0, "1")  # nothing yet: cold start
    await outcomes(0, 20, 2.0, scored_at=2000.0)
    assert (await keeper.refresh(db, 2000.0)).interval(3600.0, "1") == pytest.approx((7200.0,) * 3)
    await outcomes(20, 5, 3.0, scored_at=3000.0)
    await keeper.refresh(db, 3000.0)
    reads = []
    real = eta.scored_since

    async def counted(db: Database, *, scored_from: float) -> list[eta.Scored]:
        found = await real(db, scored_from=scored_from)
        reads.append(len(found))
        return found

    monkeypatch.setattr(eta, "scored_since", counted)
    await outcomes(25, 15, 3.0, scored_at=5000.0)  # later starts: the window keeps the latest 30
    calibrator = await keeper.refresh(db, 5000.0)
    assert reads == [20]  # only what was scored since the last read (and in the minute before it), not all 40
    assert len(keeper.records) == 30 and min(k[0] for k in keeper.records) == "j-010"
    assert calibrator.interval(3600.0, "1")[1] == pytest.approx(3.0 * 3600.0)  # 20 of 30 ratios are 3
    from_store = await estimates.calibrator_from_store(db)
    for wait in (30.0, 600.0, 3600.0, 20000.0):
        assert from_store.interval(wait, "1") == calibrator.interval(wait, "1")
        assert from_store.interval(wait, "33+") == calibrator.interval(wait, "33+")
    # Past the retention (here: jobs started before 7215 s), scored records are folded into the totals: the
    # window forgets them as the store does, and the metrics' counts stay as they were.
    counts = await eta.error_counts(db)
    keeper.retention_s = 9000.0 - 7215.0
    calibrator = await keeper.refresh(db, 9000.0)
    assert sorted(r.job_id for r in await records(db))[0] == "j-015"
    assert len(keeper.records) == 25 and min(k[0] for k in keeper.records) == "j-015"
    from_store = await estimates.calibrator_from_store(db)
    for wait in (30.0, 600.0, 3600.0, 20000.0):
        assert from_store.interval(wait, "1") == calibrator.interval(wait, "1")
    assert await eta.error_counts(db) == counts
    keeper.retention_s = 1.0  # pruned at most once an hour
    await keeper.refresh(db, 9000.0 + estimates.PRUNE_EVERY_S - 1.0)
    assert len(await records(db)) == 25
