"""The usage report (store/accounting.py) against a scenario whose usage is worked out by hand.

The small cluster: alpha is guaranteed 8 H100s and 4 L40S, beta 8 H100s; the fleet has 16 H100s and 4 L40S.
The window is 10 h from T; the report is made 5 h into it.

- J1, alpha, 8 H100s: submitted and first running before T. Attempt 1 holds its GPUs from T - 30 min to T + 1 h
  (checkpoint at T + 30 min, preempted at T + 58 min, queued again at T + 1 h); attempt 2 from T + 2 h to T + 4 h.
  In the window: 8 x 1 h + 8 x 2 h = 24 GPU-hours, 8 x 30 min = 4 lost, one preemption.
- J2, beta, 16 H100s: submitted at T + 1000 s, running from T + 1600 s (wait 600 s), holds its GPUs from
  T + 1800 s and still does: 16 x 4.5 h = 72 GPU-hours.
- J3, beta, 8 H100s: submitted at T + 2000 s, running from T + 4000 s (wait 2000 s), GPUs from T + 3900 s to
  T + 7500 s: 8 GPU-hours.
- J4, alpha, 2 L40S: submitted at T + 100 s, running from T + 700 s (wait 600 s), GPUs from T + 400 s for 1 h: 2.
- J5, alpha, 4 L40S: submitted after the window: not counted.
"""

from __future__ import annotations

import pytest

from store import accounting, jobs
from store.common import new_event
from store.db import Database
from store.models import Allocation, Job
from tests.builders import job_spec

T, H = 1_790_000_000.0, 3600.0
NOW, UNTIL = T + 5 * H, T + 10 * H


def members(*nodes: tuple[str, int]) -> list[dict[str, object]]:
    return [{"node_id": n, "gpu_indices": list(range(g)), "rank": r} for r, (n, g) in enumerate(nodes)]


async def scenario(db: Database) -> None:
    async def job(name: str, tenant: str, gpu_type: str, gpus: int, created: float, started: float | None) -> str:
        made, _ = await jobs.create_job(db, spec=job_spec(name=name, gpu_type=gpu_type, gpu_count=gpus), tenant=tenant, now=created)
        async with db.transaction() as session:
            row = await session.get(Job, made.id)
            assert row is not None
            row.started_at = started
        return made.id

    j1 = await job("j1", "alpha", "H100-80GB", 8, T - H, T - 1700)
    j2 = await job("j2", "beta", "H100-80GB", 16, T + 1000, T + 1600)
    j3 = await job("j3", "beta", "H100-80GB", 8, T + 2000, T + 4000)
    j4 = await job("j4", "alpha", "L40S", 2, T + 100, T + 700)
    await job("j5", "alpha", "L40S", 4, UNTIL + 10, None)
    allocations = [
        ("a1", j1, 1, members(("h1", 8)), T - 1800, T + H),
        ("a1b", j1, 2, members(("h2", 8)), T + 2 * H, T + 4 * H),
        ("a2", j2, 1, members(("h1", 8), ("h2", 8)), T + 1800, None),
        ("a3", j3, 1, members(("h1", 8)), T + 3900, T + 7500),
        ("a4", j4, 1, members(("g1", 2)), T + 400, T + 400 + H),
    ]
    async with db.transaction() as session:
        for alloc_id, job_id, attempt, placed, start, end in allocations:
            state = "RELEASED" if end is not None else "ACKED"
            session.add(
                Allocation(id=alloc_id, job_id=job_id, attempt=attempt, state=state, members=placed, created_at=start, released_at=end)
            )
        for kind, attempt, ts in (
            ("CHECKPOINT", 1, T + 1200),
            ("CHECKPOINT", 1, T + 1800),
            ("PREEMPTING", 1, T + 3500),
            ("REQUEUED", 1, T + H),
        ):
            session.add(new_event(j1, attempt, kind, "/ckpt/alpha/j1/step-1" if kind == "CHECKPOINT" else kind, f"{kind}-{ts}", ts))
        # A preemption before the window is not counted.
        session.add(new_event(j1, 0, "PREEMPTING", "earlier", "early", T - 10))


def rows(report: list[accounting.UsageRow]) -> dict[tuple[str | None, str | None], dict[str, object]]:
    return {(r.tenant, r.gpu_type): {k: v for k, v in r.as_dict().items() if k not in ("tenant", "gpu_type")} for r in report}


async def test_usage_by_tenant_and_gpu_type_is_what_the_scenario_used(seeded: Database) -> None:
    await scenario(seeded)
    got = rows(await accounting.usage_report(seeded, since=T, until=UNTIL, now=NOW))
    assert got[("alpha", "H100-80GB")] == pytest.approx(
        {"gpu_hours": 24.0, "guaranteed_gpu_hours": 80.0, "fleet_share": 24 / 160, "jobs": 0, "wait_p50_s": None,
         "wait_p90_s": None, "preemptions": 1, "gpu_hours_lost": 4.0}
    )  # fmt: skip
    assert got[("alpha", "L40S")] == pytest.approx(
        {"gpu_hours": 2.0, "guaranteed_gpu_hours": 40.0, "fleet_share": 2 / 40, "jobs": 1, "wait_p50_s": 600.0,
         "wait_p90_s": 600.0, "preemptions": 0, "gpu_hours_lost": 0.0}
    )  # fmt: skip
    assert got[("beta", "H100-80GB")] == pytest.approx(
        {"gpu_hours": 80.0, "guaranteed_gpu_hours": 80.0, "fleet_share": 0.5, "jobs": 2, "wait_p50_s": 1300.0,
         "wait_p90_s": 1860.0, "preemptions": 0, "gpu_hours_lost": 0.0}
    )  # fmt: skip
    assert set(got) == {("alpha", "H100-80GB"), ("alpha", "L40S"), ("beta", "H100-80GB")}


async def test_usage_grouped_coarser_and_for_one_tenant_adds_up(seeded: Database) -> None:
    await scenario(seeded)
    by_tenant = rows(await accounting.usage_report(seeded, since=T, until=UNTIL, by=["tenant"], now=NOW))
    assert by_tenant[("alpha", None)]["gpu_hours"] == pytest.approx(26.0)
    assert by_tenant[("alpha", None)]["fleet_share"] == pytest.approx(26 / 200)  # 20 GPUs for 10 h
    assert by_tenant[("beta", None)]["guaranteed_gpu_hours"] == pytest.approx(80.0)
    total = rows(await accounting.usage_report(seeded, since=T, until=UNTIL, by=[], now=NOW))[(None, None)]
    assert total["gpu_hours"] == pytest.approx(106.0) and total["jobs"] == 3 and total["preemptions"] == 1
    assert total["wait_p50_s"] == pytest.approx(600.0)
    # An earlier report, made before J2's GPUs were held, of one tenant only.
    early = rows(await accounting.usage_report(seeded, since=T, until=T + H, tenant="beta", now=T + H))
    assert set(early) == {("beta", "H100-80GB")} and early[("beta", "H100-80GB")]["gpu_hours"] == pytest.approx(16 * (H - 1800) / H)
    with pytest.raises(ValueError, match="until must be after since"):
        await accounting.usage_report(seeded, since=T, until=T)
    with pytest.raises(ValueError, match="cannot group by node"):
        await accounting.usage_report(seeded, since=T, until=UNTIL, by=["node"])
