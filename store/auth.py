"""API tokens and who they belong to: tokens are stored as digests, a token maps to its :class:`Principal`."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from store.db import Database
from store.models import ApiToken


def hash_token(token: str) -> str:
    """Tokens are stored as SHA-256 digests only."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: an admin, a tenant, or a node agent (``node_id``: the one node it speaks for)."""

    role: str
    tenant: str | None = None
    node_id: str | None = None

    @property
    def admin(self) -> bool:
        return self.role == "admin"


async def authenticate(db: Database, token: str) -> Principal | None:
    async with db.sessions() as session:
        row = (await session.execute(select(ApiToken).where(col(ApiToken.token_hash) == hash_token(token)))).scalar_one_or_none()
    if row is None or (row.role == "node" and not row.node_id):
        return None
    return Principal(role=row.role, tenant=row.tenant, node_id=row.node_id)


async def set_node_credential(session: AsyncSession, node_id: str, token: str, *, now: float | None = None) -> None:
    """Make ``token`` the node's only credential (in the caller's transaction): earlier ones stop working."""
    now = time.time() if now is None else now
    digest = hash_token(token)
    earlier = (col(ApiToken.role) == "node", col(ApiToken.node_id) == node_id, col(ApiToken.token_hash) != digest)
    await session.execute(delete(ApiToken).where(*earlier))
    existing = (await session.execute(select(ApiToken).where(col(ApiToken.token_hash) == digest))).scalar_one_or_none()
    if existing is None:
        session.add(ApiToken(token_hash=digest, role="node", node_id=node_id, created_at=now))
    else:
        existing.role, existing.tenant, existing.node_id = "node", None, node_id


def new_node_token() -> str:
    """A fresh random node credential (an admin's enrolment)."""
    return "fgn-" + secrets.token_hex(20)
