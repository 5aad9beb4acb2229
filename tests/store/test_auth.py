"""Tokens on both backends: stored as digests, each mapped to its principal."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from sqlalchemy import select
from sqlmodel import col

from store import auth, tenants
from store.db import Database
from store.models import ApiToken
from tests.conftest import small_cluster


async def test_tokens_are_stored_hashed_and_map_to_their_principal(seeded: Database) -> None:
    async with seeded.sessions() as session:
        hashes = (await session.execute(select(col(ApiToken.token_hash)))).scalars().all()
    assert "alpha-token" not in hashes
    assert auth.hash_token("alpha-token") in hashes
    alpha, admin = await auth.authenticate(seeded, "alpha-token"), await auth.authenticate(seeded, "admin-token")
    assert alpha is not None and (alpha.role, alpha.tenant, alpha.node_id) == ("tenant", "alpha", None)
    assert admin is not None and (admin.role, admin.tenant, admin.admin) == ("admin", None, True)
    tenant_admin = await auth.authenticate(seeded, "alpha-admin-token")
    assert tenant_admin is not None and (tenant_admin.role, tenant_admin.tenant, tenant_admin.user) == ("tenant_admin", "alpha", True)
    assert await auth.authenticate(seeded, "nope") is None


async def test_a_made_token_works_until_it_expires_or_is_revoked_and_its_secret_is_never_stored(seeded: Database) -> None:
    secret, info = await auth.create_token(
        seeded, role="tenant", tenant="alpha", name="ci", created_by="tenant_admin:alpha#1", expires_at=1000.0, now=900.0
    )
    assert secret.startswith("fgt-") and len(secret) == 44
    assert (info.role, info.tenant, info.name, info.created_by, info.expires_at, info.revoked_at) == (
        "tenant",
        "alpha",
        "ci",
        "tenant_admin:alpha#1",
        1000.0,
        None,
    )
    async with seeded.sessions() as session:
        stored = (await session.execute(select(ApiToken).where(col(ApiToken.id) == info.id))).scalar_one()
    assert stored.token_hash == auth.hash_token(secret) and secret not in stored.token_hash
    who = await auth.authenticate(seeded, secret, now=999.0)
    assert who is not None and (who.role, who.tenant, who.token_id) == ("tenant", "alpha", info.id)
    assert await auth.authenticate(seeded, secret, now=1000.0) is None  # expired

    other, _ = await auth.create_token(seeded, role="tenant", tenant="alpha", name="ci2", created_by="x", expires_at=None, now=900.0)
    assert await auth.authenticate(seeded, other, now=10**10) is not None  # no expiry
    _, beta = await auth.create_token(seeded, role="tenant_admin", tenant="beta", name="b", created_by="x", expires_at=None)
    # Lists: a tenant's own people's tokens; everyone's for the platform; never nodes' credentials.
    mine = await auth.list_tokens(seeded, tenant="alpha")
    assert {t.name for t in mine} >= {"ci", "ci2"} and {t.tenant for t in mine} == {"alpha"}
    everyone = await auth.list_tokens(seeded, everyone=True)
    assert {"alpha", "beta", None} <= {t.tenant for t in everyone} and {t.role for t in everyone} <= set(auth.USER_ROLES)
    # Revoking: only within the tenant (unless everyone), idempotent (the first time stays), and refused at once.
    assert await auth.revoke_token(seeded, beta.id, tenant="alpha") is None
    [other_info] = [t for t in mine if t.name == "ci2"]
    first = await auth.revoke_token(seeded, other_info.id, tenant="alpha", now=2000.0)
    again = await auth.revoke_token(seeded, other_info.id, tenant="alpha", now=3000.0)
    assert first is not None and again is not None and first.revoked_at == again.revoked_at == 2000.0
    assert await auth.authenticate(seeded, other, now=2500.0) is None
    assert await auth.revoke_token(seeded, beta.id, everyone=True) is not None


async def test_with_a_token_key_digests_are_keyed_and_a_plain_one_stored_before_is_keyed_at_its_next_use(
    seeded: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = hashlib.sha256(b"alpha-token").hexdigest()
    monkeypatch.setenv("FAIRGANG_TOKEN_KEY", "k" * 64)
    auth.reset_token_key()
    try:
        keyed = auth.hash_token("alpha-token")
        assert keyed == hmac.new(b"k" * 64, b"alpha-token", hashlib.sha256).hexdigest() != plain
        # Seeded before the key: stored plain; it still authenticates, and is stored keyed from then on.
        assert await _digest_of(seeded, "alpha") == plain
        who = await auth.authenticate(seeded, "alpha-token")
        assert who is not None and who.tenant == "alpha"
        assert await _digest_of(seeded, "alpha") == keyed
        # A token made now is stored keyed only: a copy of the store cannot check guesses without the key.
        secret, info = await auth.create_token(seeded, role="tenant", tenant="beta", name="k", created_by="x", expires_at=None)
        async with seeded.sessions() as session:
            stored = (await session.execute(select(col(ApiToken.token_hash)).where(col(ApiToken.id) == info.id))).scalar_one()
        assert stored == auth.hash_token(secret) != hashlib.sha256(secret.encode()).hexdigest()
        # Seeding again keeps one row per token (keyed), not a second one.
        await tenants.seed_cluster(seeded, small_cluster())
        async with seeded.sessions() as session:
            rows = (
                (await session.execute(select(ApiToken).where(col(ApiToken.tenant) == "alpha", col(ApiToken.role) == "tenant")))
                .scalars()
                .all()
            )
        assert [r.token_hash for r in rows] == [keyed]
    finally:
        monkeypatch.delenv("FAIRGANG_TOKEN_KEY")
        auth.reset_token_key()
    # Without the key the keyed digest no longer matches: the key is part of every token's check.
    assert await auth.authenticate(seeded, "alpha-token") is None


async def _digest_of(db: Database, tenant: str) -> str:
    async with db.sessions() as session:
        query = select(col(ApiToken.token_hash)).where(col(ApiToken.tenant) == tenant, col(ApiToken.role) == "tenant")
        return str((await session.execute(query)).scalars().one())


async def test_a_plain_row_beside_the_keyed_one_does_not_break_authentication(seeded: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process without the key (a seeding run without FAIRGANG_TOKEN_KEY) stored a plain row for a keyed token:
    the keyed row is the one that counts, and the check does not fail on the pair."""
    monkeypatch.setenv("FAIRGANG_TOKEN_KEY", "k" * 64)
    auth.reset_token_key()
    try:
        assert await auth.authenticate(seeded, "alpha-token") is not None  # keyed now
        async with seeded.transaction() as session:
            session.add(ApiToken(token_hash=hashlib.sha256(b"alpha-token").hexdigest(), role="tenant", tenant="beta"))
        for _ in range(2):
            who = await auth.authenticate(seeded, "alpha-token")
            assert who is not None and who.tenant == "alpha"
    finally:
        monkeypatch.delenv("FAIRGANG_TOKEN_KEY")
        auth.reset_token_key()
