"""/v1/tenants: quota, usage, dominant share and waiting jobs per tenant. A tenant sees only itself."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from api import insight
from api.deps import Caller, State, require_user

router = APIRouter(prefix="/v1", tags=["tenants"])


@router.get("/tenants")
async def list_tenants(state: State, who: Caller) -> list[dict[str, Any]]:
    """Every tenant (admin), or the caller's own tenant: quotas with used and borrowed GPUs, share, running and waiting jobs."""
    require_user(who)
    return [t for t in await insight.tenant_usage(state.db, state.settings) if who.admin or t["name"] == who.tenant]


@router.get("/tenants/{name}")
async def show_tenant(state: State, who: Caller, name: str) -> dict[str, Any]:
    require_user(who)
    if not who.admin and name != who.tenant:
        raise HTTPException(404, f"no tenant {name}")
    for tenant in await insight.tenant_usage(state.db, state.settings):
        if tenant["name"] == name:
            return tenant
    raise HTTPException(404, f"no tenant {name}")
