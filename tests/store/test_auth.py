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
