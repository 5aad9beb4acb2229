"""API tokens and who they belong to: tokens are stored as digests, a token maps to its :class:`Principal`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import select
from sqlmodel import col

from store.db import Database
from store.models import ApiToken


def hash_token(token: str) -> str:
    """Tokens are stored as SHA-256 digests only."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: an admin, a tenant, or a node agent."""

    role: str
    tenant: str | None = None

    @property
    def admin(self) -> bool:
        return self.role == "admin"


async def authenticate(db: Database, token: str) -> Principal | None:
    async with db.sessions() as session:
        row = (await session.execute(select(ApiToken).where(col(ApiToken.token_hash) == hash_token(token)))).scalar_one_or_none()
    if row is None:
        return None
    return Principal(role=row.role, tenant=row.tenant)
