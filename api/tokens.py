"""Tokens with a lifecycle (SPEC R8.4): create, list, revoke; each may expire.

A platform admin manages every person's token (admins' and every tenant's); a tenant admin its own
tenant's (members' and admins'); a member none. A token's secret is shown once, when it is made, and
stored only as a digest. Nodes' credentials come from their enrolment (``POST /v1/nodes``), not from here.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException, Query

from api.deps import Caller, RowId, State
from api.schemas import TokenCreated, TokenRequest
from store import auth, tenants
from store.auth import ADMIN, TENANT_ADMIN, Principal, TokenInfo

router = APIRouter(prefix="/v1", tags=["tokens"])


def _require_token_admin(who: Principal) -> None:
    if who.role not in (ADMIN, TENANT_ADMIN):
        raise HTTPException(403, "tokens are managed by a platform admin or the tenant's admin")


@router.get("/whoami")
async def whoami(who: Caller) -> dict[str, Any]:
    """The caller as the API sees its token: its role, its tenant (none for a platform admin) and whether it is an admin."""
    return {"name": who.name, "role": who.role, "tenant": who.tenant, "admin": who.admin}


@router.post("/tokens", status_code=201)
async def create_token(state: State, who: Caller, body: TokenRequest) -> TokenCreated:
    """Make a token; its secret is in this answer only."""
    _require_token_admin(who)
    tenant = body.tenant if who.admin else (body.tenant or who.tenant)
    if body.role == ADMIN:
        if not who.admin:
            raise HTTPException(403, "only a platform admin makes admin tokens")
        if body.tenant is not None:
            raise HTTPException(422, "tenant: a platform admin's token belongs to no tenant")
        tenant = None
    elif tenant is None:
        raise HTTPException(422, f"tenant: a {body.role} token names its tenant")
    elif not who.admin and tenant != who.tenant:
        raise HTTPException(403, f"a tenant admin makes tokens of its own tenant only ('{who.tenant}')")
    elif await tenants.get_tenant(state.db, tenant) is None:
        raise HTTPException(422, f"tenant: no tenant '{tenant}'")
    expires_at = None if body.expires_in is None else time.time() + body.expires_in
    secret, info = await auth.create_token(
        state.db, role=body.role, tenant=tenant, name=body.name, created_by=who.name, expires_at=expires_at
    )
    return TokenCreated(token=secret, info=info)


@router.get("/tokens")
async def list_tokens(
    state: State, who: Caller, tenant: str | None = Query(default=None, description="Admins: one tenant's tokens only.")
) -> list[TokenInfo]:
    """People's tokens (never their secrets): a tenant admin sees its tenant's, a platform admin everyone's."""
    _require_token_admin(who)
    if who.admin and tenant is None:
        found = await auth.list_tokens(state.db, everyone=True)
    else:
        found = await auth.list_tokens(state.db, tenant=tenant if who.admin else who.tenant)
    return found


@router.delete("/tokens/{token_id}")
async def revoke_token(state: State, who: Caller, token_id: RowId) -> TokenInfo:
    """Revoke a token: it is refused from now on (the record stays). Another tenant's answers 404."""
    _require_token_admin(who)
    info = await auth.revoke_token(state.db, token_id, tenant=who.tenant, everyone=who.admin, actor=who.name)
    if info is None:
        raise HTTPException(404, f"no token {token_id}")
    return info
