"""``POST /v1/admin/whatif``: how waits and ETAs would shift with a proposed change (admins; writes nothing).

The live queue, running jobs and fleet are read from the store as the queue view reads them
(``api.insight.snapshot_now``, with the same expected run times), under the policy the placement
service runs (its settings); ``simulator.whatif`` applies the change and replays the next hours
through the production core twice, without and with it, each side's starts calibrated as the queue view
calibrates its own (``api.eta``: the same calibrator, read from the store's records of earlier estimates; while
it has too few of them, the run-time predictor's median error ratio), so that "no change" answers the queue
view's most likely starts for the same state and clock. Nothing is written: past usage comes
from the ledger the placement service keeps, or, for a half-life it keeps none for, is integrated
from the allocation rows (``store.usage.from_history``) instead of building a ledger.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import functools
import multiprocessing
import os
import threading
import time
from typing import Annotated

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from api import estimates, insight
from api.deps import Caller, State, require_admin
from api.schemas import QuotaChange
from fairgang.settings import Settings
from scheduler.core import Quota, Reservation, SchedulerConfig, Snapshot
from scheduler.snapshot import SnapshotReader, service_config
from simulator import whatif
from simulator.calibrate import WaitCalibrator
from simulator.estimate import INTERVAL_QUANTILES
from store import usage
from store.db import Database
from store.models import UsageLedger

router = APIRouter(prefix="/v1/admin", tags=["admin"])

#: The replay's grid is the live queue view's; it may ask the policy this many times (the view: 400) to reach the horizon.
MAX_STEPS = 2000
#: Processes for the replays: the two of one what-if run side by side.
REPLAY_PROCESSES = 2
#: The longest horizon a what-if may ask for.
MAX_HOURS = 7 * 24.0

Name = Annotated[str, Field(min_length=1, max_length=64)]
Number = Annotated[float, Field(strict=True)]


class NodesAdded(BaseModel):
    """``count`` nodes of ``gpus`` GPUs of ``gpu_type``; ``domain`` names their topology domain at some levels
    (e.g. ``{"leaf": "l1"}``), every other level gets a new domain."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(ge=1, le=1000)
    gpu_type: Name
    gpus: int = Field(ge=1, le=64)
    domain: dict[Name, Name] = Field(default_factory=dict, max_length=8)


class WhatIfRequest(BaseModel):
    """The proposed change (any of these, combined; none: the future as it is) and how far to look."""

    model_config = ConfigDict(extra="forbid")

    hours: Number = Field(default=24.0, gt=0, le=MAX_HOURS, description="How far ahead to replay.")
    weights: dict[Name, Number] = Field(default_factory=dict, max_length=64, description="Tenant -> new weight.")
    quotas: dict[Name, Annotated[dict[Name, QuotaChange | None], Field(max_length=16)]] = Field(
        default_factory=dict, max_length=32, description="Tenant -> GPU type -> new quota (null: the type taken away)."
    )
    add_nodes: list[NodesAdded] = Field(default_factory=list, max_length=32)
    drain: list[Name] = Field(default_factory=list, max_length=1000, description="Node ids that get no new work.")
    policy: dict[Name, StrictBool | StrictInt | StrictFloat | Annotated[StrictStr, Field(max_length=64)]] = Field(
        default_factory=dict, max_length=32, description="SchedulerConfig setting -> new value (type-checked)."
    )
    jobs: StrictBool = Field(default=False, description="Also answer every waiting job's shift.")


class TenantShiftPublic(BaseModel):
    tenant: str
    waiting: int
    mean_wait_before_s: float
    mean_wait_after_s: float
    median_wait_before_s: float
    median_wait_after_s: float
    started_before: int
    started_after: int


class JobShiftPublic(BaseModel):
    job_id: str
    tenant: str
    gpu_type: str
    gpu_count: int
    before: float | None
    after: float | None
    shift_s: float | None


class WhatIfAnswer(BaseModel):
    """Per tenant (and ``*``: everyone) the waits from now to the predicted starts without and with the change; a job
    not started within the horizon counts as waiting the whole horizon. ``jobs`` when asked for."""

    now: float
    horizon_s: float
    changes: list[str]
    tenants: list[TenantShiftPublic]
    jobs: list[JobShiftPublic] | None = None


async def decayed_usage(db: Database, *, half_life: float, now: float) -> dict[str, dict[str, float]]:
    """Past usage at ``half_life``, read without writing: from its ledger if one is kept, else from the allocation rows."""
    async with db.sessions() as session:
        kept = await session.get(UsageLedger, half_life) is not None
    if kept or half_life <= 0:
        return await usage.usage(db, half_life=half_life, now=now)
    return await usage.from_history(db, half_life=half_life, now=now)


class _GivenUsage(SnapshotReader):
    """A fresh reader that takes past usage as given (so that reading the snapshot builds no ledger)."""

    def __init__(self, decayed: dict[str, dict[str, float]]) -> None:
        super().__init__()
        self._given = decayed

    async def read(
        self,
        db: Database,
        *,
        now: float,
        stale_after_s: float,
        config: SchedulerConfig,
        reservations: tuple[Reservation, ...] = (),
        decayed: dict[str, dict[str, float]] | None = None,
    ) -> Snapshot:
        given = self._given if decayed is None else decayed
        return await super().read(db, now=now, stale_after_s=stale_after_s, config=config, reservations=reservations, decayed=given)


