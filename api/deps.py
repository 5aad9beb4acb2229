"""Shared dependencies: the app's state, the caller's identity."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from temporalio.client import Client

from api.limits import AuthThrottle, SubmissionBuckets
from api.views import ViewCache
from fairgang.settings import Settings
from fairgang.temporal import connect
from store import auth
from store.db import Database

log = logging.getLogger("fairgang.api")
#: After a failed connect to Temporal, how long requests go without trying again.
TEMPORAL_RETRY_S = 2.0


@dataclass
class AppState:
    settings: Settings
    db: Database
    _client: Client | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _retry_at: float = 0.0
    #: The heavy views of this process (fleet, tenants, queue, metrics), computed by its view worker process.
    views: ViewCache = field(init=False)
    #: Refused bearer tokens per client address (api/limits.py).
    auth_throttle: AuthThrottle = field(init=False)
    #: Each tenant's submission bucket in this process (api/limits.py).
    submissions: SubmissionBuckets = field(default_factory=SubmissionBuckets)

    def __post_init__(self) -> None:
        self.views = ViewCache(self.settings, self.db.url)
        self.auth_throttle = AuthThrottle(self.settings.auth_failures_per_minute)

    async def temporal(self) -> Client | None:
        """The Temporal client, connected on first use; None while Temporal is unreachable.

        After a failed connect, requests get None at once for ``TEMPORAL_RETRY_S`` instead of each waiting
        for a connect of its own (a submission is stored either way; the reconciler starts its workflow).
        """
        if self._client is not None:
            return self._client
        if time.monotonic() < self._retry_at:
            return None
        async with self._lock:
            if self._client is None:
                if time.monotonic() < self._retry_at:
                    return None
                try:
                    self._client = await asyncio.wait_for(connect(self.settings), 5)
                except Exception as err:  # noqa: BLE001 - any connect failure means "not now"
                    self._retry_at = time.monotonic() + TEMPORAL_RETRY_S
                    log.warning("temporal unreachable (next try in %.0f s): %s", TEMPORAL_RETRY_S, err)
                    return None
        return self._client


async def app_state(request: Request) -> AppState:
    """The app's state (async: FastAPI runs a plain function dependency in its thread pool, on every request)."""
    state: AppState = request.app.state.fairgang
    return state


State = Annotated[AppState, Depends(app_state)]
_bearer = HTTPBearer(auto_error=False)


async def principal(
    request: Request, state: State, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> auth.Principal:
    client = request.client.host if request.client else "unknown"
    wait = state.auth_throttle.retry_after(client)
    if wait is not None:
        raise HTTPException(429, f"too many refused tokens from {client}: try again in {wait} s", headers={"Retry-After": str(wait)})
    if creds is None or not creds.credentials:
        raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    who = await auth.authenticate(state.db, creds.credentials)
    if who is None:
        state.auth_throttle.failed(client)
        raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
    return who


Caller = Annotated[auth.Principal, Depends(principal)]

#: A row id in a path (a token's): the store's integer keys (32-bit in PostgreSQL); a larger one is refused 422,
#: never sent to the store.
RowId = Annotated[int, Path(ge=1, le=2**31 - 1)]
#: A GPU's index on its node, in a path.
GpuIndex = Annotated[int, Path(ge=0, le=2**31 - 1)]


def require_user(who: auth.Principal) -> None:
    if not who.user:
        raise HTTPException(403, "this endpoint is for tenants and admins")


def require_node(who: auth.Principal, node_id: str) -> None:
    """Only the node's own agent (its credential names the node) may speak for a node."""
    if who.role != "node":
        raise HTTPException(403, "this endpoint is for node agents")
    if who.node_id != node_id:
        raise HTTPException(403, f"this credential is node {who.node_id}'s, not node {node_id}'s")


def require_admin(who: auth.Principal) -> None:
    if not who.admin:
        raise HTTPException(403, "this endpoint is for admins")
