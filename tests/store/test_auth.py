"""Tokens on both backends: stored as digests, each mapped to its principal."""

from __future__ import annotations

from sqlalchemy import select
from sqlmodel import col

from store import auth
from store.db import Database
from store.models import ApiToken


async def test_tokens_are_stored_hashed_and_map_to_their_principal(seeded: Database) -> None:
    async with seeded.sessions() as session:
        hashes = (await session.execute(select(col(ApiToken.token_hash)))).scalars().all()
    assert "alpha-token" not in hashes
    assert auth.hash_token("alpha-token") in hashes
    assert await auth.authenticate(seeded, "alpha-token") == auth.Principal(role="tenant", tenant="alpha")
    assert await auth.authenticate(seeded, "admin-token") == auth.Principal(role="admin")
    assert await auth.authenticate(seeded, "nope") is None