async def live_snapshot(db: Database, settings: Settings, now: float) -> tuple[Snapshot, float]:
    """The queue, running jobs and fleet now, with expected run times, under the placement service's policy; and the
    run-time predictor's median error ratio (the queue view's median forecast scales remaining run times by it)."""
    config = service_config(settings)
    decayed = await decayed_usage(db, half_life=config.usage_half_life_s, now=now)
    reader = _GivenUsage(decayed)
    snapshot = await insight.snapshot_now(db, settings, now, reader=reader)
    ratio = reader.runtimes.predictor.quantiles(INTERVAL_QUANTILES)[1]
    return snapshot, ratio


_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


#: How often a replay process looks whether the API process that started it is still there.
PARENT_CHECK_S = 1.0


def _end_with(parent: int) -> None:
    """(A replay process's initializer) End this process once ``parent`` has gone: an API process killed by a
    signal runs no exit handlers, and its replay processes must not outlive it."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="fairgang-whatif-parent", daemon=True).start()


def _replay_pool() -> concurrent.futures.ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            spawn = multiprocessing.get_context("spawn")
            _pool = concurrent.futures.ProcessPoolExecutor(REPLAY_PROCESSES, spawn, initializer=_end_with, initargs=(os.getpid(),))
            atexit.register(_pool.shutdown, cancel_futures=True)  # before the interpreter tears its modules down
        return _pool


async def replay(
    snapshot: Snapshot,
    proposal: whatif.Proposal,
    now: float,
    *,
    horizon_s: float,
    decayed: dict[str, dict[str, float]] | None,
    ratio: float = 1.0,
    calibrator: WaitCalibrator | None = None,
) -> whatif.WhatIf:
    """``simulator.whatif.what_if``, its two forecasts (``simulator.whatif.forecast``) side by side in processes of
    their own (kept; what-ifs take turns): seconds of pure Python on a large fleet, which must not hold the API's
    interpreter lock (as the queue view's forward simulation must not). The proposal is checked here first
    (:class:`whatif.ProposalError`)."""
    global _pool
    changed = whatif.apply(snapshot, proposal, now=now, decayed=decayed)
    pool = _replay_pool()
    loop = asyncio.get_running_loop()

    def run(snap: Snapshot) -> asyncio.Future[dict[str, float]]:
        call = functools.partial(
            whatif.forecast,
            snap,
            now,
            horizon_s=horizon_s,
            step_s=insight.ESTIMATE_STEP_S,
            max_steps=MAX_STEPS,
            ratio=ratio,
            calibrator=calibrator,
        )
        return loop.run_in_executor(pool, call)

    try:
        before_f = run(snapshot)
        after_f = before_f if changed is snapshot else run(changed)
        before, after = await asyncio.gather(before_f, after_f)
    except concurrent.futures.process.BrokenProcessPool:
        with _pool_lock:
            if _pool is pool:
                _pool = None
        raise HTTPException(503, "the what-if's process died; try again", headers={"Retry-After": "1"}) from None
    return whatif.compare(snapshot, before, after, now=now, horizon_s=horizon_s)


def proposal_of(body: WhatIfRequest) -> whatif.Proposal:
    """The request as the pure module's proposal (policy values type-checked here, naming the field)."""
    quotas = tuple(
        whatif.QuotaChange(
            tenant=tenant,
            gpu_type=gpu_type,
            quota=None if q is None else Quota(nominal=q.nominal, borrow_limit=q.borrow_limit, lend_limit=q.lend_limit),
        )
        for tenant, per_type in body.quotas.items()
        for gpu_type, q in per_type.items()
    )
    return whatif.Proposal(
        weights=tuple(body.weights.items()),
        quotas=quotas,
        add_nodes=tuple(
            whatif.AddNodes(count=g.count, gpu_type=g.gpu_type, gpus=g.gpus, domain=tuple(sorted(g.domain.items()))) for g in body.add_nodes
        ),
        drain=tuple(body.drain),
        policy=tuple((name, whatif.policy_value(name, value)) for name, value in body.policy.items()),
    )


def _refused(err: whatif.ProposalError) -> HTTPException:
    return HTTPException(422, {"error": "what-if refused", "problems": [{"field": err.field, "reason": err.reason}]})


@router.post("/whatif")
async def what_if(state: State, who: Caller, body: WhatIfRequest) -> WhatIfAnswer:
    """Admin: replay the next ``hours`` of the live queue without and with a proposed change (a tenant's weight or
    quota, nodes added or drained, a policy setting) and answer per tenant how waits and ETAs would shift.

    Nothing is changed or written. Refused (422, naming the field) for an unknown tenant, node, GPU type, topology
    level or policy setting, or a value of the wrong type or out of range. No new arrivals are simulated, and run
    times are the queue view's expectations: the answer is as good as the live queue estimates."""
    require_admin(who)
    try:
        proposal = proposal_of(body)
    except whatif.ProposalError as err:
        raise _refused(err) from None
    now = time.time()
    snapshot, ratio = await live_snapshot(state.db, state.settings, now)
    decayed = None
    half_life = dict(proposal.policy).get("usage_half_life_s")
    if half_life is not None and half_life != snapshot.config.usage_half_life_s:
        decayed = await decayed_usage(state.db, half_life=float(half_life), now=now)
    try:
        calibrator = await estimates.calibrator_from_store(state.db)
        result = await replay(snapshot, proposal, now, horizon_s=body.hours * 3600.0, decayed=decayed, ratio=ratio, calibrator=calibrator)
    except whatif.ProposalError as err:
        raise _refused(err) from None
    return WhatIfAnswer(
        now=result.now,
        horizon_s=result.horizon_s,
        changes=whatif.describe(snapshot, proposal),
        tenants=[TenantShiftPublic(**dataclasses.asdict(t)) for t in result.tenants],
        jobs=[JobShiftPublic(**dataclasses.asdict(j), shift_s=j.shift_s) for j in result.jobs] if body.jobs else None,
    )
