"""/v1/tenants: quota, usage, dominant share and waiting jobs per tenant. A tenant sees only itself.

Answered from the view cache (``api.views``), filtered per caller; ``X-Computed-At`` says when it was computed.
An admin changes a tenant's policy live (``PATCH``): validated as the cluster config is, recorded in the audit
log (``GET /v1/audit``) in the change's own transaction, used from the next scheduling cycle on.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response
from pydantic import ValidationError

from api.deps import Caller, State, require_admin, require_user
from api.schemas import AuditEventPublic, TenantChange, TenantChanged
from api.views import json_list
from fairgang.cluster import TenantConfig, overcommitted, tenant_change_problems
from fairgang.spec import SpecProblem, problems_from_validation
from store import audit, tenants

router = APIRouter(prefix="/v1", tags=["tenants"])


@router.get("/tenants")
async def list_tenants(state: State, who: Caller) -> Any:
    """Every tenant (admin), or the caller's own tenant: quotas with used and borrowed GPUs, share, running and waiting jobs."""
    require_user(who)
    view = await state.views.get("tenants", state.db)
    body = view.body if who.admin else json_list(view.parts.get(who.tenant or "", []))
    return Response(body, media_type="application/json", headers=view.headers())


@router.get("/tenants/{name}")
async def show_tenant(state: State, who: Caller, name: str) -> Any:
    require_user(who)
    if not who.admin and name != who.tenant:
        raise HTTPException(404, f"no tenant {name}")
    view = await state.views.get("tenants", state.db)
    rows = view.parts.get(name)
    if not rows:
        raise HTTPException(404, f"no tenant {name}")
    return Response(rows[0], media_type="application/json", headers=view.headers())


def _refused(problems: list[SpecProblem]) -> HTTPException:
    return HTTPException(422, {"error": "tenant change refused", "problems": [p.model_dump() for p in problems]})


@router.patch("/tenants/{name}")
async def change_tenant(state: State, who: Caller, name: str, body: TenantChange) -> TenantChanged:
    """Admin: change a tenant's weight, cohort, quotas, limits, submission rate or checkpoint prefix, live.

    Refused (422, naming the field) for an unknown GPU type, a value out of range, or a checkpoint prefix within
    another tenant's. The answer warns of cohorts whose guarantees now exceed the fleet."""
    require_admin(who)
    rows = {row.name: row for row in await tenants.list_tenants(state.db)}
    if name not in rows:
        raise HTTPException(404, f"no tenant {name}")
    merged = tenants.tenant_config(rows[name]).model_dump(exclude={"tokens", "admin_tokens"})
    given = body.model_dump(include=body.model_fields_set)
    for gpu_type, quota in (given.pop("quotas", None) or {}).items():
        if quota is None:
            merged["quotas"].pop(gpu_type, None)
        else:
            merged["quotas"][gpu_type] = quota
    merged.update(given)
    try:
        changed = TenantConfig.model_validate(merged)
    except ValidationError as err:
        raise _refused(problems_from_validation(err)) from None
    others = [tenants.tenant_config(row) for other, row in rows.items() if other != name]
    capacity = await tenants.gpu_capacity(state.db)
    problems = tenant_change_problems(changed, others, set(capacity))
    if problems:
        raise _refused(problems)
    done = await tenants.update_tenant(state.db, name, tenants.policy_values(changed), actor=who.name)
    if done is None:
        raise HTTPException(404, f"no tenant {name}")
    before, after = done
    return TenantChanged(tenant=name, before=before, after=after, warnings=overcommitted([changed, *others], capacity))


@router.get("/audit")
async def audit_log(
    state: State,
    who: Caller,
    target: str | None = Query(default=None, max_length=128, description="One thing's events, e.g. tenant:alpha."),
    limit: int = Query(default=100, ge=1, le=1000),
    before_id: int | None = Query(default=None, description="Events older than this one (to page back)."),
) -> list[AuditEventPublic]:
    """Admin: the audit log, newest first: who changed what, when, the thing before and after."""
    require_admin(who)
    found = await audit.events(state.db, target=target, limit=limit, before_id=before_id)
    return [AuditEventPublic.model_validate(e, from_attributes=True) for e in found]
