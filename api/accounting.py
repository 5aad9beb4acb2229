"""/v1/usage: GPU-hours used against guaranteed, fleet share, jobs, waits, preemptions and GPU-hours lost over a
time window, per tenant and GPU type (store/accounting.py). A tenant sees its own; an admin every tenant's."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException, Query

from api.deps import Caller, State, require_user
from api.jobs import parse_time
from store import accounting

router = APIRouter(prefix="/v1", tags=["accounting"])


@router.get("/usage")
async def usage(
    state: State,
    who: Caller,
    since: str | None = Query(default=None, description="window start: epoch seconds or ISO 8601 (default: 7 days before until)"),
    until: str | None = Query(default=None, description="window end: epoch seconds or ISO 8601 (default: now)"),
    by: str = Query(default="tenant,gpu_type", description="comma-separated: tenant, gpu_type; empty for one total row"),
    tenant: str | None = None,
) -> dict[str, Any]:
    require_user(who)
    now = time.time()
    end = parse_time(until, "until") if until is not None else now
    start = parse_time(since, "since") if since is not None else end - 7 * 86400
    if end <= start:
        raise HTTPException(422, "until: must be after since")
    groups = [g.strip() for g in by.split(",") if g.strip()]
    unknown = sorted(set(groups) - set(accounting.GROUPS))
    if unknown:
        raise HTTPException(422, f"by: cannot group by {', '.join(unknown)} (one of {', '.join(accounting.GROUPS)})")
    if not who.admin:
        if tenant is not None and tenant != who.tenant:
            raise HTTPException(403, f"tenant: your token belongs to tenant '{who.tenant}'")
        tenant = who.tenant
    rows = await accounting.usage_report(state.db, since=start, until=end, by=groups, tenant=tenant, now=now)
    return {"since": start, "until": end, "by": groups, "rows": [r.as_dict() for r in rows]}
