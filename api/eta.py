"""``GET /v1/eta-accuracy``: how accurate the queue's predicted starts were (``api.estimates``, ``store.eta``)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, Query

from api.deps import Caller, State, require_user
from api.estimates import accuracy
from api.jobs import parse_time
from store import eta as stored

router = APIRouter(prefix="/v1", tags=["queue"])


@router.get("/eta-accuracy")
async def eta_accuracy(
    state: State,
    who: Caller,
    since: str | None = Query(default=None, description="only jobs that started from then on: epoch seconds or ISO 8601"),
    kind: str | None = Query(default=None, description="first (each job's first estimate) or sample (the later ones); default both"),
) -> dict[str, Any]:
    """How accurate the queue's predicted starts were, by GPU type and size class: estimates scored (those whose jobs
    have started), median absolute and signed error (most likely start - actual start, seconds), the share that
    started within the p10-p90 interval, and the shares within 10 minutes and within an hour. Any tenant or admin."""
    require_user(who)
    start = parse_time(since, "since") if since is not None else None
    if kind is not None and kind not in (stored.FIRST, stored.SAMPLE):
        raise HTTPException(422, f"kind: must be {stored.FIRST!r} or {stored.SAMPLE!r}, got {kind!r}")
    records = await stored.scored_records(state.db, since=start)
    if kind is not None:
        records = [r for r in records if r.kind == kind]
    rows = await asyncio.to_thread(accuracy, records)
    return {"since": start, "kind": kind, "groups": rows}
