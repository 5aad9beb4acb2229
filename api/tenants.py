"""/v1/tenants: quota, usage, dominant share and waiting jobs per tenant. A tenant sees only itself.

Answered from the view cache (``api.views``), filtered per caller; ``X-Computed-At`` says when it was computed.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from api.deps import Caller, State, require_user
from api.views import json_list

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
